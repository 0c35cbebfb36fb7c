"""Worker threads that take the most urgent job first.

`concurrent.futures.ThreadPoolExecutor` runs jobs in the order they were
submitted; a voice needs some jobs (the window playback waits for, the front
that feeds an idle worker) to jump the queue. Jobs wait in a heap; every
submit queues one "run the most urgent job" call on an executor, so the
executor's own lifecycle holds (a process that exits waits for running jobs
instead of tearing down a model under them). `submit_after` keeps a job out of
the queue until another job is done: the first window of a stream runs alone,
so on cores shared with other work nothing of ours competes with it.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class PriorityPool:
    """`workers` threads; `submit(priority, fn, ...)` runs lower priorities first, FIFO among equals."""

    def __init__(self, workers: int, name: str) -> None:
        self._executor = ThreadPoolExecutor(max(1, workers), thread_name_prefix=name)
        self._heap: list[_Job] = []
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._held: set[Future[Any]] = set()
        """Jobs of `submit_after` whose gate is not done yet (cancelled by `shutdown`)."""
        self._closed = False

    def submit(self, priority: int, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._executor.submit(self._run_next)  # raises RuntimeError once shut down
            heapq.heappush(self._heap, (priority, next(self._order), future, fn, args, kwargs))
        return future

    def submit_after(self, gate: Future[Any], priority: int, fn: Callable[..., T], /,
                     *args: Any) -> Future[T]:
        """`submit`, once `gate` is done (finished, failed or cancelled): until then the job takes
        no worker, whatever its priority. Cancelling the future it returns drops the job."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._held.add(future)

        def release(_: Future[Any]) -> None:
            with self._lock:
                self._held.discard(future)
                queue = not self._closed and not future.cancelled()
                if queue:
                    self._executor.submit(self._run_next)
                    heapq.heappush(self._heap, (priority, next(self._order), future, fn, args, {}))
            if not queue:
                future.cancel()  # outside the lock: its callbacks may release jobs gated on it

        gate.add_done_callback(release)  # runs at once if `gate` is already done
        return future

    def _run_next(self) -> None:
        while True:
            with self._lock:
                if not self._heap:
                    return
                _, _, future, fn, args, kwargs = heapq.heappop(self._heap)
            if future.set_running_or_notify_cancel():
                break  # else it was cancelled: take the next one instead
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # the caller gets it from the future
            future.set_exception(exc)

    def shutdown(self) -> None:
        """Cancel what has not started; running jobs finish on their own (no waiting here)."""
        with self._lock:
            self._closed = True
            self._executor.shutdown(wait=False, cancel_futures=True)
            dropped = [future for _, _, future, *_ in self._heap] + list(self._held)
            self._heap.clear()
            self._held.clear()
        for future in dropped:  # outside the lock: a cancelled gate's callbacks take it
            future.cancel()


def idle_cores(loadavg: Path = Path("/proc/loadavg")) -> int | None:
    """Cores that no other thread wants right now, the caller's own counted as idle; None where this
    cannot be told (no `/proc/loadavg`).

    The kernel's count of runnable threads (the fourth field's first number) is taken at this
    instant, unlike the load averages, so it tells whether splitting a job across threads pays
    now: on cores other work keeps busy, a second thread of ours only queues behind it.
    """
    try:
        runnable = int(loadavg.read_text(encoding="ascii").split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0, (os.cpu_count() or 1) - runnable + 1)
