"""Wyoming (Home Assistant's voice protocol): a server offering our TTS and ASR, and its advertisement.

`framing` reads events within limits and deadlines, `audio` converts audio both
ways, `tts` and `asr` are the services, `server` the connections, `service` puts
them together for `edge-agent wyoming` and the daemon.
"""
