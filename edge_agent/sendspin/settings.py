"""Sendspin player settings (`sendspin.*`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SendspinSettings:
    """The device as a player of Music Assistant's Sendspin protocol inside `edge-agent run`:
    advertised as `_sendspin._tcp`, the server connects to it and streams timestamped audio that
    plays in sync with the other players of its group."""

    enabled: bool = False
    """Join Music Assistant as a Sendspin player (needs Python 3.12 or later and the `sendspin`
    extra: `pip install '.[sendspin]'`)."""
    host: str = "0.0.0.0"
    """Address the player listens on for the server's connection."""
    port: int = 8928
    """Port the player listens on (8928 is Sendspin's; 0 picks a free one)."""
    path: str = "/sendspin"
    """The WebSocket path the server connects to (advertised in the TXT record)."""
    name: str = ""
    """The player's name in Music Assistant (empty: the device id)."""
    zeroconf: bool = True
    """Advertise `_sendspin._tcp.local.` so Music Assistant finds the player."""
    duck_level: float = 0.2
    """Music gain (0..1, on top of the volume) while an announcement, a timer chime or an answer
    is spoken; 0.2 is about -14 dB. Also the ESPHome media player's, even with Sendspin off."""
    pause_on_wake: bool = True
    """A wake word silences the music here until the turn ends (the group plays on; the music
    comes back in sync; the ESPHome media player's track waits and goes on where it was)."""
    output_delay_ms: float = 0.0
    """How much later than written the output plays (sound card and player buffers): the player
    writes that much earlier so the room hears it in sync with the group; measure it per device."""
    max_buffer_s: float = 8.0
    """Most audio held ahead of its play time; chunks beyond it are dropped (a bound on memory
    whatever the server sends)."""
    max_ahead_s: float = 30.0
    """A chunk scheduled further ahead than this (a server clock that jumped) is refused."""
    stall_s: float = 3.0
    """A stream that sends nothing for this long is reported stalled and the output is closed
    until audio comes again."""
    block_ms: float = 20.0
    """Audio written to the output at a time: the pacing step of the playout thread."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is outside 0..65535")
        if not self.path.startswith("/"):
            raise ValueError(f"path: {self.path!r} must start with '/'")
        if not 0.0 <= self.duck_level <= 1.0:
            raise ValueError(f"duck_level: {self.duck_level} is outside 0..1")
        if not 0.0 <= self.output_delay_ms <= 5000.0:
            raise ValueError(f"output_delay_ms: {self.output_delay_ms} is outside 0..5000")
        for name, low, high in (("max_buffer_s", 0.5, 60.0), ("max_ahead_s", 1.0, 600.0),
                                ("stall_s", 0.2, 600.0), ("block_ms", 5.0, 100.0)):
            if not low <= getattr(self, name) <= high:
                raise ValueError(f"{name}: {getattr(self, name)} is outside {low:g}..{high:g}")
