"""Several synthesis servers: one `OffloadClient` each, and the choice of server for a new stream.

The servers are `offload.server` and `offload.servers`. A URI whose host is a
name stands for every address the name resolves to (a Kubernetes headless
Service lists one address per ready pod), resolved again every
`offload.resolve_interval_s`: servers that appear get a client, servers that
disappear are closed. A failed lookup keeps what the name resolved to before,
so a DNS hiccup does not drop healthy servers.

Every client has its own connection, pings and circuit breaker; all of them run
on one event-loop thread. `choose` picks, among the servers that are connected,
not going away (GOAWAY), not shut out by their breaker and offering the voice,
the one with the least load (queue depth and streams from its last PONG, plus
the streams this device opened since), ties broken at random so that devices
spread themselves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import itertools
import logging
import random
import socket
import threading
import time
from collections.abc import Collection

from edge_agent.endpoints import Endpoint, parse_uri
from edge_agent.errors import TIMEOUTS
from edge_agent.offload.client.breaker import BreakerState
from edge_agent.offload.client.connection import ClientLoop, OffloadClient
from edge_agent.offload.settings import OffloadSettings

log = logging.getLogger(__name__)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class ListedOrder(random.Random):
    """Breaks ties between equally loaded servers in the order they are listed (benchmarks and tests
    that need to know which server a stream goes to first)."""

    def __init__(self) -> None:
        super().__init__()
        self._next = itertools.count()

    def random(self) -> float:
        return float(next(self._next))


class ServerPool:
    """The device's servers; `start`, `choose` from any thread, `close`."""

    def __init__(self, settings: OffloadSettings, psk: bytes | None, *,
                 rng: random.Random | None = None) -> None:
        if not settings.targets:
            raise ValueError("offload: no server configured (offload.server or offload.servers)")
        self.settings = settings
        self.psk = psk
        self._targets = [parse_uri(uri, ("tcp", "tls")) for uri in settings.targets]
        self._loop = ClientLoop()
        self._rng = rng or random.Random()
        self._cond = threading.Condition()
        self._clients: dict[Endpoint, OffloadClient] = {}
        self._resolved: dict[Endpoint, list[Endpoint]] = {}
        self._resolving = True
        self._stop = asyncio.Event()  # binds to the pool's loop on first use
        self._task: concurrent.futures.Future[None] | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._loop.start()
        self._task = asyncio.run_coroutine_threadsafe(self._discover(), self._loop.loop)

    def close(self) -> None:
        if not self._loop.running:
            return
        self._loop.loop.call_soon_threadsafe(self._stop.set)
        if self._task is not None:
            with contextlib.suppress(Exception):
                self._task.result(timeout=5)
        for client in self.clients:
            client.close()
        self._loop.stop()

    @property
    def clients(self) -> list[OffloadClient]:
        with self._cond:
            return list(self._clients.values())

    def client(self, uri: str) -> OffloadClient | None:
        """The client of one resolved server (`tcp://ADDRESS:PORT`)."""
        return next((c for c in self.clients if c.uri == uri), None)

    # -- discovery (on the pool's loop) ---------------------------------------------------

    async def _discover(self) -> None:
        while not self._stop.is_set():
            for target in self._targets:
                found = await self._resolve(target)
                if found is not None:
                    self._resolved[target] = found
            self._sync()
            with self._cond:
                self._resolving = False
                self._cond.notify_all()
            if all(_is_address(t.host) for t in self._targets):
                return  # nothing to resolve again
            with contextlib.suppress(*TIMEOUTS):
                await asyncio.wait_for(self._stop.wait(), self.settings.resolve_interval_s)

    async def _resolve(self, target: Endpoint) -> list[Endpoint] | None:
        if _is_address(target.host):
            return [target]
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM),
                self.settings.connect_timeout_s)
        except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
            log.warning("offload: cannot resolve %s (%s); keeping %d known server(s)", target.host,
                        exc, len(self._resolved.get(target, [])))
            return None
        addresses = dict.fromkeys(str(info[4][0]) for info in infos)
        return [Endpoint(target.scheme, address, target.port) for address in addresses]

    def _sync(self) -> None:
        """Start clients for new addresses, close those of addresses no longer listed."""
        wanted: dict[Endpoint, Endpoint] = {}
        for target, endpoints in self._resolved.items():
            for endpoint in endpoints:
                wanted.setdefault(endpoint, target)
        with self._cond:
            gone = [c for e, c in self._clients.items() if e not in wanted]
            for endpoint in [e for e in self._clients if e not in wanted]:
                del self._clients[endpoint]
            new = []
            for endpoint, target in wanted.items():
                if endpoint not in self._clients:
                    client = OffloadClient(self.settings, self.psk, endpoint=endpoint,
                                           server_name=target.host, loop=self._loop, on_change=self._notify)
                    self._clients[endpoint] = client
                    new.append(client)
        for client in new:
            log.info("offload: server %s added", client.uri)
            client.start()
        for client in gone:
            log.info("offload: server %s no longer listed; closing", client.uri)
            asyncio.get_running_loop().run_in_executor(None, client.close)

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- used from the synthesizing thread ------------------------------------------------

    def wait_ready(self, timeout: float) -> bool:
        """Wait until a server is connected or every server's first attempt has ended; True if one is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                clients = list(self._clients.values())
                if any(c.connection is not None for c in clients):
                    return True
                if not self._resolving and all(c.attempted for c in clients):
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)

    def wait_all(self, timeout: float) -> bool:
        """Wait until every listed server is connected (benchmarks and tests that need them all)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                clients = list(self._clients.values())
                if not self._resolving and clients and all(c.connection is not None for c in clients):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)

    def choose(self, voice: str, exclude: Collection[OffloadClient] = ()) -> OffloadClient | None:
        """The least-loaded usable server offering `voice`, its breaker's permission taken; None if none."""
        usable = []
        for client in self.clients:
            conn = client.connection
            if client in exclude or conn is None or voice not in conn.info.voices:
                continue
            if client.breaker.state is BreakerState.OPEN:
                continue
            usable.append((conn.load, self._rng.random(), client))
        for _load, _tie, client in sorted(usable, key=lambda t: (t[0], t[1])):
            if client.breaker.allow():
                return client
        return None

    def voices(self) -> dict[str, bool]:
        """Each voice a connected server offers -> whether one offering it takes streams now (its
        breaker not open; asking `allow` would spend a half-open probe)."""
        found: dict[str, bool] = {}
        for client in self.clients:
            conn = client.connection
            if conn is None:
                continue
            usable = client.breaker.state is not BreakerState.OPEN
            for voice in conn.info.voices:
                found[voice] = found.get(voice, False) or usable
        return found

    def why_none(self, voice: str) -> str:
        """Why `choose` found no server: for the log line of a local fallback."""
        clients = self.clients
        if not clients:
            return "no offload server resolved yet"
        connected = [c for c in clients if c.connection is not None]
        if not connected:
            errors = sorted({c.last_error or "not connected" for c in clients})
            return f"no offload server connected ({'; '.join(errors)})"
        if not any(voice in c.connection.info.voices for c in connected if c.connection is not None):
            return f"no server offers voice {voice!r}"
        failing = [c.breaker.last_failure for c in connected if c.breaker.state is not BreakerState.CLOSED]
        if failing:
            return f"circuit open ({failing[0] or 'server failing'})"
        return "every server was tried"
