"""The Sendspin tests' server and timeline helpers: the benchmark's own (`benchmarks.sendspin`), with
`until` failing as a test does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import sendspin as bench
from benchmarks.sendspin import (  # re-exported for the tests
    RATE,
    Heard,
    MusicServer,
    Placement,
    heard,
    locate,
    make_player,
    noise,
    place,
    rms_at,
    tone,
    wav_opener,
)

__all__ = ["RATE", "Heard", "MusicServer", "Placement", "heard", "locate", "make_player", "noise", "place",
           "rms_at", "tone", "until", "wav_opener"]


async def until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """`benchmarks.sendspin.until`, an AssertionError at the deadline."""
    try:
        return await bench.until(predicate, timeout, what)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
