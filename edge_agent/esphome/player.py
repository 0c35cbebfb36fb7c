"""The media player's own playback: one track at a time, beside the announcements.

Home Assistant's `play_media` without the announcement flag plays here, not through the
announcement queue, as the ESPHome firmware keeps a media pipeline beside its
announcement pipeline: an announcement, a timer's chime or a turn's answer is spoken
over the track while it is ducked, a wake word pauses it until the turn ends (the
daemon's `MusicCues` drives both players, this one and the Sendspin player, through the
same `duck`/`restore`/`pause`/`resume`), and Home Assistant pauses, resumes, stops and
mutes it.

One thread writes the track to its own output (`outputs.music_sink`: the sound card at
full scale, or `<out_dir>/media-<id>-<n>.wav`) a block at a time, paced by the clock so
that the output is a timeline (`Segment`): sample k of a segment plays at
`start_us + k / rate`. The gain (volume, mute, ducking) moves linearly over one block,
so a change never clicks. A pause fades one block out and closes the output, holding the
track's place; the resume opens a new segment there and fades in. Mute keeps the track
running, silent, as the firmware does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.holds import Hold, Holds
from edge_agent.audio.sinks import Sink
from edge_agent.errors import AudioError

log = logging.getLogger(__name__)

HOME_ASSISTANT = "home-assistant"
"""The pause reason of Home Assistant's own pause (the others are the daemon's cues)."""

SinkFactory = Callable[[int, str], Sink]
"""Opens the output for a segment: (sample rate, name)."""


def now_us() -> int:
    return time.monotonic_ns() // 1000


@dataclass(frozen=True)
class Segment:
    """One stretch of contiguous output (one sink from open to close)."""

    name: str
    start_us: int
    """Clock time, µs, at which its first sample plays."""
    rate: int
    offset: int
    """The track's sample it starts at."""


@dataclass
class Track:
    """A decoded track; `on_end(why)` is told once: ended, stopped, replaced or output failed."""

    id: str
    samples: Samples
    rate: int
    on_end: Callable[[str], None] = lambda why: None
    position: int = 0
    """The next sample to play."""


@dataclass
class PlayerStats:
    blocks: int = 0
    output_errors: int = 0
    segments: list[Segment] = field(default_factory=list)


