"""Where Music Assistant finds and reaches the player: its WebSocket listener and zeroconf name.

Sendspin is server-initiated: the player listens (`sendspin.host`, `sendspin.port`, path
`sendspin.path`) and advertises `_sendspin._tcp.local.` with the path in its TXT record; each
WebSocket that connects is handed to the protocol client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from edge_agent.mdns import Advertisement, label
from edge_agent.sendspin.settings import SendspinSettings

if TYPE_CHECKING:
    from aiohttp import web

# A child of the player's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.sendspin.player.endpoint")

SERVICE_TYPE = "_sendspin._tcp.local."
BUFFER_CAPACITY_BYTES = 1_048_576
"""What the hello tells the server we buffer (it sends no further ahead than fits); also the
largest WebSocket message taken."""

Attach = Callable[[Any], Awaitable[None]]
"""Runs the protocol over one connected WebSocket until it closes."""


class Endpoint:
    """The listener and the advertisement, started and stopped on the player's loop."""

    def __init__(self, settings: SendspinSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.port = settings.port
        """The port listened on (the one the system chose, once listening on port 0)."""
        self._runner: web.AppRunner | None = None
        self._advert: Advertisement | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def listen(self, attach: Attach) -> None:
        """Take connections at `sendspin.path`, each handed to `attach`; `OSError` if the port is taken."""
        from aiohttp import web

        async def serve(request: web.Request) -> web.WebSocketResponse:
            return await self._serve(request, attach)

        app = web.Application()
        app.router.add_get(self.settings.path, serve)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        if self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])

    async def advertise(self) -> None:
        """Advertise the player by zeroconf; a failure is logged (it can still be added by address)."""
        advert = Advertisement(SERVICE_TYPE, self.name, self.settings.host, self.port,
                               {"path": self.settings.path, "name": self.name},
                               hostname=f"{label(self.name)}.local.")
        try:
            await advert.start()
            self._advert = advert
        except Exception as exc:  # Music Assistant can still add it by address
            log.warning("sendspin: zeroconf advertisement failed (%s); add ws://<address>:%d%s "
                        "in Music Assistant", exc, self.port, self.settings.path)

    async def withdraw(self) -> None:
        """Stop advertising (first, so that no server finds a player on its way out)."""
        advert, self._advert = self._advert, None
        if advert is not None:
            await advert.stop()

    async def close(self) -> None:
        """Cut every connection and stop listening."""
        for task in list(self._connections):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: web.Request, attach: Attach) -> web.WebSocketResponse:
        from aiohttp import web

        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=BUFFER_CAPACITY_BYTES)
        await ws.prepare(request)
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        log.info("sendspin: server connecting from %s", request.remote)
        try:
            await attach(ws)
        except Exception as exc:  # a broken peer must not take the listener down
            log.warning("sendspin: connection from %s failed: %s", request.remote, exc)
        finally:
            if task is not None:
                self._connections.discard(task)
            if not ws.closed:
                await ws.close()
        return ws
