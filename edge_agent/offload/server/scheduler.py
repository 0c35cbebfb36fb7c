"""Sentence jobs from every stream share a few synthesis workers, earliest playback deadline first.

Every sentence has a playback deadline: the moment its stream's listener would
run out of audio without it. Before a stream's first audio that is its arrival
plus its first-audio budget (the request's `deadline_ms`, else
`FIRST_AUDIO_BUDGET_S`) plus the audio of the sentences before it (estimated
from their characters until they are synthesized); once its first audio has
gone out, the stream's own clock (first audio sent + audio before the
sentence) replaces the estimate. A free worker always takes the waiting
sentence due first (earliest deadline first): sentences waiting at the same
moment from many streams go out together, `workers` at a time, and none is ever
held back to wait for a fuller batch. A request with a deadline that the work
already due before it would push past is refused at once (`first_audio_estimate`),
so a full server serves the streams it can in real time and the others' devices
speak locally, instead of every stream coming late.

Why not padded batches through the model: Kokoro's ONNX graph has its batch
dimension fixed at 1 (a graph edit making it dynamic fails in
`/encoder/predictor/text_encoder/Expand`, whose shape has the 1 baked in), and
its int8 graph quantizes activations per tensor (`DynamicQuantizeLinear`), so
a sentence batched with others would not get the samples it gets alone. Padded
Piper batches were slower than sequential runs on the CPU (`edge-agent bench
offload`). So a batch is a set of concurrent single-sentence runs on one shared
onnxruntime session, ordered by deadline.
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

FIRST_AUDIO_BUDGET_S = 1.0
"""Where a request sets no `deadline_ms`: when its first audio is due, for ordering only."""
SECONDS_PER_CHAR = 0.065
"""Speech per character of text (about 15 characters a second), for deadlines of sentences
not yet synthesized; real durations replace the estimate as sentences finish."""


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
    due: float = 0.0
    """Loop time by which the first audio should be out (ordering, not enforced)."""
    audio_s: list[float] = field(default_factory=list)
    """Seconds of audio of each sentence: estimated at submit, measured once synthesized."""
    playing_since: float | None = None
    """Loop time the first audio went out: the listener's playback clock from then on."""
    voice: str = ""
    """The voice it speaks with (each voice has its own speed)."""

    _before: list[float] = field(default_factory=list)
    """`_before[i]`: the audio of the sentences before sentence `i` (a dispatch asks for every
    waiting sentence's deadline, so each must cost O(1))."""

    def plan(self, audio_s: list[float]) -> None:
        """Each sentence's audio, estimated, before any is made."""
        self.audio_s = audio_s
        self._before = [0.0, *itertools.accumulate(audio_s)][:len(audio_s)]

    def measured(self, index: int, audio_s: float) -> None:
        """Sentence `index` came out `audio_s` long: the deadlines after it move."""
        delta = audio_s - self.audio_s[index]
        self.audio_s[index] = audio_s
        for i in range(index + 1, len(self._before)):
            self._before[i] += delta

    def due_of(self, index: int) -> float:
        """Loop time the listener runs out of audio without sentence `index`."""
        start = self.playing_since if self.playing_since is not None else self.due
        return start + (self._before[index] if index < len(self._before) else sum(self.audio_s[:index]))

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
    seq: int = 0


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
    """`workers` concurrent sentence jobs, earliest playback deadline first."""

    def __init__(self, workers: int, metrics: ServerMetrics) -> None:
        self.workers = workers
        self.metrics = metrics
        self._waiting: list[Job] = []
        """Few enough (at most `max_streams` streams' sentences) to scan for the earliest deadline:
        deadlines move when a stream starts playing, so a heap keyed at submit would go stale."""
        self._arrived = asyncio.Event()
        self._seq = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synth")
        self._tasks: list[asyncio.Task[None]] = []
        self.rtf: dict[str, float] = {}
        """Per voice: synthesis seconds per second of audio, a moving average of the sentences made
        here (with whatever else the cores ran meanwhile); absent until its first one is done."""
        self._running_work = 0.0
        """Estimated synthesis seconds of the sentences being synthesized now."""
        self._running = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._worker(), name=f"synth-worker-{i}")
                       for i in range(self.workers)]

    def submit(self, ticket: Ticket, works: list[Callable[[], SentenceResult]],
               sentences: list[str] | None = None, budget_s: float = FIRST_AUDIO_BUDGET_S) -> None:
        """Queue one job per sentence; results land in `ticket.futures` in order.

        `sentences` (their text) estimate each one's audio for its deadline until it is known.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        ticket.due = now + budget_s
        ticket.plan([len(t) * SECONDS_PER_CHAR for t in sentences] if sentences else [0.0] * len(works))
        for index, work in enumerate(works):
            future: asyncio.Future[SentenceResult] = loop.create_future()
            ticket.futures.append(future)
            self._waiting.append(Job(index, ticket, future, work, now, next(self._seq)))
        self.metrics.queued(len(works))
        self._arrived.set()

    def first_audio_estimate(self, voice: str, first_sentence: str, budget_s: float) -> float | None:
        """Seconds until a new stream's first sentence would be made: the work due before it
        shared by the workers, then its own. None when nothing is ahead of it (refusing it would
        make nothing sooner) or the voice has not been timed here yet."""
        rtf = self.rtf.get(voice)
        if rtf is None:
            return None
        due = asyncio.get_running_loop().time() + budget_s
        ahead = sum(job.ticket.audio_s[job.index] * self.rtf.get(job.ticket.voice, rtf)
                    for job in self._waiting
                    if not job.ticket.cancelled and job.ticket.due_of(job.index) <= due)
        # A running sentence is half done on average.
        ahead += self._running_work / 2
        if ahead <= 0:
            return None
        return ahead / self.workers + len(first_sentence) * SECONDS_PER_CHAR * rtf

    def _next(self) -> Job:
        """The waiting job due first (ties: the one submitted first); call only when one waits."""
        waiting = self._waiting
        best = min(range(len(waiting)),
                   key=lambda i: (waiting[i].ticket.due_of(waiting[i].index), waiting[i].seq))
        return waiting.pop(best)

    async def _take(self) -> Job:
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()
        return self._next()

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            job = await self._take()
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
            estimate = ticket.audio_s[job.index] * self.rtf.get(ticket.voice, 0.0)
            self._running_work += estimate
            self._running += 1
            try:
                result = await loop.run_in_executor(self._pool, job.work)
            except Exception as exc:
                # One sentence failing fails its own stream, never the others running beside it.
                log.exception("synthesis failed")
                if not job.future.done():
                    job.future.set_exception(exc)
                    job.future.exception()
            finally:
                self._running -= 1
                # Summed and taken away in another order, floats leave a residue: none runs, none left.
                self._running_work = self._running_work - estimate if self._running else 0.0
                self.metrics.finished(result.audio_s if result else 0.0, result.synth_s if result else 0.0)
            if result is not None:
                ticket.measured(job.index, result.audio_s)
                if result.audio_s > 0:
                    rtf = result.synth_s / result.audio_s
                    old = self.rtf.get(ticket.voice)
                    self.rtf[ticket.voice] = rtf if old is None else 0.8 * old + 0.2 * rtf
                if not job.future.done():
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
