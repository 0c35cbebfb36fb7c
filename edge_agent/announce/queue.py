"""Announcements waiting to be spoken: answers to a conversation turn first, then highest priority,
then oldest."""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from edge_agent.announce.message import Announcement


@dataclass(order=True)
class Item:
    """A queued announcement and where to resume it."""

    sort_key: tuple[int, int, int] = field(init=False, repr=False)
    announcement: Announcement = field(compare=False)
    seq: int = field(compare=False, default=-1)
    """Arrival order; an interrupted announcement keeps its own."""
    resume: int = field(compare=False, default=0)
    """First sentence still to speak."""
    sink: Any = field(compare=False, default=None)
    """A file sink kept open across an interruption, so `<id>.wav` holds the whole announcement."""
    spent_s: float = field(compare=False, default=0.0)
    """Audio already spoken before an interruption (it counts against `max_audio_s`)."""

    def __post_init__(self) -> None:
        self.sort_key = (0 if self.announcement.answer else 1, -self.announcement.priority, self.seq)


class AnnouncementQueue:
    """A thread-safe priority queue with a blocking `get`."""

    def __init__(self) -> None:
        self._heap: list[Item] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._held = False

    def put(self, announcement: Announcement, resume: int = 0, sink: Any = None,
            seq: int | None = None, spent_s: float = 0.0) -> Item:
        with self._cond:
            item = Item(announcement, next(self._seq) if seq is None else seq, resume, sink, spent_s)
            heapq.heappush(self._heap, item)
            self._cond.notify_all()
            return item

    def get(self, timeout: float) -> Item | None:
        """The most urgent item (while held, only an answer), waiting up to `timeout` for one."""
        with self._cond:
            if not self._ready():
                self._cond.wait(timeout)
            return heapq.heappop(self._heap) if self._ready() else None

    def _ready(self) -> bool:
        return bool(self._heap) and (not self._held or self._heap[0].announcement.answer)

    @property
    def held(self) -> bool:
        return self._held

    def hold(self, held: bool) -> None:
        """While held, `get` hands out only answers to a conversation turn."""
        with self._cond:
            self._held = held
            self._cond.notify_all()

    def top_priority(self) -> int | None:
        with self._cond:
            return self._heap[0].announcement.priority if self._heap else None

    def items(self) -> list[Item]:
        """A snapshot, most urgent first."""
        with self._cond:
            return sorted(self._heap)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)
