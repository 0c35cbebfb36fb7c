"""Group commit: records from several threads share one write and one fsync.

A journal that fsyncs every record is as fast as its disk's fsync rate; sharing the write makes
it as fast as the disk. Records that threads commit while a write (and its fsync) is under way
wait, and go together in the next write; each caller returns only once its records are on disk,
or raises what made the write fail.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

# A child of the journal's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.announce.journal.groupcommit")

Written = Callable[[int, OSError | None], Exception | None]
"""Told, under the lock, how many records a write carried and what it raised (None: it held);
returns what each of its callers raises (None: nothing)."""


@dataclass
class _Commit:
    """Records waiting for the next write, and what follows once it is done."""

    data: bytes
    """The records, encoded."""
    records: int
    apply: Callable[[bool], None]
    """Called with whether the write held, under the lock, before anyone else writes."""
    error: Exception | None = None
    done: bool = False


class GroupCommit:
    """Shared writes to one file, under its owner's lock."""

    def __init__(self, lock: threading.Lock, write: Callable[[bytes], None], written: Written) -> None:
        self._lock = lock
        self._write = write
        """Writes and fsyncs, without the lock; raises `OSError`. Nothing else writes meanwhile."""
        self._written = written
        self._done = threading.Condition(lock)
        """Notified when a write (and its fsync) has finished."""
        self.waiting: list[_Commit] = []
        """Records for the next write, with what to do once it is known whether it held."""
        self.writing = False
        """A write and fsync is under way, without the lock (the owner does not swap its file)."""

    def commit(self, data: bytes, records: int, apply: Callable[[bool], None]) -> None:
        """Write `data` (`records` of them) durably, sharing the write with whatever other threads
        commit meanwhile; raise what `written` made of its failure. Called with the lock.

        The first waiting thread writes for all of them (the leader), the lock let go during its
        write and fsync so that others can queue theirs for the next one. Before it hands the lead
        on, it runs each commit's `apply(written)` under the lock, in order: the owner's memory
        always holds what the file does before anyone can rewrite it, and no write is under way
        when it does.
        """
        mine = _Commit(data, records, apply)
        self.waiting.append(mine)
        while not mine.done:
            if self.writing:
                self._done.wait()
                continue
            batch, self.waiting = self.waiting, []
            self.writing = True
            error = None
            self._lock.release()
            try:
                self._write(b"".join(c.data for c in batch))
            except OSError as exc:
                error = exc
            finally:
                self._lock.acquire()
                self.writing = False
            self._settle(batch, error)
        if mine.error is not None:
            raise mine.error

    def wait_idle(self) -> None:
        """Wait until no write is under way (to swap or close the file). Called with the lock."""
        self._done.wait_for(lambda: not self.writing)

    def _settle(self, batch: list[_Commit], error: OSError | None) -> None:
        """After a write: tell each commit of `batch` how it went; wake the others. With the lock."""
        failure = self._written(sum(c.records for c in batch), error)
        for commit in batch:
            commit.error = failure
            try:
                commit.apply(failure is None)
            except Exception:  # every waiter must be woken, whatever one of them does
                log.exception("journal: applying a written record failed")
            commit.done = True
        self._done.notify_all()
