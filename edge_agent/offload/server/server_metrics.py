"""Server metrics: queue depth, batch sizes, latencies, real-time factor; a JSON-ready snapshot.

`http_monitor.py` beside it exposes the same numbers to Prometheus.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any

import numpy as np

from edge_agent.metrics import Histogram

RTF_BOUNDS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
"""Real-time factor buckets (synthesis seconds per second of audio)."""


class ServerMetrics:
    """Counters and recent samples, safe to update from worker threads."""

    def __init__(self, window: int = 2000) -> None:
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter()
        self.queue_depth = 0
        """Sentences waiting for a worker."""
        self.in_flight = 0
        """Sentences being synthesized now."""
        self.open_streams = 0
        self.open_connections = 0
        self.batch_sizes: Counter[int] = Counter()
        """How many sentences were being synthesized together when one started."""
        self.first_audio = Histogram(window)
        """Request arrival -> its first audio frame sent, seconds."""
        self.sentence = Histogram(window)
        """Synthesis time of one sentence, seconds."""
        self.rtf = Histogram(window, RTF_BOUNDS)
        self._queue_wait: deque[float] = deque(maxlen=window)
        self.audio_s = 0.0
        self.synth_s = 0.0

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def started(self, waited_s: float) -> int:
        """A sentence left the queue for a worker; returns the batch size it joined."""
        with self._lock:
            self.queue_depth -= 1
            self.in_flight += 1
            self.batch_sizes[self.in_flight] += 1
            self._queue_wait.append(waited_s)
            return self.in_flight

    def finished(self, audio_s: float, synth_s: float) -> None:
        with self._lock:
            self.in_flight -= 1
            self.audio_s += audio_s
            self.synth_s += synth_s
            if audio_s > 0:
                self.sentence.observe(synth_s)
                self.rtf.observe(synth_s / audio_s)

    def first_audio_sent(self, seconds: float) -> None:
        with self._lock:
            self.first_audio.observe(seconds)

    def histograms(self) -> dict[str, list[tuple[float, int]] | float]:
        """Cumulative buckets and sums of every histogram, read under one lock."""
        with self._lock:
            out: dict[str, list[tuple[float, int]] | float] = {}
            for name, hist in (("first_audio", self.first_audio), ("sentence", self.sentence),
                               ("rtf", self.rtf)):
                out[name] = hist.cumulative()
                out[f"{name}_sum"] = hist.total
            return out

    def queued(self, n: int = 1) -> None:
        with self._lock:
            self.queue_depth += n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            rtf = np.asarray(self.rtf.recent, dtype=np.float64)
            wait = np.asarray(self._queue_wait, dtype=np.float64)
            total = sum(self.batch_sizes.values())
            return {
                "connections": self.open_connections,
                "streams": self.open_streams,
                "queue_depth": self.queue_depth,
                "in_flight": self.in_flight,
                "counters": dict(sorted(self.counters.items())),
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "mean_batch": (sum(k * v for k, v in self.batch_sizes.items()) / total) if total else 0.0,
                "rtf_p50": _pct(rtf, 50), "rtf_p95": _pct(rtf, 95),
                "queue_wait_p50_s": _pct(wait, 50), "queue_wait_p95_s": _pct(wait, 95),
                "audio_s": round(self.audio_s, 3), "synth_s": round(self.synth_s, 3),
            }


def _pct(values: np.ndarray[Any, Any], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values.size else None
