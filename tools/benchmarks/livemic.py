"""A live microphone the bench (or a test) plays into, block by block, and the clock it moves: the
runtime hears it as it hears a sound card, with the playback reference written as a sink writes it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import numpy as np

from benchmarks.clips import RATE
from edge_agent.audio.frames import Samples
from edge_agent.audio.reference import PlaybackReference


class Clock:
    """A monotonic clock the test or bench moves by hand."""

    def __init__(self, start: float = 10.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class LiveMic:
    """A live microphone fed from an array, or from `(microphone, played)` segments made as they
    are needed; the clock moves as each block is 'recorded'. With a `reference`, what the
    loudspeaker plays during a block (`played`, None or zeros: nothing) is written to it as the
    block starts, as a sink writes ahead of its card; the echo of it is already in the microphone's
    audio."""

    live = True
    sample_rate = RATE

    def __init__(self, audio: Samples | Iterable[tuple[Samples, Samples | None]], clock: Clock,
                 block: int = 1280, reference: PlaybackReference | None = None) -> None:
        self.segments = [(audio, None)] if isinstance(audio, np.ndarray) else audio
        self.clock, self.block, self.reference = clock, block, reference
        self.last: Samples = np.zeros(0, dtype=np.float32)
        """The block yielded last (what the microphone heard before any front end)."""
        self.making_s = 0.0
        """Thread CPU spent making segments (not hearing them)."""

    def blocks(self) -> Iterator[Samples]:
        """The microphone's blocks, the clock (and the reference) moving as each is 'recorded'."""
        segments = iter(self.segments)
        while True:
            started = time.thread_time()
            segment = next(segments, None)
            self.making_s += time.thread_time() - started
            if segment is None:
                return
            audio, played = segment
            for i in range(0, audio.size, self.block):
                piece = audio[i:i + self.block]
                if played is not None and self.reference is not None:
                    out = played[i:i + self.block]
                    if np.any(out):
                        self.reference.write(out, at=self.clock.now)
                self.last = piece
                self.clock.now += piece.size / RATE
                yield piece

    def close(self) -> None:
        pass
