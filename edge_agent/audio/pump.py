"""Run a push/flush stage over an audio source: in the caller's thread, a worker thread or asyncio.

A stage is any object with `push(block) -> results` and `flush() -> results`
(the VAD + Whisper transcriber, the wake-word hearing loop). The pump reads the
source, hands each block to the stage and delivers what it returns; the stage's
work runs in the pump's thread, so while it works the source's own queue (the
sound card's) holds the audio that keeps coming, and nothing runs ahead of the
results it produces.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from types import TracebackType
from typing import Generic, Protocol, TypeVar

from edge_agent.audio.frames import Samples
from edge_agent.audio.sources import AudioSource

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Stage(Protocol[T_co]):
    """Turns 16 kHz audio into results."""

    def push(self, block: Samples) -> Iterable[T_co]: ...

    def flush(self) -> Iterable[T_co]: ...


class Pump(Generic[T]):
    """The results of `stage` over `source`, each delivered as soon as the stage returns it.

    Three ways to consume it, pick one per pump:

    - iterate in the caller's thread: ``for r in pump: ...`` (ends with the
      source; errors such as a truncated file are raised from the loop);
    - callbacks from a worker thread: ``pump.start(on_result, on_error)``, later
      ``pump.stop()`` (also a context manager);
    - asyncio: ``async for r in pump.stream(): ...`` (the blocking work stays in
      the worker thread; leaving the loop stops the pump).

    `stop()` closes the source, so a live microphone is released at once.
    """

    thread_name = "pump"

    def __init__(self, source: AudioSource, stage: Stage[T]) -> None:
        self.source = source
        self.stage = stage
        self.audio_s = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- synchronous -------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        try:
            for block in self.source.blocks():
                if self._stopping.is_set():
                    return
                self.audio_s += block.size / self.source.sample_rate
                yield from self.stage.push(block)
            if self._stopping.is_set():
                return
            yield from self.stage.flush()
        finally:
            self.source.close()

    # -- worker thread -------------------------------------------------------------

    def start(self, on_result: Callable[[T], None],
              on_error: Callable[[BaseException], None] | None = None,
              on_end: Callable[[], None] | None = None) -> Pump[T]:
        """Run in a worker thread, calling `on_result` from it for each result."""
        if self._thread is not None:
            raise RuntimeError(f"this {self.thread_name} has already been started")

        def work() -> None:
            try:
                for result in self:
                    on_result(result)
            except BaseException as exc:
                if self._stopping.is_set():  # closing the source under a read is how stop() works
                    log.debug("%s stopped while reading: %s", self.thread_name, exc)
                elif on_error is None:
                    log.exception("%s failed", self.thread_name)
                else:
                    on_error(exc)
            finally:
                if on_end is not None:
                    on_end()

        self._thread = threading.Thread(target=work, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def halt(self) -> None:
        """Stop hearing now, from any thread, without waiting: the source closes and no block read
        after this reaches the stage (`stop` then waits for the worker)."""
        self._stopping.set()
        self.source.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop: close the source and wait for the worker (and the block it is working on)."""
        self.halt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s still busy %.0f s after stop", self.thread_name, timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Pump[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- asyncio ---------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[T]:
        """Results as an async iterator; the work runs in the worker thread."""
        loop = asyncio.get_running_loop()
        # Unbounded on purpose: results arrive at the pace of speech, a few a minute.
        items: asyncio.Queue[tuple[T | BaseException | None, bool]] = asyncio.Queue()

        def post(item: T | BaseException | None, final: bool = False) -> None:
            # RuntimeError: the loop closed under us, so nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(items.put_nowait, (item, final))

        self.start(post, on_error=lambda exc: post(exc, True), on_end=lambda: post(None, True))
        try:
            while True:
                item, final = await items.get()
                if final:
                    if isinstance(item, BaseException):
                        raise item
                    return
                yield item  # type: ignore[misc]
        finally:
            await asyncio.to_thread(self.stop)
