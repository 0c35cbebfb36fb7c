"""Play a stream of chunks while the next ones are being synthesized.

Synthesis runs in a worker thread that fills a bounded queue; the caller's
thread writes to the sink. A blocking sound-card write therefore never stalls
synthesis of the next sentence, and a slow sink back-pressures synthesis
instead of buffering without bound.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from edge_agent.audio.frames import AudioChunk
from edge_agent.audio.sinks import Sink

_DONE = object()


@dataclass
class PlayStats:
    """What happened while playing one utterance."""

    first_audio_s: float | None = None
    """Seconds from start to the first sample handed to the sink."""
    total_s: float = 0.0
    frames: int = 0
    sentences: int = 0
    sample_rate: int = 0
    interrupted: bool = False

    @property
    def audio_s(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate else 0.0


def play(chunks: Iterator[AudioChunk], sink: Sink, *, depth: int = 16,
         should_stop: Callable[[], bool] | None = None) -> PlayStats:
    """Write `chunks` to `sink` as they arrive; stop at a sentence boundary if `should_stop()`."""
    stats = PlayStats(sample_rate=sink.sample_rate)
    items: queue.Queue[object] = queue.Queue(maxsize=depth)
    cancel = threading.Event()
    started = time.perf_counter()

    def produce() -> None:
        try:
            for chunk in chunks:
                items.put(chunk)  # a stopped consumer empties the queue once, so this returns
                if cancel.is_set():
                    return
            items.put(_DONE)
        except BaseException as exc:  # handed to the consumer, re-raised there
            items.put(exc)

    worker = threading.Thread(target=produce, name="synth", daemon=True)
    worker.start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, AudioChunk)
            if stats.first_audio_s is None:
                stats.first_audio_s = time.perf_counter() - started
            sink.write(item.samples)
            stats.frames += len(item.samples)
            if item.last:
                stats.sentences += 1
                if should_stop is not None and should_stop():
                    stats.interrupted = True
                    break
    finally:
        cancel.set()
        _empty(items)  # wakes a producer blocked on the full queue; it sees `cancel` next
        worker.join(timeout=5)
        close = getattr(chunks, "close", None)
        if close is not None and not worker.is_alive():
            close()
    stats.total_s = time.perf_counter() - started
    return stats


def _empty(items: queue.Queue[object]) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            items.get_nowait()
