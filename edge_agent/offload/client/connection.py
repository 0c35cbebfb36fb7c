"""The device side of offload: one persistent, authenticated connection to `edge-agent serve`.

`ClientConnection` is the asyncio core (connect, handshake, multiplexed
streams, pings). `OffloadClient` keeps one alive from a background event-loop
thread (reconnecting with jittered backoff, pinging, feeding the circuit
breaker) and hands synchronous `RemoteStream`s (`stream.py`) to the synthesizing thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_agent import __version__
from edge_agent.endpoints import Endpoint, parse_uri
from edge_agent.errors import TIMEOUTS
from edge_agent.offload.client.breaker import Backoff, CircuitBreaker
from edge_agent.offload.client.errors import RemoteError, RemoteTimeout, Unavailable
from edge_agent.offload.client.stream import RemoteStream
from edge_agent.offload.settings import OffloadSettings
from edge_agent.offload.wire import auth
from edge_agent.offload.wire.codecs import available_codecs
from edge_agent.offload.wire.framing import (
    MAX_STREAM_ID,
    AuthenticationFailed,
    ProtocolError,
    UnexpectedMessage,
)
from edge_agent.offload.wire.messages import (
    Audio,
    Auth,
    Cancel,
    Challenge,
    Codec,
    End,
    Error,
    Format,
    GoAway,
    Hello,
    Load,
    Message,
    Ping,
    Pong,
    Synth,
    Welcome,
    codec_mask,
    codecs_in,
)
from edge_agent.offload.wire.transport import (
    ConnectionClosed,
    FramedConnection,
    OffloadError,
    cancel_and_wait,
    client_tls_context,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerInfo:
    """What the server said about itself in the handshake."""

    name: str
    codecs: frozenset[Codec]
    """Codecs agreed for this connection."""
    voices: dict[str, int]
    """Voice id -> sample rate."""
    authenticated: bool
    """False when the server runs without a key (insecure loopback mode)."""
    rtt_s: float = 0.0
    max_frame: int = 65536
    """Largest frame payload the server accepts (a request must fit in one)."""


StreamSink = Callable[["Message | OffloadError"], None]


@dataclass
class _Pending:
    sink: StreamSink
    ended: bool = False


class ClientConnection:
    """One authenticated connection; many concurrent streams. Runs on one event loop."""

    def __init__(self, conn: FramedConnection, info: ServerInfo) -> None:
        self.conn = conn
        self.info = info
        self._streams: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._pings: dict[int, asyncio.Future[float]] = {}
        self.going_away = False
        self.reported: Load | None = None
        """The load in the server's last PONG."""
        self.opened_since_report = 0
        """Streams this client opened since that PONG: they may not be in it yet."""
        self.closed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, endpoint: Endpoint, psk: bytes | None, *, timeout: float,
                   max_frame: int = 65536, tls_ca: str | None = None, server_name: str = "",
                   codecs: frozenset[Codec] | None = None) -> ClientConnection:
        """Connect, verify TLS if `tls://`, and run the key exchange, all within `timeout`."""
        try:
            return await asyncio.wait_for(
                cls._open(endpoint, psk, max_frame=max_frame, tls_ca=tls_ca, server_name=server_name,
                          codecs=codecs), timeout)
        except TIMEOUTS:
            where = f"{endpoint.host}:{endpoint.port}"
            raise Unavailable(f"{where}: no connection within {timeout:g} s") from None

    @classmethod
    async def _open(cls, endpoint: Endpoint, psk: bytes | None, *, max_frame: int, tls_ca: str | None,
                    server_name: str, codecs: frozenset[Codec] | None) -> ClientConnection:
        ssl_ctx = client_tls_context(Path(tls_ca) if tls_ca else None) if endpoint.scheme == "tls" else None
        try:
            reader, writer = await asyncio.open_connection(
                endpoint.host, endpoint.port, ssl=ssl_ctx,
                server_hostname=(server_name or endpoint.host) if ssl_ctx else None)
        except OSError as exc:
            raise Unavailable(f"{endpoint.host}:{endpoint.port}: {exc.strerror or exc}") from None
        conn = FramedConnection(reader, writer, max_payload=max_frame)
        try:
            info = await _handshake(conn, psk, max_frame, codecs or available_codecs())
        except BaseException:
            await conn.close()
            raise
        return cls(conn, info)

    # -- streams -------------------------------------------------------------

    async def request(self, sink: StreamSink, sentences: tuple[str, ...], voice: str, codec: Codec, *,
                      sample_rate: int = 0, deadline_ms: int = 0) -> int:
        """Open a stream; every message for it (and a final error, if any) goes to `sink`."""
        if self.conn.closed:
            raise Unavailable("connection closed")
        if self.going_away:
            raise Unavailable("server is shutting down")
        stream = next(self._ids)
        if stream > MAX_STREAM_ID:
            raise Unavailable("stream ids exhausted on this connection; reconnecting")
        self._streams[stream] = _Pending(sink)
        self.opened_since_report += 1
        try:
            await self.conn.send(Synth(stream, voice, sentences, sample_rate, codec, deadline_ms))
        except ConnectionClosed:
            self._streams.pop(stream, None)
            raise Unavailable("connection closed") from None
        except ValueError as exc:  # over the server's frame limit: not sent, the caller goes on
            self._streams.pop(stream, None)
            raise Unavailable(f"request not sent: {exc}") from None
        return stream

    async def cancel(self, stream: int) -> None:
        pending = self._streams.get(stream)
        if pending is not None and not pending.ended and not self.conn.closed:
            with contextlib.suppress(ConnectionClosed):
                await self.conn.send(Cancel(stream))

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    @property
    def load(self) -> int:
        """Estimated streams and queued sentences on the server: its last report plus what we added since."""
        if self.reported is None:
            return self.opened_since_report
        return self.reported.total + self.opened_since_report

    async def ping(self, timeout: float) -> float:
        """Round-trip time of one PING/PONG; `RemoteTimeout` if none within `timeout`."""
        nonce = secrets.randbits(64)
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pings[nonce] = future
        started = time.perf_counter()
        try:
            await self.conn.send(Ping(nonce))
            await asyncio.wait_for(future, timeout)
        except TIMEOUTS:
            raise RemoteTimeout(f"no PONG within {timeout:g} s") from None
        finally:
            self._pings.pop(nonce, None)
        return time.perf_counter() - started

    async def _read_loop(self) -> None:
        violation: ProtocolError | None = None
        try:
            while True:
                self._dispatch(await self.conn.read())
        except ProtocolError as exc:
            log.warning("offload server broke the protocol: %s", exc)
            violation = exc
            self._fail_all(OffloadError(f"protocol error from server: {exc}"))
        except OffloadError as exc:
            self._fail_all(exc)
        except asyncio.CancelledError:
            self._fail_all(ConnectionClosed("connection closed by the client"))
            raise
        finally:
            self.closed.set()
            await self.conn.close(violation)

    def _fail_all(self, error: OffloadError) -> None:
        """Tell every open stream and ping, synchronously, before anything else can run."""
        for pending in self._streams.values():
            pending.sink(error)
        self._streams.clear()
        for fut in self._pings.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(str(error)))
                fut.exception()

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, Pong):
            fut = self._pings.get(message.nonce)
            if fut is not None and not fut.done():
                if message.load is not None:
                    self.reported = message.load
                    self.opened_since_report = 0
                fut.set_result(0.0)
            return
        if isinstance(message, Ping):
            asyncio.get_running_loop().create_task(self._pong(message.nonce))
            return
        if isinstance(message, GoAway):
            log.info("offload server is going away: %s", message.message)
            self.going_away = True
            return
        if isinstance(message, Error) and message.stream == 0:
            raise RemoteError(message.code, message.name, message.message)
        if not isinstance(message, Format | Audio | End | Error):
            raise UnexpectedMessage(f"a server may not send {type(message).__name__} after the handshake")
        pending = self._streams.get(message.stream)
        if pending is None:
            return  # a stream we already gave up on (cancel crossed its frames on the wire)
        pending.sink(message)
        if isinstance(message, End | Error):
            self._streams.pop(message.stream, None)

    async def _pong(self, nonce: int) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.conn.send(Pong(nonce))

    def forget(self, stream: int) -> None:
        """Stop delivering a stream's messages (after a cancel)."""
        self._streams.pop(stream, None)

    async def close(self) -> None:
        await cancel_and_wait(self._reader)
        await self.conn.close()


