"""What the user changes on a running device (microphone mute, volume, wake words), kept across restarts.

Home Assistant's switch and slider send a command once (their command topics are
not retained), so the device itself must remember: `ControlStore` keeps the state
in `<daemon.state_dir>/controls.json`, replaced atomically (`atomic.atomic_write`),
and the daemon reads it before the microphone opens.

Privacy decides what an unreadable file means. A file that is missing means nobody
ever changed anything: the defaults (listening, the config's volume). A file that
exists but cannot be read or trusted (corrupt, truncated, too large, not a regular
file, a wrong type) means the user's last choice is unknown, and the last choice may
have been "muted": the microphone then stays muted, said once in the log, until the
user switches it again (which writes a good file). A muted device that should listen
is a visible nuisance; a device that listens after the user muted it is a breach.
A bad volume alone only loses the volume (the config's applies).
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.atomic import atomic_write

log = logging.getLogger(__name__)

FILE_NAME = "controls.json"
MAX_BYTES = 4096
"""Larger files are not ours (ours is under 100 bytes): not read at all."""


@dataclass(frozen=True)
class ControlState:
    """The user's run-time choices."""

    mic_muted: bool = False
    volume: float | None = None
    """0..1 as last set by the user; None: `audio.volume` from the config."""
    wake_words: tuple[str, ...] | None = None
    """Wake models chosen in Home Assistant (the ESPHome API); None: `wake.models` from the config."""
    media_muted: bool = False
    """The media player's mute (music from Sendspin): announcements, timers and answers still speak."""

    def to_json(self) -> dict[str, Any]:
        wake = None if self.wake_words is None else list(self.wake_words)
        return {"mic_muted": self.mic_muted, "volume": self.volume, "wake_words": wake,
                "media_muted": self.media_muted}


class ControlStore:
    """`ControlState` in one small JSON file of a state directory."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME

    def load(self) -> ControlState:
        """The stored state; never raises (see the module docstring for what a bad file means)."""
        try:
            raw = _read_small(self.path)
        except FileNotFoundError:
            return ControlState()
        except (OSError, ValueError) as exc:
            return self._unreadable(str(exc) if isinstance(exc, ValueError) else exc.strerror or str(exc))
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            return self._unreadable(f"not JSON ({exc})")
        if not isinstance(doc, dict) or not isinstance(doc.get("mic_muted"), bool):
            return self._unreadable("no true/false 'mic_muted' in it")
        volume = doc.get("volume")
        if volume is not None and not _is_volume(volume):
            log.warning("%s: volume %.40r is not a number 0..1; the config's audio.volume applies",
                        self.path, volume)
            volume = None
        wake = doc.get("wake_words")
        if wake is not None and not _is_wake_words(wake):
            log.warning("%s: wake_words %.80r is not a list of model names; the config's wake.models "
                        "apply", self.path, wake)
            wake = None
        media_muted = doc.get("media_muted", False)
        if not isinstance(media_muted, bool):
            log.warning("%s: media_muted %.40r is not true/false; the music is not muted", self.path,
                        media_muted)
            media_muted = False
        return ControlState(mic_muted=doc["mic_muted"], volume=None if volume is None else float(volume),
                            wake_words=None if wake is None else tuple(wake), media_muted=media_muted)

    def save(self, state: ControlState) -> None:
        """Replace the stored state durably; `OSError` if it cannot be written."""
        atomic_write(self.path, json.dumps(state.to_json()).encode() + b"\n", step="controls")

    def _unreadable(self, reason: str) -> ControlState:
        log.error("%s is unreadable (%s): the microphone stays muted until it is switched on again "
                  "(from Home Assistant), which rewrites the file", self.path, reason)
        return ControlState(mic_muted=True)


def _read_small(path: Path) -> bytes:
    """At most `MAX_BYTES` of a regular file, without following a symlink or blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    return data


def _is_wake_words(value: Any) -> bool:
    """A short non-empty list of short names (the daemon keeps only the models it offers)."""
    return (isinstance(value, list) and 0 < len(value) <= 16
            and all(isinstance(v, str) and 0 < len(v) <= 256 for v in value))


def _is_volume(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and 0.0 <= value <= 1.0)
