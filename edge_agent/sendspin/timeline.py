"""The music buffer: decoded chunks placed on the stream's sample grid, taken out block by block.

A Sendspin server stamps every chunk with the server-clock time its first sample must play.
Those stamps come from sample counts, so within one stream each chunk has an exact place on
the stream's sample grid (`index`): the first chunk anchors the grid, every later one is
`round((stamp - anchor) * rate)` samples after it. The playout takes contiguous blocks off
that grid; where it should be (from the clock) and where it is may drift apart, and only a
gap larger than a tolerance moves it (`Playout`), so playback stays click-free.

Pure state, no I/O and no clock: the caller says what "now" is. Memory is bounded by
`max_samples` whatever the server sends; what cannot be used is counted, never kept.
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.wav import decode
from edge_agent.errors import AudioError

WIDTHS = {16: 2, 24: 3, 32: 4}
"""PCM bit depths we decode, in bytes per sample."""
MIN_RATE, MAX_RATE = 8000, 192000
MAX_CHUNKS = 4096
"""Chunks held at most (Music Assistant sends 20-25 ms ones: 100 s of them); a server sending
tiny ones fills this before `max_samples`, so no bookkeeping grows with what it sends."""


class UnsupportedFormat(AudioError):
    """A stream whose codec or PCM layout this player cannot decode."""


@dataclass(frozen=True)
class StreamFormat:
    """What one stream's chunks hold."""

    codec: str
    """`pcm` is the only codec decoded here."""
    rate: int
    """Hertz"""
    channels: int
    bit_depth: int

    def check(self) -> None:
        """`UnsupportedFormat` naming what is wrong, else nothing."""
        if self.codec != "pcm":
            raise UnsupportedFormat(f"codec {self.codec!r} is not decoded here (only PCM was offered)")
        if self.bit_depth not in WIDTHS:
            raise UnsupportedFormat(f"{self.bit_depth}-bit PCM is not decoded here (16, 24 or 32)")
        if self.channels not in (1, 2):
            raise UnsupportedFormat(f"{self.channels} channels (1 or 2 are decoded)")
        if not MIN_RATE <= self.rate <= MAX_RATE:
            raise UnsupportedFormat(f"{self.rate} Hz is outside {MIN_RATE}..{MAX_RATE}")

    def decode(self, payload: bytes) -> Samples:
        """Interleaved PCM to mono float32 (a partial last frame is dropped)."""
        return decode(payload, "pcm", WIDTHS[self.bit_depth], self.channels, Path("sendspin"))


@dataclass
class TimelineStats:
    """What happened to the chunks of one stream."""

    chunks: int = 0
    """Chunks placed on the grid."""
    late: int = 0
    """Chunks dropped because their time had passed."""
    ahead: int = 0
    """Chunks refused because they were scheduled too far ahead (a clock that jumped)."""
    overflow: int = 0
    """Chunks dropped because the buffer held `max_samples` already."""


class Timeline:
    """Chunks of one stream keyed by their first sample on the stream's grid."""

    def __init__(self, rate: int, max_samples: int) -> None:
        self.rate = rate
        self.max_samples = max_samples
        self.anchor_us: int | None = None
        """Server time of grid sample 0 (the first chunk's stamp)."""
        self._chunks: collections.deque[tuple[int, Samples]] = collections.deque()
        self._held = 0
        self.stats = TimelineStats()

    @property
    def held(self) -> int:
        """Samples buffered."""
        return self._held

    def index(self, server_us: int) -> int:
        """The grid sample that plays at server time `server_us`."""
        anchor = server_us if self.anchor_us is None else self.anchor_us
        return round((server_us - anchor) * self.rate / 1_000_000)

    def push(self, server_us: int, samples: Samples, cursor: int | None, max_ahead: int) -> str:
        """Place a chunk; `cursor` is the next grid sample the output takes (None: not started).
        Returns `queued`, `late`, `ahead` or `overflow` (the last three drop the chunk)."""
        if self.anchor_us is None:
            self.anchor_us = server_us
        start = self.index(server_us)
        if cursor is not None and start + len(samples) <= cursor:
            self.stats.late += 1
            return "late"
        if cursor is not None and start - cursor > max_ahead:
            self.stats.ahead += 1
            return "ahead"
        if self._held + len(samples) > self.max_samples or len(self._chunks) >= MAX_CHUNKS:
            self.stats.overflow += 1
            return "overflow"
        if self._chunks and start < self._chunks[-1][0]:  # out of order: insert in place
            at = bisect.bisect_right(self._chunks, start, key=lambda c: c[0])
            self._chunks.insert(at, (start, samples))
        else:
            self._chunks.append((start, samples))
        self._held += len(samples)
        self.stats.chunks += 1
        return "queued"

    def first(self) -> int | None:
        """Grid index of the earliest buffered sample."""
        return self._chunks[0][0] if self._chunks else None

    def take(self, cursor: int, count: int) -> tuple[Samples, int]:
        """Grid samples `cursor .. cursor+count` (silence where none arrived) and how many of them
        were audio; what lies before the block's end is released."""
        out = np.zeros(count, dtype=np.float32)
        filled = 0
        end = cursor + count
        while self._chunks:
            start, samples = self._chunks[0]
            if start >= end:
                break
            stop = start + len(samples)
            lo, hi = max(start, cursor), min(stop, end)
            if hi > lo:
                out[lo - cursor:hi - cursor] = samples[lo - start:hi - start]
                filled += hi - lo
            if stop <= end:
                self._chunks.popleft()
                self._held -= len(samples)
            else:
                break
        return out, filled

    def clear(self) -> None:
        """Drop everything buffered (a seek); the grid stays."""
        self._chunks.clear()
        self._held = 0
