"""The playout thread: takes the music off its timeline block by block, paced by the clock.

One thread owns the output sink. Each block covers a fixed stretch of the local clock
(`block_ms`) and is written just before that stretch begins, so the output is one
contiguous timeline: sample k of a segment plays at `Segment.start_us + k / rate`. What
a block holds comes from the stream's grid where the server's clock says it should be;
a sink that blocks (a sound card whose buffer is full) paces the thread as well.

The stream's grid and the clock are compared every block: a difference under `TOLERANCE_S`
is left alone (no clicks); a larger one (a clock that jumped, a slow start) moves the
cursor there at once and is counted (`resyncs`). A block written later than its time
(the thread was starved) is counted; one far behind restarts the segment at the present.
Silence for `stall_s` closes the sink (the stream stalled); audio opens a new one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.sinks import Sink
from edge_agent.errors import AudioError
from edge_agent.sendspin.timeline import StreamFormat, Timeline

log = logging.getLogger(__name__)

TOLERANCE_S = 0.004
"""Drift between the grid and the clock left alone; a larger one is corrected at once."""
BEHIND_S = 0.25
"""A block this late restarts the output segment at the present instead of catching up."""
RETRY_S = 2.0
"""After an output that failed, how long before it is opened again."""

SinkFactory = Callable[[int, str], Sink]
"""Opens the output for a segment: (sample rate, name)."""
ClockUs = Callable[[], int]


@dataclass(frozen=True)
class Segment:
    """One stretch of contiguous output (one sink from open to close)."""

    name: str
    start_us: int
    """Local clock time, µs, at which the segment's first sample plays."""
    rate: int


@dataclass
class PlayoutStats:
    """Counters over the player's life."""

    blocks: int = 0
    audio_blocks: int = 0
    """Blocks that held some music."""
    resyncs: int = 0
    late_blocks: int = 0
    restarts: int = 0
    stalls: int = 0
    output_errors: int = 0
    segments: list[Segment] = field(default_factory=list)


class Stream:
    """What the playout needs of the current stream (set by the player on the event loop)."""

    def __init__(self, stream_id: str, fmt: StreamFormat, timeline: Timeline,
                 to_server: Callable[[int], int], to_local: Callable[[int], int]) -> None:
        self.id = stream_id
        self.format = fmt
        self.timeline = timeline
        self.to_server = to_server
        """Local clock µs -> server clock µs (the output delay applied)."""
        self.to_local = to_local
        """Server clock µs -> local clock µs at which it must be written."""
        self.last_chunk_us: int | None = None
        """Local time the latest chunk arrived."""
        self.cursor: int | None = None
        """The next grid sample the output takes (None: not started)."""


