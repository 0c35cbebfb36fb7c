"""Wyoming settings (`wyoming.*`): the server, the satellite, limits."""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.checks import positive
from edge_agent.endpoints import parse_uri


@dataclass(frozen=True)
class WyomingSettings:
    """The Wyoming server (`edge-agent wyoming`, or inside `run` when `enabled`)."""

    enabled: bool = False
    """Serve Wyoming inside `edge-agent run`, sharing the daemon's voice and models."""
    uri: str = "tcp://0.0.0.0:10300"
    """`tcp://HOST:PORT` to listen on (port 0 picks a free one). Inside `edge-agent run` with
    `satellite` on, this endpoint is the satellite's and the services are on `services_uri`."""
    services_uri: str = "tcp://0.0.0.0:10701"
    """Inside `edge-agent run` with `satellite` on: `tcp://HOST:PORT` of the device's text to
    speech, speech to text and wake word (Home Assistant loads no services from an endpoint whose
    `info` has a satellite, so they get their own, advertised as `<device id>-services`).
    Unused otherwise: `uri` serves them."""
    zeroconf: bool = True
    """Advertise the service as `_wyoming._tcp.local.` (named after the device id)."""
    satellite: bool = True
    """Inside `edge-agent run`: offer the device to Home Assistant as an Assist satellite (the
    wake word here, the command's audio streamed to Home Assistant, its answers, announcements
    and timer chimes played here)."""
    max_connections: int = 16
    """Connections open at a time. When all are taken, a new one displaces the connection idle the
    longest (pings do not count as activity) that has nothing in flight; when every one is working,
    the new one is answered `busy` and closed."""
    idle_timeout_s: float = 60.0
    """A connection that sends nothing for this long is closed (Home Assistant's satellite side
    pings every few seconds; a service client opens a connection per request)."""
    event_timeout_s: float = 10.0
    """Once an event's header line has begun, the whole event must arrive within this long."""
    max_header_bytes: int = 8192
    """Longest event header line (the JSON before the data and payload)."""
    max_data_bytes: int = 65536
    """Largest `data_length` accepted."""
    max_payload_bytes: int = 262144
    """Largest `payload_length` accepted (an audio chunk: 1 s of 48 kHz stereo s16le is 192 kB)."""
    max_audio_s: float = 30.0
    """Longest audio a `transcribe` may send; more is refused with an error."""
    max_text_chars: int = 20000
    """Most characters one `synthesize` (or one streamed synthesis) may send."""
    max_speech_s: float = 600.0
    """Most audio one `synthesize` (or one streamed synthesis) is given; the rest is cut and logged.
    What costs is what is spoken: a few characters can normalise into many words."""
    samples_per_chunk: int = 1024
    """Samples per `audio-chunk` event sent to the client."""
    max_wake_speed: float = 2.0
    """Most seconds of audio one connection's wake word stream (`detect`) is listened to per second.
    A live microphone sends one a second; a client sending faster waits (nothing is dropped), after
    a head start of a few seconds (a satellite's buffered audio), so no client can keep a core busy."""
    max_announce_bytes: int = 32 * 1024 * 1024
    """Most memory the audio Home Assistant sends the satellite to play (an announcement or an
    answer) may take while it arrives: mono float32 at its own rate, so 32 MiB holds 380 s at
    Home Assistant's 22050 Hz (and 174 s at 48 kHz). A longer stream is refused with one error
    and the rest of it dropped; `announcements.max_audio_s` still bounds its length."""

    def __post_init__(self) -> None:
        endpoints = []
        for name in ("uri", "services_uri"):
            try:
                endpoints.append(parse_uri(getattr(self, name), ("tcp",)))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        satellite, services = endpoints
        if self.satellite and services.port != 0 and (satellite.host, satellite.port) == \
                (services.host, services.port):
            raise ValueError(f"services_uri: {self.services_uri!r} is the satellite's uri; the "
                             "services need an endpoint of their own")
        positive(self, "max_connections", "idle_timeout_s", "event_timeout_s", "max_header_bytes",
                  "max_data_bytes", "max_payload_bytes", "max_audio_s", "max_text_chars",
                  "max_speech_s", "samples_per_chunk", "max_wake_speed", "max_announce_bytes")
        if self.max_header_bytes < 256:
            raise ValueError(f"max_header_bytes: {self.max_header_bytes} is below 256")
