"""The ESPHome native API: the device as Home Assistant's voice assistant (as linux-voice-assistant).

`frames` reads and writes the plain-text frames with limits, `server` serves the
connections, `entities` maps the device's controls to entities, `assistant` runs
the voice turns, announcements and timers, `media` fetches the audio Home Assistant
sends as URLs, `service` starts it all with its zeroconf advertisement.
"""
