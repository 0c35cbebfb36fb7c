"""A fixed set of worker threads that take the most urgent job first.

`concurrent.futures.ThreadPoolExecutor` runs jobs in the order they were
submitted; a voice needs some jobs (the window playback waits for, the front
that feeds the idle worker) to jump the queue.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class PriorityPool:
    """`workers` threads; `submit(priority, fn, ...)` runs lower priorities first, FIFO among equals."""

    def __init__(self, workers: int, name: str) -> None:
        self._jobs: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{n}", daemon=True)
                         for n in range(max(1, workers))]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: int, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            self._jobs.put((priority, next(self._order), (future, fn, args, kwargs)))
        return future

    def _work(self) -> None:
        while True:
            _, _, job = self._jobs.get()
            if job is None:
                return
            future, fn, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the caller gets it from the future
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Cancel what has not started; running jobs finish on their own (no waiting here)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:
                try:
                    _, _, job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
            for _ in self._threads:  # after every job: the sentinels sort last
                self._jobs.put((2**62, next(self._order), None))
