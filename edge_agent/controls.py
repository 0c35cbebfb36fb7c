"""What the user changes on a running device (microphone mute, volume, wake words), kept across restarts.

`Controls` is the one object every side talks to: Home Assistant's MQTT entities, the
ESPHome API and the Sendspin player read and change the volume and the mutes there, and
the ESPHome API chooses the wake words. It saves each change and tells the daemon, which
acts on it (a new output volume, the microphone closed or opened, the hearing loop
restarted with other wake words).

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
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

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


ControlChange = Literal["volume", "mic", "media", "wake"]
"""Which control changed, as `Controls` tells its owner."""


def _nothing() -> None:
    pass


def _ignore(_what: ControlChange) -> None:
    pass


class Controls:
    """The user's choices on a running device: read and changed from any thread, saved on each change.

    `on_change` is told each change once it is saved: that is where the device acts on it. A
    mute first calls `close_mic`, before the save and whatever else is waiting, so a muted
    microphone is closed at once. The volume is the user's until a config sets another
    `audio.volume` (`reconfigured`); the wake words are the user's while the daemon offers them.
    """

    def __init__(self, directory: Path, *, config_volume: float, wake_offered: Sequence[str] = (),
                 on_change: Callable[[ControlChange], None] = _ignore,
                 close_mic: Callable[[], None] = _nothing) -> None:
        self.store = ControlStore(directory)
        self.config_volume = config_volume
        """`audio.volume` as the config sets it (the volume when the user has set none)."""
        self._on_change = on_change
        self._close_mic = close_mic
        self._lock = threading.Lock()
        state = self.store.load()
        chosen = tuple(w for w in state.wake_words or () if w in wake_offered)
        self._state = replace(state, wake_words=chosen or None)

    @property
    def state(self) -> ControlState:
        """What the user chose, as it is saved."""
        return self._state

    def volume(self) -> float:
        """The output volume, 0..1: the user's, else the config's."""
        chosen = self._state.volume
        return self.config_volume if chosen is None else chosen

    def set_volume(self, volume: float) -> None:
        """Speak later announcements at `volume`, after a restart too (until a config sets another
        `audio.volume`)."""
        self._change(volume=volume)
        self._on_change("volume")
        log.info("volume set to %.2f", volume)

    def mic_muted(self) -> bool:
        return self._state.mic_muted

    def set_mic_muted(self, muted: bool) -> None:
        """Close the microphone or open it again, kept across restarts (saved before the command
        is acknowledged)."""
        changed = muted != self._state.mic_muted
        self._change(mic_muted=muted, save=False)
        if muted:
            self._close_mic()  # the microphone closes now, whatever else the daemon is waiting for
        self._save()  # also when unchanged: a switch rewrites a file that was unreadable
        if changed:
            log.info("microphone %s", "muted" if muted else "unmuted")
            self._on_change("mic")

    def media_muted(self) -> bool:
        return self._state.media_muted

    def set_media_muted(self, muted: bool) -> None:
        """Mute the music (announcements still speak), kept across restarts."""
        self._change(media_muted=muted)
        self._on_change("media")

    def wake_words(self) -> tuple[str, ...] | None:
        """The wake words the user chose; None: the config's `wake.models`."""
        return self._state.wake_words

    def set_wake_words(self, names: Sequence[str]) -> None:
        """The user chose other wake words: kept, and the hearing loop listens for them."""
        self._change(wake_words=tuple(names))
        self._on_change("wake")
        log.info("wake words set to %s", ", ".join(names))

    def reconfigured(self, config_volume: float) -> bool:
        """A config sets `config_volume`: True when it is a new one, which the user's volume gives
        way to (the latest word wins)."""
        if config_volume == self.config_volume:
            return False
        self.config_volume = config_volume
        self._change(volume=None)
        return True

    def _change(self, *, save: bool = True, **fields: Any) -> None:
        with self._lock:
            self._state = replace(self._state, **fields)
        if save:
            self._save()

    def _save(self) -> None:
        try:
            with self._lock:  # the MQTT thread, the ESPHome loop and a reload: each saves the whole state
                self.store.save(self._state)
        except OSError as exc:
            log.error("cannot save the microphone mute and volume to %s (%s): they hold until the "
                      "daemon restarts", self.store.path, exc.strerror or exc)


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