async def _handshake(conn: FramedConnection, psk: bytes | None, max_frame: int,
                     codecs: frozenset[Codec]) -> ServerInfo:
    hello = Hello(auth.new_nonce(), codec_mask(codecs), max_frame, f"edge-agent {__version__}")
    await conn.send(hello)
    started = time.perf_counter()
    challenge = await conn.read()
    rtt = time.perf_counter() - started
    if isinstance(challenge, Error):
        raise RemoteError(challenge.code, challenge.name, challenge.message)
    if not isinstance(challenge, Challenge):
        raise UnexpectedMessage(f"expected CHALLENGE, got {type(challenge).__name__}")
    if challenge.noauth and psk is not None:
        raise AuthenticationFailed("the server runs without a key, but this device has one: "
                                   "refusing an unauthenticated server")
    conn.peer_max_payload = challenge.max_frame
    transcript = (hello.payload(), challenge.payload())
    mac = auth.client_proof(psk, *transcript) if psk is not None else bytes(32)
    await conn.send(Auth(mac))
    welcome = await conn.read()
    if isinstance(welcome, Error):
        if psk is None and welcome.code == AuthenticationFailed.code:
            raise AuthenticationFailed(f"the server needs a pre-shared key (set offload.psk_file or "
                                       f"${auth.PSK_ENV}): {welcome.message}")
        raise RemoteError(welcome.code, welcome.name, welcome.message)
    if not isinstance(welcome, Welcome):
        raise UnexpectedMessage(f"expected WELCOME, got {type(welcome).__name__}")
    if psk is not None and not auth.verify(auth.server_proof(psk, *transcript), welcome.mac):
        raise AuthenticationFailed("the server could not prove it holds the pre-shared key")
    agreed = codecs_in(welcome.codecs) & codecs
    if not agreed:
        raise UnexpectedMessage("the server agreed to no codec this client has")
    return ServerInfo(challenge.name, agreed, {v.id: v.sample_rate for v in welcome.voices},
                      authenticated=psk is not None, rtt_s=rtt, max_frame=challenge.max_frame)