class TrackPlayer:
    """Started and stopped with the ESPHome API; every method may be called from any thread."""

    def __init__(self, open_sink: SinkFactory, *, volume: Callable[[], float], muted: Callable[[], bool],
                 duck_level: float, block_ms: float = 20.0,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.open_sink = open_sink
        self.volume = volume
        self.muted = muted
        self.block_us = round(block_ms * 1000)
        self.on_change = on_change
        """Told when the state (idle, playing, paused) changes."""
        self.track: Track | None = None
        self.stats = PlayerStats()
        self._holds = Holds(duck_level)
        self._cond = threading.Condition()
        self._level = 0.0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="esphome-media", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """The thread ends; a track playing ends as stopped."""
        self.stop()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    @property
    def state(self) -> str:
        """idle, playing or paused (held by Home Assistant or by a cue)."""
        with self._cond:
            if self.track is None:
                return "idle"
            return "paused" if self._holds.paused else "playing"

    @property
    def ducked(self) -> bool:
        with self._cond:
            return self._holds.ducked

    # -- Home Assistant's commands ----------------------------------------------------------

    def play(self, track: Track) -> None:
        """Play `track` from its start, ending the one playing (replaced); Home Assistant's own
        pause is over (a new track plays), the daemon's cues still hold."""
        with self._cond:
            old, self.track = self.track, track
            self._holds.hold("paused", HOME_ASSISTANT, on=False)
            self._cond.notify_all()
        log.info("esphome: playing %.1f s of media", len(track.samples) / track.rate,
                 extra={"stream": track.id})
        if old is not None:
            old.on_end("replaced")
        self.on_change()

    def stop(self) -> None:
        with self._cond:
            old, self.track = self.track, None
            self._holds.hold("paused", HOME_ASSISTANT, on=False)
            self._cond.notify_all()
        if old is not None:
            log.info("esphome: media stopped", extra={"stream": old.id})
            old.on_end("stopped")
            self.on_change()

    # -- the cues (`sendspin.cues.Music`), and Home Assistant's pause as one more reason ---------

    def duck(self, reason: str = "speech") -> None:
        """Lower the track to `duck_level` until `restore(reason)` (several reasons nest)."""
        self._cue("ducked", reason, on=True)

    def restore(self, reason: str = "speech") -> None:
        self._cue("ducked", reason, on=False)

    def pause(self, reason: str = HOME_ASSISTANT) -> None:
        """Hold the track where it is until `resume(reason)` (several reasons nest)."""
        self._cue("paused", reason, on=True)

    def resume(self, reason: str = HOME_ASSISTANT) -> None:
        self._cue("paused", reason, on=False)

    def _cue(self, what: Hold, reason: str, *, on: bool) -> None:
        with self._cond:
            change = self._holds.hold(what, reason, on=on)
            self._cond.notify_all()
        if change is not None:
            log.info("esphome: media %s (%s)", change, reason)
            if what == "paused":
                self.on_change()

    def gain(self) -> float:
        """The track's gain now: volume, mute, pause, ducking."""
        # The controls are read outside the lock: they are the daemon's, with locks of their own.
        level = 0.0 if self.muted() else min(1.0, max(0.0, float(self.volume())))
        with self._cond:
            return self._holds.gain(level)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (self.track is None or self._holds.paused):
                    self._cond.wait()
                if self._stop:
                    return
                track = self.track
            assert track is not None
            self._play(track)

    def _play(self, track: Track) -> None:
        """One segment: from the track's place until it ends, is paused, stopped or replaced."""
        name = f"media-{track.id}-{len(self.stats.segments) + 1}"
        try:
            sink = self.open_sink(track.rate, name)
        except AudioError as exc:
            self._failed(track, f"cannot open the output: {exc}")
            return
        block = max(1, round(self.block_us * track.rate / 1_000_000))
        start_us = now_us() + self.block_us
        self.stats.segments.append(Segment(name, start_us, track.rate, track.position))
        self._level = 0.0  # every segment fades in
        written, why = 0, "ended"
        try:
            while True:
                due_us = start_us + round(written * 1_000_000 / track.rate)
                if not self._sleep_until(due_us - self.block_us, track):
                    why = "stopped"
                    break
                target = self.gain()
                with self._cond:
                    if self.track is not track:
                        why = "stopped"
                        break
                    if self._holds.paused and self._level == 0.0:
                        why = "paused"
                        break
                    samples = track.samples[track.position:track.position + block]
                    track.position += len(samples)
                    finished = track.position >= len(track.samples)
                sink.write(self._ramp(samples, target))
                written += len(samples)
                self.stats.blocks += 1
                if finished:
                    break
            sink.close()
        except AudioError as exc:
            sink.abort()
            self._failed(track, f"output failed: {exc}")
            return
        log.info("esphome: output %s closed after %.1f s (%s)", name, written / track.rate, why,
                 extra={"stream": track.id})
        if why == "ended":
            self._ended(track, "ended")

    def _ramp(self, samples: Samples, target: float) -> Samples:
        """Scale by the gain, moving from the last block's linearly (no zipper noise, no click)."""
        if target == self._level == 1.0:
            return samples
        ramp = np.linspace(self._level, target, len(samples), dtype=np.float32)
        self._level = target
        return (samples * ramp).astype(np.float32, copy=False)

    def _sleep_until(self, t_us: int, track: Track) -> bool:
        """Wait until clock time `t_us`; False when the track changed or the player closes."""
        with self._cond:
            while not self._stop and self.track is track:
                left = t_us - now_us()
                if left <= 0:
                    return True
                self._cond.wait(left / 1e6)
            return False

    def _ended(self, track: Track, why: str) -> None:
        with self._cond:
            if self.track is not track:
                return
            self.track = None
        track.on_end(why)
        self.on_change()

    def _failed(self, track: Track, why: str) -> None:
        self.stats.output_errors += 1
        log.error("esphome: %s; the media is dropped", why, extra={"stream": track.id})
        self._ended(track, "output failed")
