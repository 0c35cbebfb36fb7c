"""Server metrics: queue depth, batch sizes, real-time factor; a JSON-ready snapshot."""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any

import numpy as np


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
        self._rtf: deque[float] = deque(maxlen=window)
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
                self._rtf.append(synth_s / audio_s)

    def queued(self, n: int = 1) -> None:
        with self._lock:
            self.queue_depth += n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            rtf = np.asarray(self._rtf, dtype=np.float64)
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
