"""The playback reference: what the device played and when, for the echo canceller.

The device knows exactly what it plays. Every sink that reaches a loudspeaker is wrapped
in a `ReferenceSink`, which copies each block into the `PlaybackReference` before
handing it to the device: resampled to 16 kHz and placed on one timeline of the
monotonic clock, the clock microphone blocks are stamped with. Consecutive blocks are
laid end to end (a sound card plays them so, however early the writes return); a block
written after the timeline ran dry starts at the moment it was written. An aborted
sink takes back what it had not played yet.

The sink's thread pays one short copy under a lock and never waits on the front end:
the timeline is a fixed ring (`keep_s`), and a front end that falls behind finds the
oldest audio overwritten (zeros) rather than holding playback back. The timeline is
only coarse: the card's buffers and the air add a delay the echo canceller measures
itself (`audio.echo.DelayEstimator`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import StreamResampler
from edge_agent.audio.sinks import Sink

RATE = 16000
"""Hertz of the timeline (the microphone's rate)."""


class PlaybackReference:
    """A ring of the last `keep_s` seconds of playback, indexed by monotonic time (thread-safe)."""

    def __init__(self, keep_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._epoch = clock()
        self._ring = np.zeros(max(RATE, round(keep_s * RATE)), dtype=np.float32)
        self._end = 0
        """Timeline sample just after the last one written."""
        self._lock = threading.Lock()
        self.blocks = 0
        """Blocks written (any rate)."""

    def index(self, t: float) -> int:
        """The timeline sample at monotonic time `t`."""
        return int(np.floor((t - self._epoch) * RATE))

    @property
    def end(self) -> int:
        """Timeline sample just after the last one played."""
        return self._end

    def playing_at(self, t: float) -> bool:
        """Whether the timeline holds audio at or after monotonic time `t`."""
        return self._end > self.index(t)

    def write(self, samples: Samples, at: float | None = None) -> None:
        """Append 16 kHz `samples` played from `at` (now by default), or right after the previous
        block when that one has not finished playing yet."""
        if samples.size == 0:
            return
        start = self.index(self.clock() if at is None else at)
        size = self._ring.size
        with self._lock:
            self.blocks += 1
            if start > self._end:  # the timeline ran dry: silence in between
                self._fill(self._end, min(start - self._end, size), 0.0)
            else:
                start = self._end
            data = samples[-size:]
            start += samples.size - data.size
            self._put(start, data)
            self._end = start + data.size

    def truncate(self, t: float | None = None) -> None:
        """Forget what was to play after `t` (now): the sink was aborted before playing it."""
        cut = self.index(self.clock() if t is None else t)
        with self._lock:
            if cut < self._end:
                lo = max(cut, self._end - self._ring.size)
                self._fill(lo, self._end - lo, 0.0)
                self._end = lo

    def read(self, start: int, n: int) -> Samples:
        """`n` timeline samples from `start`; zeros where nothing played or the ring has moved on."""
        out = np.zeros(n, dtype=np.float32)
        size = self._ring.size
        with self._lock:
            lo = max(start, self._end - size)
            hi = min(start + n, self._end)
            if hi > lo:
                idx = np.arange(lo, hi) % size
                out[lo - start:hi - start] = self._ring[idx]
        return out

    def _put(self, start: int, data: Samples) -> None:
        size = self._ring.size
        first = start % size
        head = min(data.size, size - first)
        self._ring[first:first + head] = data[:head]
        if head < data.size:
            self._ring[:data.size - head] = data[head:]

    def _fill(self, start: int, n: int, value: float) -> None:
        size = self._ring.size
        first = start % size
        head = min(n, size - first)
        self._ring[first:first + head] = value
        if head < n:
            self._ring[:n - head] = value


class ReferenceSink:
    """A sink that records what it plays into a `PlaybackReference` first."""

    def __init__(self, inner: Sink, reference: PlaybackReference) -> None:
        self.inner = inner
        self.reference = reference
        self.sample_rate = inner.sample_rate
        self.frames = 0
        self._resampler = StreamResampler(inner.sample_rate, RATE)

    def write(self, samples: Samples) -> None:
        self.reference.write(self._resampler.push(samples))
        self.inner.write(samples)
        self.frames += len(samples)

    def close(self) -> None:
        self.reference.write(self._resampler.push(np.zeros(0, dtype=np.float32), last=True))
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()
        self.reference.truncate()
