"""Stopping the ESPHome server ends every connection's task in bounded time, even one that
swallowed a cancel (as `asyncio.wait_for` does on Python < 3.12 when its read completes just then)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from edge_agent.esphome.server import _cancel_all


async def _swallows_cancels(times: int) -> None:
    for _ in range(times):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
    await asyncio.Event().wait()


def test_a_task_that_swallowed_a_cancel_is_cancelled_again_until_it_ends() -> None:
    async def main() -> tuple[bool, float]:
        task = asyncio.create_task(_swallows_cancels(1))
        await asyncio.sleep(0)  # let it start waiting
        started = time.monotonic()
        await _cancel_all({task}, timeout_s=5.0)
        return task.done(), time.monotonic() - started

    done, took = asyncio.run(main())
    assert done
    assert took < 2.0  # the second cancel, not the 5 s bound (nor a 90 s idle timeout)


def test_a_task_that_never_ends_is_left_after_the_bound_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    stubborn = True

    async def never_ends() -> None:
        while stubborn:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()

    async def main() -> float:
        nonlocal stubborn
        task = asyncio.create_task(never_ends())
        await asyncio.sleep(0)
        started = time.monotonic()
        await _cancel_all({task}, timeout_s=0.5)
        took = time.monotonic() - started
        stubborn = False  # the test's own clean-up: the next cancel ends it
        task.cancel()
        await asyncio.wait({task}, timeout=5)
        return took

    with caplog.at_level(logging.WARNING, logger="edge_agent.esphome.server"):
        took = asyncio.run(main())
    assert 0.4 < took < 3.0
    assert "did not end within 0.5 s" in caplog.text
