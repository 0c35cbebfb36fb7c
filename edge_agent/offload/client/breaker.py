"""When to stop trying the server: a circuit breaker, and reconnect backoff with jitter."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from enum import Enum

log = logging.getLogger(__name__)


class BreakerState(Enum):
    CLOSED = "closed"
    """Requests go to the server."""
    OPEN = "open"
    """Requests stay local until the cool-down has passed."""
    HALF_OPEN = "half_open"
    """One probe (a request or a ping) decides: success closes, failure reopens."""


class CircuitBreaker:
    """Opens after `failures` consecutive failures; after `open_s`, one probe may close it.

    Fed by pings, connection attempts and requests (first-audio deadline missed,
    server error, connection lost). Thread-safe: the connection loop and the
    synthesizing thread both report.
    """

    def __init__(self, failures: int = 3, open_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = failures
        self.open_s = open_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False
        self.last_failure = ""

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._current()

    def _current(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.open_s:
            self._state = BreakerState.HALF_OPEN
            self._probing = False
        return self._state

    def allow(self) -> bool:
        """May a request go to the server now? In HALF_OPEN only one probe is let through."""
        with self._lock:
            state = self._current()
            if state is BreakerState.CLOSED:
                return True
            if state is BreakerState.HALF_OPEN and not self._probing:
                self._probing = True
                return True
            return False

    def success(self) -> None:
        with self._lock:
            state = self._current()
            if state is BreakerState.OPEN:
                return  # still cooling down: one good ping does not end an outage
            if state is BreakerState.HALF_OPEN:
                log.info("offload server healthy again: circuit closed")
            self._state = BreakerState.CLOSED
            self._failures = 0
            self._probing = False

    def failure(self, reason: str = "") -> None:
        with self._lock:
            self.last_failure = reason
            state = self._current()
            self._failures += 1
            if state is BreakerState.HALF_OPEN or (
                    state is BreakerState.CLOSED and self._failures >= self.threshold):
                log.warning("offload circuit open for %.0f s after %d failure(s)%s", self.open_s,
                            self._failures, f": {reason}" if reason else "")
                self._state = BreakerState.OPEN
                self._opened_at = self._clock()
                self._probing = False
            elif state is BreakerState.OPEN:
                self._opened_at = self._clock()


class Backoff:
    """Exponential reconnect delays with jitter: uniform in [low, min(high, low * 2**attempt)]."""

    def __init__(self, low: float, high: float, rng: random.Random | None = None) -> None:
        self.low = low
        self.high = high
        self.attempt = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        cap = min(self.high, self.low * (2 ** min(self.attempt, 32)))
        self.attempt += 1
        return self._rng.uniform(self.low, cap)

    def reset(self) -> None:
        self.attempt = 0
