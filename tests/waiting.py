"""One bounded wait for the tests: a condition polled until true, or a clear failure at the deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

TIMEOUT = 60.0
"""Generous: a loaded 2-core machine can be slow, and every wait ends on a condition."""


def wait_until(predicate: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
    """The first truthy value of `predicate()`; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)