class ClientLoop:
    """One event loop in a background thread; it holds every server connection of a device."""

    def __init__(self, name: str = "offload-client") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        if not self.thread.is_alive() and not self.loop.is_closed():
            self.thread.start()

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        """Cancel what still runs on the loop (a connection's writer, say), then stop and close it."""
        if not self.thread.is_alive():
            return

        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_rest(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class OffloadClient:
    """A persistent connection to one server, kept by a background event loop.

    The loop is its own unless a `ClientLoop` is shared (a `ServerPool` runs
    every server's client on one). `on_change` is called, on that loop, when the
    connection comes or goes.
    """

    def __init__(self, settings: OffloadSettings, psk: bytes | None, *, endpoint: Endpoint | None = None,
                 server_name: str = "", loop: ClientLoop | None = None,
                 breaker: CircuitBreaker | None = None, on_change: Callable[[], None] | None = None) -> None:
        if endpoint is None:
            if not settings.server:
                raise ValueError("offload.server is empty")
            endpoint = parse_uri(settings.server, ("tcp", "tls"))
        self.settings = settings
        self.endpoint = endpoint
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        self.uri = f"{endpoint.scheme}://{host}:{endpoint.port}"
        self.server_name = settings.tls_server_name or server_name
        self.psk = psk
        self.breaker = breaker or CircuitBreaker(settings.breaker_failures, settings.breaker_open_s)
        self._backoff = Backoff(settings.reconnect_min_s, settings.reconnect_max_s)
        self._owns_loop = loop is None
        self._client_loop = loop or ClientLoop()
        self._loop = self._client_loop.loop
        self._on_change = on_change
        self._conn: ClientConnection | None = None
        self._attempted = threading.Event()
        self._stop = asyncio.Event()  # binds to the client loop on first use (Python >= 3.10)
        self._task: concurrent.futures.Future[None] | None = None
        self.last_error: str = ""
        self.connects = 0

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self._client_loop.start()
        self._task = asyncio.run_coroutine_threadsafe(self._maintain(), self._loop)

    def close(self) -> None:
        if self._task is None or not self._client_loop.running:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        with contextlib.suppress(Exception):
            self._task.result(timeout=5)
        self._task = None
        if self._owns_loop:
            self._client_loop.stop()

    def __enter__(self) -> OffloadClient:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connection(self) -> ClientConnection | None:
        conn = self._conn
        return conn if conn is not None and not conn.conn.closed and not conn.going_away else None

    @property
    def info(self) -> ServerInfo | None:
        conn = self._conn
        return conn.info if conn is not None else None

    @property
    def attempted(self) -> bool:
        """Has the first connection attempt ended (either way)?"""
        return self._attempted.is_set()

    def wait_ready(self, timeout: float) -> bool:
        """Wait for the first connection attempt to end; True if connected now."""
        self._attempted.wait(timeout)
        return self.connection is not None

    # -- the connection loop -----------------------------------------------------

    async def _maintain(self) -> None:
        s = self.settings
        while not self._stop.is_set():
            try:
                conn = await ClientConnection.open(
                    self.endpoint, self.psk, timeout=s.connect_timeout_s, max_frame=s.max_frame_bytes,
                    tls_ca=str(s.tls_ca) if s.tls_ca else None, server_name=self.server_name)
            except (OffloadError, ProtocolError) as exc:
                repeated = self.last_error == f"connect: {exc}"
                self._failed(f"connect: {exc}")
                if isinstance(exc, AuthenticationFailed | RemoteError) and not repeated:
                    log.error("offload %s: %s", self.uri, exc)  # a configuration problem: say it once
                await self._sleep(self._backoff.next())
                continue
            self._conn = conn
            self.connects += 1
            self._backoff.reset()
            self.breaker.success()
            self._attempted.set()
            self._changed()
            log.info("offload: connected to %s (%s), voices %s, codecs %s", self.uri,
                     conn.info.name, ", ".join(conn.info.voices), "/".join(c.name for c in conn.info.codecs))
            await self._keep_alive(conn)
            self._conn = None
            self._changed()
            await conn.close()
            if not self._stop.is_set():
                await self._sleep(self._backoff.next())

    def _failed(self, reason: str) -> None:
        self.last_error = reason
        self.breaker.failure(reason)
        self._attempted.set()
        self._changed()
        log.debug("offload %s: %s", self.uri, reason)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    async def _keep_alive(self, conn: ClientConnection) -> None:
        s = self.settings
        while not self._stop.is_set():
            closed = asyncio.ensure_future(conn.closed.wait())
            stop = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait([closed, stop], timeout=s.ping_interval_s, return_when=asyncio.FIRST_COMPLETED)
            closed.cancel()
            stop.cancel()
            if self._stop.is_set():
                return
            if conn.closed.is_set():
                self._failed("connection lost")
                return
            if conn.going_away and conn.active_streams == 0:
                return
            try:
                rtt = await conn.ping(s.ping_timeout_s)
            except OffloadError as exc:
                self._failed(f"ping: {exc}")
                return
            self.breaker.success()
            log.debug("offload: ping %.1f ms", rtt * 1000)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(*TIMEOUTS):
            await asyncio.wait_for(self._stop.wait(), seconds)

    # -- used from the synthesizing thread ------------------------------------------

    def open_stream(self, sentences: list[str], voice: str, codec: Codec, sample_rate: int = 0,
                    deadline_s: float = 0.0) -> RemoteStream:
        """Start synthesis of `sentences` on the server; `Unavailable` if not connected."""
        conn = self.connection
        if conn is None:
            raise Unavailable(self.last_error or "not connected")
        if threading.current_thread() is self._client_loop.thread:
            raise RuntimeError("open_stream must not be called on the offload loop thread")
        remote = RemoteStream(self.cancel, len(sentences))
        future = asyncio.run_coroutine_threadsafe(
            conn.request(remote.deliver, tuple(sentences), voice, codec, sample_rate=sample_rate,
                         deadline_ms=round(deadline_s * 1000)), self._loop)
        try:
            remote.stream = future.result(timeout=self.settings.connect_timeout_s)
        except TIMEOUTS:
            future.cancel()
            raise Unavailable("could not send the request in time") from None
        return remote

    def cancel(self, stream: int) -> None:
        conn = self._conn
        if conn is None or stream == 0:
            return

        async def cancel() -> None:
            await conn.cancel(stream)
            conn.forget(stream)

        with contextlib.suppress(RuntimeError):  # loop already closed
            asyncio.run_coroutine_threadsafe(cancel(), self._loop)

    def ping(self, timeout: float) -> float:
        conn = self.connection
        if conn is None:
            raise Unavailable(self.last_error or "not connected")
        return asyncio.run_coroutine_threadsafe(conn.ping(timeout), self._loop).result(timeout + 1)


async def probe(endpoint: Endpoint, psk: bytes | None, *, timeout: float, tls_ca: str | None = None,
                server_name: str = "") -> ServerInfo:
    """Connect, authenticate, ping once and close: what `edge-agent doctor` reports."""
    conn = await ClientConnection.open(endpoint, psk, timeout=timeout, tls_ca=tls_ca, server_name=server_name)
    try:
        rtt = await conn.ping(timeout)
    finally:
        await conn.close()
    info = conn.info
    return ServerInfo(info.name, info.codecs, info.voices, info.authenticated, rtt, info.max_frame)
