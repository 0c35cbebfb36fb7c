"""Outbound messages waiting for the network thread, bounded by what they cost.

Any thread `put`s; the bridge's network thread `pop`s. The bound is bytes (topic,
payload and a fixed charge for the bookkeeping of each message) and age, not a
message count: a burst of 2000 small statuses costs ~300 KB and must not push out
what is already waiting, while a week without a broker must not grow without end.

What is kept when something must go:

- Coalescing is per key only: a `coalesce` message replaces a waiting one on its
  topic (a retained state), a keyed one a waiting one with its key (one waiting
  status per announcement id, the newest) unless that one has a higher rank. Nothing
  is ever replaced by a message about something else.
- Over the bound, the oldest waiting message of a lower rank than the newcomer goes
  (metrics, then intermediate states); a newcomer that outranks nothing waiting is
  itself dropped. So an announcement's first status (`queued` or `rejected`, rank
  KEEP_MOST) is never pushed out by another announcement's status.
- A message older than `max_age_s` (the broker unreachable that long) is dropped
  rather than sent late, except a retained one: that is a state, the newest wins.

Every drop is counted (`dropped`, `dropped_final` for KEEP_MOST) and logged at most
once every `LOG_EVERY_S`, each line with the number dropped since the previous one,
so a burst of drops is never reported as one (`report` flushes the count when no
further drop comes).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

KEEP_LEAST, KEEP, KEEP_MOST = 0, 1, 2
"""How much losing a message costs: KEEP_LEAST (metrics), KEEP (an intermediate state),
KEEP_MOST (a first or final state, a report, a transcript)."""

MESSAGE_OVERHEAD_BYTES = 256
"""Charged per waiting message besides its topic and payload: the objects that hold it."""

LOG_EVERY_S = 10.0
"""Drops are logged at most this often, each line with the count since the previous one."""


@dataclass(frozen=True)
class Message:
    """One outbound message."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False
    coalesce: bool = False
    """Only the newest queued message of this topic matters (a retained state); an older one
    still waiting is replaced when it is queued."""
    key: str | None = None
    """Messages of one topic and key say successive states of one thing (an announcement's
    status): a newer one replaces a waiting older one of no higher rank."""
    rank: int = KEEP_MOST
    """KEEP_LEAST, KEEP or KEEP_MOST: a full outbox drops lower ranks first."""

    @staticmethod
    def json(topic: str, doc: dict[str, Any], *, qos: int = 1, retain: bool = False,
             coalesce: bool = False, key: str | None = None, rank: int = KEEP_MOST) -> Message:
        """`doc` as JSON; ValueError for what JSON cannot hold (NaN, Infinity), never sent."""
        return Message(topic, json.dumps(doc, separators=(",", ":"), allow_nan=False).encode(), qos,
                       retain, coalesce, key, rank)

    @property
    def cost(self) -> int:
        """Bytes it holds while waiting."""
        return len(self.topic) + len(self.payload) + MESSAGE_OVERHEAD_BYTES


@dataclass
class _Waiting:
    message: Message
    since: float
    """Clock reading when it was first queued."""


