"""The voice assistant's fetches: how many run, in which threads, and how they are cut.

One fetch at a time per connection and `media.MAX_FETCHES` on the device (the last place kept
for the controller, so other connections cannot hold up an answer), their memory counted in one
`MediaBudget`; a fetch beyond these is refused at once (`MediaError`). They run in threads of
their own, never the loop's shared pool (which the mute, Wyoming and shutdown use). A fetch is
cut at `media.timeout_s` whatever the server sends, when its connection closes (`cut`), and when
the assistant closes (`close`), so a stalled server delays nothing.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from edge_agent.esphome.media import Fetched, MediaBudget, MediaError, Reservation, Transfer, fetch_audio


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int
    timeout_s: float


class Fetcher:
    """Fetches for the API's connections (each known by its `id`), on the server's loop."""

    def __init__(self, limits: MediaLimits) -> None:
        self.limits = limits
        self.budget = MediaBudget.for_limit(limits.max_bytes)
        """What every fetch holds at once, and how many run."""
        self._pool = ThreadPoolExecutor(self.budget.max_fetches, thread_name_prefix="esphome-media")
        self._fetching: set[int] = set()
        """Connections (their `id`) with a fetch running."""
        self._transfers: dict[Transfer, int] = {}
        """Transfers running -> the connection (its `id`) they are for."""

    def admit(self, connection: object, *, kept: bool) -> Reservation:
        """A place for one more fetch from `connection` (`kept`: the controller's, which may take
        the last place), or `MediaError` saying why there is none. `done(connection)` frees it."""
        if id(connection) in self._fetching:
            raise MediaError("this connection's previous URL is still being fetched (one at a time)")
        reservation = self.budget.admit(kept=kept)
        self._fetching.add(id(connection))
        return reservation

    def done(self, connection: object) -> None:
        """`connection`'s fetch is over: it may fetch again."""
        self._fetching.discard(id(connection))

    async def fetch(self, url: str, reservation: Reservation, connection: object, *,
                    max_seconds: float | None) -> Fetched:
        """`url` fetched and decoded in the fetcher's threads, no longer than `max_seconds` of
        audio (None: bounded by its decoded size alone); `MediaError` when it cannot be."""
        loop = asyncio.get_running_loop()
        transfer = Transfer()
        self._transfers[transfer] = id(connection)
        cut = loop.call_later(self.limits.timeout_s, transfer.abort)
        work = functools.partial(fetch_audio, url, max_bytes=self.limits.max_bytes,
                                 timeout_s=self.limits.timeout_s, max_seconds=max_seconds,
                                 reservation=reservation, transfer=transfer)
        try:
            return await loop.run_in_executor(self._pool, work)
        except RuntimeError as exc:  # the assistant closed: its pool takes nothing new
            raise MediaError(f"not fetched: {exc}") from None
        finally:
            cut.cancel()
            self._transfers.pop(transfer, None)

    def cut(self, connection: object) -> None:
        """`connection` closed: its transfer ends now."""
        for transfer, owner in list(self._transfers.items()):
            if owner == id(connection):
                transfer.abort()

    def close(self) -> None:
        """Cut every transfer (a stalled read returns now: nothing waits for the server) and take
        no new fetch."""
        for transfer in list(self._transfers):
            transfer.abort()
        self._pool.shutdown(wait=False, cancel_futures=True)
