"""ESPHome native API settings (`esphome.*`)."""

from __future__ import annotations

import base64
from dataclasses import dataclass


@dataclass(frozen=True)
class EsphomeSettings:
    """The ESPHome native API inside `edge-agent run`: the device as Home Assistant's voice
    assistant, discovered as `_esphomelib._tcp` like linux-voice-assistant (plain text)."""

    enabled: bool = False
    """Serve the ESPHome native API (needs Python 3.11 or later: aioesphomeapi's)."""
    host: str = "0.0.0.0"
    """Address to listen on."""
    port: int = 6053
    """Port to listen on (6053 is ESPHome's; 0 picks a free one)."""
    name: str = ""
    """The device's name in Home Assistant (empty: the device id)."""
    encryption_key: str = ""
    """The Noise-encrypted transport's pre-shared key, base64 of 32 bytes (`openssl rand -base64 32`),
    the same as typed into Home Assistant; every connection is then encrypted and a plain-text client
    is refused. Empty: plain text."""
    zeroconf: bool = True
    """Advertise `_esphomelib._tcp.local.` so Home Assistant discovers the device."""
    max_connections: int = 8
    """Connections that have said Hello (after the Noise handshake, when keyed). One more gets in and
    displaces the connection idle the longest with nothing in flight (see docs/home-assistant.md)."""
    max_handshakes: int = 128
    """Connections that have not said Hello yet, at most; a newer one closes the oldest from the
    address holding the most of them. Above the 100 connections one accept burst can bring in before
    any is read, so a flood cannot close Home Assistant's between its connect and its Hello."""
    handshake_timeout_s: float = 10.0
    """Time a new connection has to say Hello (and, when keyed, finish the Noise handshake first)."""
    max_frame_bytes: int = 65536
    """Largest frame accepted; a larger claimed length closes the connection before anything is read."""
    idle_timeout_s: float = 90.0
    """A connection that sends nothing (not even a ping) for this long is closed."""
    max_buffered_bytes: int = 1048576
    """Outgoing bytes a connection may leave unread before it is closed."""
    media_max_bytes: int = 16777216
    """Largest audio fetched from a URL Home Assistant sends (a TTS answer, an announcement, a track for
    the media player); what it decodes to is bounded as this many bytes of 16-bit mono (FLAC and MP3
    included)."""
    media_timeout_s: float = 20.0
    """Longest time to fetch one such URL, the whole transfer."""

    def __post_init__(self) -> None:
        if self.encryption_key:
            try:
                key = base64.b64decode(self.encryption_key, validate=True)
            except ValueError:
                key = b""
            if len(key) != 32:
                raise ValueError("encryption_key: not base64 of 32 bytes (make one with "
                                 "`openssl rand -base64 32`)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is outside 0..65535")
        for name in ("max_connections", "max_handshakes", "max_frame_bytes", "max_buffered_bytes",
                     "media_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1")
        for name in ("idle_timeout_s", "handshake_timeout_s", "media_timeout_s"):
            if not 0.0 < getattr(self, name) <= 3600.0:
                raise ValueError(f"{name}: {getattr(self, name)} is outside 0..3600")
