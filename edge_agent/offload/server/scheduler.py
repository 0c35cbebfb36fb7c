"""Sentence jobs from every stream share a few synthesis workers.

Requests that arrive together are synthesized together: each worker takes the
waiting sentence with the lowest index (first sentences of every stream before
anyone's second, so every listener hears something soon), and `workers`
sentences run at once in threads. The models served here cannot batch on CPU
(Kokoro's batch dimension is fixed at 1; padded Piper batches were slower than
sequential runs, see `edge-agent bench offload`), so a batch is a set of
concurrent single-sentence runs on one shared onnxruntime session.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from edge_agent.audio.resample import resample
from edge_agent.errors import TIMEOUTS
from edge_agent.offload.server.server_metrics import ServerMetrics
from edge_agent.offload.wire.codecs import Chunk, SentenceEncoder
from edge_agent.offload.wire.transport import cancel_and_wait
from edge_agent.tts.voice import Voice

log = logging.getLogger(__name__)

class StreamCancelled(Exception):
    """The client cancelled, or its connection went away."""


class DeadlineMissed(Exception):
    """Synthesis could not start before the request's deadline."""


@dataclass(frozen=True)
class SentenceResult:
    chunks: list[Chunk]
    samples: int
    audio_s: float
    synth_s: float


@dataclass
class Ticket:
    """What the jobs of one stream share: its futures, deadline and state."""

    futures: list[asyncio.Future[SentenceResult]]
    deadline: float | None = None
    """Loop time by which the first sentence must have started."""
    arrived: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    cancelled: bool = False

    def fail(self, exc: BaseException) -> None:
        for fut in self.futures:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # the stream may never await it: mark it retrieved

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.fail(StreamCancelled())


@dataclass
class Job:
    index: int
    ticket: Ticket
    future: asyncio.Future[SentenceResult]
    work: Callable[[], SentenceResult]
    enqueued: float


def sentence_work(voice: Voice, text: str, rate: int,
                  encoder: SentenceEncoder) -> Callable[[], SentenceResult]:
    """The blocking part of one job: synthesize, resample to `rate`, encode."""

    def run() -> SentenceResult:
        started = time.perf_counter()
        pieces = list(voice.synthesize_sentence(text))
        audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        synth_s = time.perf_counter() - started
        if rate != voice.sample_rate:
            audio = resample(audio, voice.sample_rate, rate)
        return SentenceResult(encoder.encode(audio), len(audio), len(audio) / rate, synth_s)

    return run


class Scheduler:
    """`workers` concurrent sentence jobs, lowest sentence index first."""

    def __init__(self, workers: int, metrics: ServerMetrics) -> None:
        self.workers = workers
        self.metrics = metrics
        self._queue: asyncio.PriorityQueue[tuple[int, int, Job]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synth")
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._worker(), name=f"synth-worker-{i}")
                       for i in range(self.workers)]

    def submit(self, ticket: Ticket, works: list[Callable[[], SentenceResult]]) -> None:
        """Queue one job per sentence; results land in `ticket.futures` in order."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for index, work in enumerate(works):
            future: asyncio.Future[SentenceResult] = loop.create_future()
            ticket.futures.append(future)
            self._queue.put_nowait((index, next(self._seq), Job(index, ticket, future, work, now)))
        self.metrics.queued(len(works))

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            _, _, job = await self._queue.get()
            ticket = job.ticket
            now = loop.time()
            if ticket.cancelled or job.future.done():
                self.metrics.queued(-1)
                continue
            if ticket.started_at is None and ticket.deadline is not None and now > ticket.deadline:
                self.metrics.queued(-1)
                self.metrics.count("deadline_missed")
                ticket.fail(DeadlineMissed())
                continue
            if ticket.started_at is None:
                ticket.started_at = now
            self.metrics.started(now - job.enqueued)
            result: SentenceResult | None = None
            try:
                result = await loop.run_in_executor(self._pool, job.work)
            except Exception as exc:
                log.exception("synthesis failed")
                if not job.future.done():
                    job.future.set_exception(exc)
                    job.future.exception()
            finally:
                self.metrics.finished(result.audio_s if result else 0.0, result.synth_s if result else 0.0)
            if result is not None and not job.future.done():
                job.future.set_result(result)

    async def stop(self, timeout: float = 10.0) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        # Jobs already in a thread finish (onnxruntime cannot be interrupted); nothing new starts.
        waiting = asyncio.get_running_loop().run_in_executor(
            None, lambda: self._pool.shutdown(wait=True, cancel_futures=True))
        try:
            await asyncio.wait_for(waiting, timeout)
        except TIMEOUTS:
            log.warning("synthesis threads still busy after %.0f s; exiting anyway", timeout)