class Outbox:
    """Messages waiting to be sent, bounded by bytes and age (and optionally a count)."""

    def __init__(self, max_bytes: int, *, max_age_s: float = 0.0, max_count: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        """0: no age limit."""
        self.max_count = max_count
        """0: no count limit."""
        self.bytes = 0
        self.dropped = 0
        self.dropped_final = 0
        self.expired = 0
        """Of `dropped`, those dropped for their age."""
        self.replaced = 0
        self._clock = clock
        self._items: OrderedDict[int, _Waiting] = OrderedDict()
        """Sequence number -> message, in sending order."""
        self._ranks: tuple[deque[int], ...] = (deque(), deque(), deque())
        """Sequence numbers per rank, oldest first; entries no longer waiting are skipped lazily."""
        self._keys: dict[tuple[str, str], int] = {}
        self._next = 0
        self._first = 0
        self._lock = threading.Lock()
        self._popped: _Waiting | None = None
        self._unlogged = 0
        self._last_drop = ""
        self._next_log = float("-inf")

    def put(self, message: Message) -> bool:
        """Queue `message`; False if it was dropped at once (counted and logged)."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            key = self._key(message)
            if key is not None:
                seq = self._keys.get(key)
                old = self._items.get(seq) if seq is not None else None
                if seq is not None and old is not None and old.message.rank <= message.rank:
                    self._remove(seq)
                    self.replaced += 1
            while self._over(message.cost):
                if not self._evict_below(message.rank):
                    self._dropped(message, "the outbox is full")
                    return False
            seq = self._next
            self._next += 1
            self._add(seq, _Waiting(message, now))
            return True

    def pop(self) -> Message | None:
        with self._lock:
            self._expire(self._clock())
            if not self._items:
                return None
            seq = next(iter(self._items))
            self._popped = self._remove(seq)
            return self._popped.message

    def push_front(self, message: Message) -> None:
        """Put back the message `pop` returned (it could not be handed to paho), first in line and
        as old as it was."""
        with self._lock:
            popped = self._popped
            since = popped.since if popped is not None and popped.message is message else self._clock()
            self._first -= 1
            self._add(self._first, _Waiting(message, since))
            self._items.move_to_end(self._first, last=False)

    def report(self, *, final: bool = False) -> None:
        """Log drops not yet logged if the last line is old enough (called by the network thread),
        or at once when `final` (shutting down: nothing is left unsaid)."""
        with self._lock:
            if self._unlogged:
                self._log(float("inf") if final else self._clock())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    # -- inside the lock ---------------------------------------------------------------

    @staticmethod
    def _key(message: Message) -> tuple[str, str] | None:
        if message.key is not None:
            return (message.topic, message.key)
        return (message.topic, "") if message.coalesce else None

    def _over(self, extra: int) -> bool:
        if self.bytes + extra > self.max_bytes:
            return True
        return self.max_count > 0 and len(self._items) + 1 > self.max_count

    def _add(self, seq: int, waiting: _Waiting) -> None:
        message = waiting.message
        self._items[seq] = waiting
        self.bytes += message.cost
        self._ranks[_rank(message)].append(seq)
        key = self._key(message)
        if key is not None:
            self._keys[key] = seq

    def _remove(self, seq: int) -> _Waiting:
        waiting = self._items.pop(seq)
        self.bytes -= waiting.message.cost
        key = self._key(waiting.message)
        if key is not None and self._keys.get(key) == seq:
            del self._keys[key]
        return waiting

    def _evict_below(self, rank: int) -> bool:
        """Drop the oldest waiting message of a rank below `rank`; False if there is none."""
        for order in self._ranks[:max(0, min(rank, KEEP_MOST + 1))]:
            while order and order[0] not in self._items:
                order.popleft()
            if order:
                self._dropped(self._remove(order.popleft()).message, "the outbox is full")
                return True
        return False

    def _expire(self, now: float) -> None:
        if self.max_age_s <= 0:
            return
        for seq, waiting in list(self._items.items()):
            if now - waiting.since <= self.max_age_s:
                break  # sending order is age order
            if not waiting.message.retain:
                self._remove(seq)
                self.expired += 1
                self._dropped(waiting.message, f"not sent within {self.max_age_s:g} s")

    def _dropped(self, message: Message, why: str) -> None:
        self.dropped += 1
        if message.rank >= KEEP_MOST:
            self.dropped_final += 1
        self._unlogged += 1
        self._last_drop = f"{message.topic} ({why})"
        self._log(self._clock())

    def _log(self, now: float) -> None:
        if now < self._next_log:
            return
        self._next_log = now + LOG_EVERY_S
        log.warning("outbound messages dropped: %d since the last line, the last to %s "
                    "(%d dropped in all, %d of them first or final states; %d bytes waiting, limit %d)",
                    self._unlogged, self._last_drop, self.dropped, self.dropped_final, self.bytes,
                    self.max_bytes)
        self._unlogged = 0


def _rank(message: Message) -> int:
    return min(max(message.rank, KEEP_LEAST), KEEP_MOST)
