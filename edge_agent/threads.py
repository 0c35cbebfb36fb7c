"""Blocking work the daemon's loop awaits in a thread of its own, never in the loop's shared pool."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


async def in_own_thread(work: Callable[[], object]) -> None:
    """Run `work` in a thread of its own: the loop's shared pool (`asyncio.to_thread`) may be busy
    with slow work, and the mute and the shutdown must not wait behind it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish(exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            loop.call_soon_threadsafe(finish, exc)
        else:
            loop.call_soon_threadsafe(finish, None)

    threading.Thread(target=run, name=getattr(work, "__name__", "work"), daemon=True).start()
    await done