class Playout:
    """The thread; `lock` guards the stream and its timeline (the player pushes under it)."""

    def __init__(self, open_sink: SinkFactory, clock_us: ClockUs, gain: Callable[[], float], *,
                 block_ms: float, stall_s: float, on_state: Callable[[str, str], None]) -> None:
        self.open_sink = open_sink
        self.clock_us = clock_us
        self.gain = gain
        """The music's gain now (volume, mute, ducking, pause); ramped over one block."""
        self.block_us = round(block_ms * 1000)
        self.stall_us = round(stall_s * 1_000_000)
        self.on_state = on_state
        """Told (stream id, state) when the output starts playing, stalls or fails."""
        self.lock = threading.Condition()
        self.stream: Stream | None = None
        self.stats = PlayoutStats()
        self._stop = False
        self._level = 0.0
        self._thread = threading.Thread(target=self._run, name="sendspin-playout", daemon=True)
        self._retry_at = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self.lock:
            self._stop = True
            self.lock.notify_all()
        self._thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        """The thread runs (it outlives every stream and every output failure)."""
        return self._thread.is_alive()

    def set_stream(self, stream: Stream | None) -> None:
        """A new stream (or none): the current segment ends at the next block."""
        with self.lock:
            self.stream = stream
            self.lock.notify_all()

    def wake(self) -> None:
        """A chunk arrived (call under `lock`)."""
        self.lock.notify_all()

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.lock:
                stream = self._wait_for_audio()
                if stream is None:
                    return
            self._play(stream)

    def _wait_for_audio(self) -> Stream | None:
        """Under the lock: the stream once it has audio to play (and the output may be retried)."""
        while not self._stop:
            stream = self.stream
            now = self.clock_us()
            if stream is not None and stream.timeline.first() is not None and now >= self._retry_at:
                return stream
            timeout = max(0.001, (self._retry_at - now) / 1e6) if now < self._retry_at else None
            self.lock.wait(timeout)
        return None

    def _play(self, stream: Stream) -> None:
        """One segment: open the sink at the first buffered sample's time, write blocks until the
        stream changes, stalls or the output fails."""
        start_us = self._first_block(stream)
        if start_us is None:
            return
        rate = stream.format.rate
        name = f"music-{stream.id}-{len(self.stats.segments) + 1}"
        try:
            sink = self.open_sink(rate, name)
        except AudioError as exc:
            self._failed(stream, f"cannot open the output: {exc}")
            return
        self.stats.segments.append(Segment(name, start_us, rate))
        log.info("sendspin: playing %d Hz from %s", rate, name, extra={"stream": stream.id})
        self.on_state(stream.id, "playing")
        try:
            written, reason = self._write_blocks(stream, sink, start_us)
        except AudioError as exc:
            sink.abort()
            self._failed(stream, f"output failed: {exc}")
            return
        with self.lock:
            if self.stream is stream:
                stream.cursor = None
        try:
            sink.close()
        except AudioError as exc:
            log.warning("sendspin: closing %s: %s", name, exc, extra={"stream": stream.id})
        level = logging.INFO if reason == "ended" else logging.WARNING
        log.log(level, "sendspin: output %s closed after %.1f s (%s)", name, written / rate, reason,
                extra={"stream": stream.id})

    def _first_block(self, stream: Stream) -> int | None:
        """Place the cursor on the first buffered sample and wait for its time; the local µs the
        segment starts at (None: the stream changed meanwhile)."""
        rate = stream.format.rate
        with self.lock:
            first = stream.timeline.first()
            if first is None or self.stream is not stream:
                return None
            anchor = stream.timeline.anchor_us or 0
            start_us = stream.to_local(anchor + round(first * 1_000_000 / rate))
            now = self.clock_us()
            if start_us < now:  # its time has passed: start where the grid is now
                start_us = now + self.block_us
                first = stream.timeline.index(stream.to_server(start_us))
            stream.cursor = first
        if self._sleep_until(start_us - self.block_us, stream):
            return start_us
        with self.lock:
            stream.cursor = None
        return None

    def _write_blocks(self, stream: Stream, sink: Sink, start_us: int) -> tuple[int, str]:
        """Blocks until the stream changes, stalls or falls far behind: samples written and why it
        stopped."""
        rate = stream.format.rate
        block = max(1, round(self.block_us * rate / 1_000_000))
        written = 0
        while True:
            due_us = start_us + round(written * 1_000_000 / rate)
            if not self._sleep_until(due_us - self.block_us, stream):
                return written, "ended"
            now = self.clock_us()
            if now - due_us > BEHIND_S * 1_000_000:
                self.stats.restarts += 1
                return written, f"fell {(now - due_us) / 1000:.0f} ms behind; restarting"
            if now > due_us:
                self.stats.late_blocks += 1
            with self.lock:
                if self.stream is not stream:
                    return written, "ended"
                samples, filled = self._take(stream, due_us, block)
                quiet_us = now - (stream.last_chunk_us or now)
            if filled:
                self.stats.audio_blocks += 1
            elif quiet_us > self.stall_us:
                self.stats.stalls += 1
                self.on_state(stream.id, "stalled")
                return written, f"stalled: no audio for {quiet_us / 1e6:.1f} s"
            sink.write(self._ramp(samples))
            written += block
            self.stats.blocks += 1

    def _take(self, stream: Stream, due_us: int, block: int) -> tuple[Samples, int]:
        """Under the lock: the block that plays at `due_us`, moving the cursor to the clock's
        place on the grid when they differ by more than the tolerance."""
        assert stream.cursor is not None
        timeline = stream.timeline
        expected = timeline.index(stream.to_server(due_us))
        if abs(expected - stream.cursor) > TOLERANCE_S * timeline.rate:
            self.stats.resyncs += 1
            log.info("sendspin: %+.1f ms off the group's clock; moved there", (expected - stream.cursor)
                     * 1000 / timeline.rate, extra={"stream": stream.id})
            stream.cursor = expected
        samples, filled = timeline.take(stream.cursor, block)
        stream.cursor += block
        return samples, filled

    def _ramp(self, samples: Samples) -> Samples:
        """Scale by the gain, moving from the last block's linearly (no zipper noise, no click)."""
        target = float(self.gain())
        if target == self._level == 1.0:
            return samples
        ramp = np.linspace(self._level, target, len(samples), dtype=np.float32)
        self._level = target
        return samples * ramp

    def _sleep_until(self, t_us: int, stream: Stream) -> bool:
        """Wait until local time `t_us`; False when the stream changed or the player stops."""
        with self.lock:
            while not self._stop and self.stream is stream:
                left = t_us - self.clock_us()
                if left <= 0:
                    return True
                self.lock.wait(left / 1e6)
            return False

    def _failed(self, stream: Stream, why: str) -> None:
        self.stats.output_errors += 1
        self._retry_at = self.clock_us() + round(RETRY_S * 1e6)
        log.error("sendspin: %s; the music is dropped and the output retried in %.0f s", why, RETRY_S,
                  extra={"stream": stream.id})
        with self.lock:
            stream.timeline.clear()
            stream.cursor = None
        self.on_state(stream.id, "output failed")
