"""How loud the Sendspin music plays: volume and mute, ducking and pause.

Volume and mute have two owners that must agree: the server (Music Assistant's commands) and the
device's shared controls (Home Assistant, MQTT, ESPHome; `controls.ControlState` on disk). A
command changes the music at once and the shared controls after it (`save`, which the player
calls at most every `player.SAVE_EVERY_S`); a change of the shared controls elsewhere is read back
with `follow_controls`. Ducking and pause are the cues' (`audio.holds`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from edge_agent.audio.holds import Hold, Holds

# A child of the player's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.sendspin.player.level")


class MusicControls(Protocol):
    """The device's shared volume and mute (`controls.Controls`; `controls.ControlState` on disk)."""

    def volume(self) -> float: ...

    def set_volume(self, volume: float) -> None: ...

    def media_muted(self) -> bool: ...

    def set_media_muted(self, muted: bool) -> None: ...


class LocalControls:
    """Volume and mute held here alone (a player without a daemon: tests, the benchmark)."""

    def __init__(self, volume: float = 1.0, muted: bool = False) -> None:
        self._volume, self._muted = volume, muted

    def volume(self) -> float:
        return self._volume

    def set_volume(self, volume: float) -> None:
        self._volume = volume

    def media_muted(self) -> bool:
        return self._muted

    def set_media_muted(self, muted: bool) -> None:
        self._muted = muted


class MusicLevel:
    """The music's volume (a percentage, as Sendspin has it), mute and holds; any thread."""

    def __init__(self, controls: MusicControls, duck_level: float) -> None:
        self.controls = controls
        self._lock = threading.Lock()
        self._volume = percent(controls.volume())
        self._muted = controls.media_muted()
        self._holds = Holds(duck_level)

    def cue(self, what: Hold, reason: str, *, on: bool) -> None:
        """Hold or release a duck or pause `reason` (several nest)."""
        with self._lock:
            change = self._holds.hold(what, reason, on=on)
        if change is not None:
            log.info("sendspin: music %s (%s)", change, reason)

    def gain(self) -> float:
        """The music's gain now: volume (Sendspin's perceived curve), mute, pause, ducking."""
        with self._lock:
            return self._holds.gain(0.0 if self._muted else float((self._volume / 100.0) ** 1.5))

    def state(self) -> tuple[int, bool]:
        """(volume in percent, muted), as the server is told."""
        with self._lock:
            return self._volume, self._muted

    def status(self) -> dict[str, Any]:
        """The level's part of the player's status."""
        with self._lock:
            return {"volume": self._volume, "muted": self._muted,
                    "ducked": self._holds.ducked, "paused": self._holds.paused}

    def follow_controls(self) -> bool:
        """Take the shared volume and mute as they are now; True when that changed the music."""
        volume, muted = percent(self.controls.volume()), self.controls.media_muted()
        with self._lock:
            changed = (volume, muted) != (self._volume, self._muted)
            self._volume, self._muted = volume, muted
        return changed

    def command(self, name: str, volume: int | None, mute: bool | None) -> bool:
        """Apply the server's `volume` or `mute` command; False for any other (nothing changed)."""
        with self._lock:
            if name == "volume" and volume is not None:
                self._volume = max(0, min(100, int(volume)))
            elif name == "mute" and mute is not None:
                self._muted = bool(mute)
            else:
                return False
        return True

    def save(self, volume: int, muted: bool) -> None:
        """Make the shared controls say `volume` and `muted` (blocking: they are written to disk)."""
        if percent(self.controls.volume()) != volume:
            self.controls.set_volume(volume / 100.0)
        if self.controls.media_muted() != muted:
            self.controls.set_media_muted(muted)


def percent(volume: float) -> int:
    """A shared volume (0..1) as Sendspin's percentage."""
    return max(0, min(100, round(volume * 100)))
