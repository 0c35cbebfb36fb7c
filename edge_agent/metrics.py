"""Counters and latency histograms, snapshotted as plain data for the metrics topic."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
"""Upper bounds in seconds; a last, open bucket catches the rest."""


class Histogram:
    """Cumulative bucket counts plus percentiles over the most recent values."""

    def __init__(self, window: int = 1000, bounds: tuple[float, ...] = BUCKETS) -> None:
        self.bounds = bounds
        """Upper bounds of the buckets; `buckets` has one more, open one."""
        self.count = 0
        self.total = 0.0
        self.buckets = [0] * (len(bounds) + 1)
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.recent.append(value)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[i] += 1
                return
        self.buckets[-1] += 1

    def snapshot(self) -> dict[str, Any]:
        recent = np.asarray(self.recent, dtype=np.float64)
        doc: dict[str, Any] = {
            "count": self.count, "sum": round(self.total, 6),
            "buckets": {**{f"le_{b:g}": n for b, n in zip(self.bounds, self.buckets, strict=False)},
                        "le_inf": self.buckets[-1]},
        }
        if recent.size:
            doc["p50"] = round(float(np.percentile(recent, 50)), 6)
            doc["p95"] = round(float(np.percentile(recent, 95)), 6)
        return doc

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, values at or below it) per bucket, the last bound infinite: Prometheus' form."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.buckets, strict=True):
            running += n
            out.append((bound, running))
        return out


class Metrics:
    """Thread-safe named counters and histograms."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, int] = {}
        self._histograms: dict[str, Histogram] = {}
        self._gauges: dict[str, float] = {}

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = value

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            hist = self._histograms.get(name)
            if hist is None:
                hist = self._histograms[name] = Histogram()
            hist.observe(seconds)

    def counter(self, name: str) -> int:
        with self._lock:
            return self._counters.get(name, 0)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counters": dict(sorted(self._counters.items())),
                "gauges": dict(sorted(self._gauges.items())),
                "histograms": {k: h.snapshot() for k, h in sorted(self._histograms.items())},
            }
