"""Progress on stderr for long steps: one line per step with its duration.

On a terminal a running step shows a live elapsed-time counter; in logs and CI each step
is one line when it starts and one when it ends, so the output stays greppable.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    """Reports steps; `quiet` turns it off (tests, library use)."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.live = not quiet and self.stream.isatty()

    def __call__(self, line: str) -> None:
        if not self.quiet:
            print(line, file=self.stream, flush=True)

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """`with progress.step("exporting decoder"): ...` prints what and how long it took."""
        started = time.perf_counter()
        stop = threading.Event()
        ticker = None
        if self.live:
            ticker = threading.Thread(target=self._tick, args=(what, started, stop), daemon=True)
            ticker.start()
        elif not self.quiet:
            self(f"{what} ...")
        try:
            yield
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
                self.stream.write("\r\033[K")
            if not self.quiet:
                self(f"{what}: done in {time.perf_counter() - started:.1f} s")

    def _tick(self, what: str, started: float, stop: threading.Event) -> None:
        while not stop.wait(0.25):
            self.stream.write(f"\r{what} ... {time.perf_counter() - started:5.1f} s")
            self.stream.flush()
