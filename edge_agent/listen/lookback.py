"""Where a turn starts (`listen.lookback_ms`): the audio just before a wake word.

The wake model decides 0.05-0.3 s after the phrase has ended, so a command spoken without a pause
has begun by then. A short ring buffer of the audio before each block lets a turn, local or
streamed alike, start that long before the detection (never before the previous turn ended): the
command's first word is kept whole, at the price of at most a syllable of the wake phrase.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from edge_agent.audio.frames import Samples


class Lookback:
    """The last `samples` of stream audio heard outside a turn, by stream sample."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self._recent: deque[tuple[int, Samples]] = deque()
        """(stream sample, block) of the audio before the current block, at least `samples` long."""
        self.idle_since = 0
        """Stream sample where the last turn ended: a lookback never reaches back past it."""

    def remember(self, block: Samples, start: int) -> None:
        """Keep `block` (starting at stream sample `start`), dropping what lies more than `samples`
        before its end."""
        if self.samples <= 0:
            return
        self._recent.append((start, block))
        end = start + block.size
        while self._recent and self._recent[0][0] + self._recent[0][1].size <= end - self.samples:
            self._recent.popleft()

    def remember_after(self, block: Samples, start: int, ended: int | None) -> None:
        """After a block a turn was in: when the turn `ended` inside it (at that stream sample), what
        follows its end may be the next turn's lookback (None: the turn goes on)."""
        if ended is not None and ended < start + block.size:
            self.remember(block[ended - start:], ended)

    def take(self, block: Samples, start: int, at: int) -> tuple[int, Samples]:
        """Where a turn woken at stream sample `at` (inside `block`, which starts at `start`) starts,
        and its audio up to the end of `block`; the buffer is emptied."""
        first = self._recent[0][0] if self._recent else start
        begin = max(at - self.samples, self.idle_since, first)
        parts = [b for _, b in self._recent] + [block]
        self._recent.clear()
        audio = np.concatenate(parts) if len(parts) > 1 else block
        return begin, audio[begin - first:]

    def clear(self) -> None:
        self._recent.clear()
