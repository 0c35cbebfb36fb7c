"""Frames over an asyncio stream: deadlines on every read, a bounded send queue, TLS contexts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from pathlib import Path

from edge_agent.errors import TIMEOUTS, ConfigError, EdgeError
from edge_agent.offload.wire import messages
from edge_agent.offload.wire.framing import (
    DEFAULT_MAX_PAYLOAD,
    FrameDecoder,
    PeerStalled,
    ProtocolError,
)
from edge_agent.offload.wire.messages import Error, Message

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024
LINGER_S = 1.0
"""After an ERROR that closes the connection: how long what the peer still sends is read and dropped."""
LINGER_BYTES = 16 * 1024 * 1024
"""... and how much of it at most (the time alone would let a fast peer cost a loopback's bandwidth)."""


class OffloadError(EdgeError):
    """Remote synthesis failed (connection, server error, deadline); local synthesis can take over."""


class ConnectionClosed(OffloadError):
    """The peer closed the connection between frames."""


class FramedConnection:
    """One TCP (or TLS) connection carrying offload frames.

    Reads: a frame must complete within `frame_timeout` of its first byte, and
    a caller-given idle deadline bounds the wait for the next frame. Writes go
    through a queue of `send_queue` frames drained by one task; a peer that
    stops reading for `write_timeout` gets the connection closed.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 max_payload: int = DEFAULT_MAX_PAYLOAD, frame_timeout: float = 10.0,
                 write_timeout: float = 10.0, send_queue: int = 64) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder(max_payload)
        self._pending: list[Message] = []
        self._frame_started = 0.0
        self.frame_timeout = frame_timeout
        self.write_timeout = write_timeout
        self.peer_max_payload = DEFAULT_MAX_PAYLOAD
        """Largest payload the peer accepts (from its HELLO or CHALLENGE)."""
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=send_queue)
        self._writer_task = asyncio.get_running_loop().create_task(self._drain_queue())
        self._closed = False
        self.bytes_in = 0
        self.bytes_out = 0
        self.close_reason: BaseException | None = None
        self.peer = _peer_name(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Small frames (PING, CANCEL, the last AUDIO of a sentence) must not wait for Nagle.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def closed(self) -> bool:
        return self._closed

    async def read(self, idle_timeout: float | None = None, *, deadline: float | None = None) -> Message:
        """The next message; `PeerStalled` when a deadline passes, `ConnectionClosed` at EOF.

        `deadline` (loop time) bounds the whole call, a frame in progress included: the
        handshake's one deadline, which a peer trickling bytes cannot stretch.
        """
        loop = asyncio.get_running_loop()
        while not self._pending:
            if self._decoder.mid_frame:
                timeout: float | None = self._frame_started + self.frame_timeout - loop.time()
                what = "in the middle of a frame"
            else:
                timeout = idle_timeout
                what = "between frames"
            if deadline is not None and (timeout is None or deadline - loop.time() < timeout):
                timeout = deadline - loop.time()
                what = "before the deadline"
            try:
                if timeout is not None and timeout <= 0:
                    raise TimeoutError
                data = await asyncio.wait_for(self._reader.read(READ_SIZE), timeout)
            except TIMEOUTS:
                raise PeerStalled(f"{self.peer}: no data for too long {what}") from None
            except (ConnectionError, OSError, ssl.SSLError) as exc:
                raise ConnectionClosed(f"{self.peer}: connection lost ({exc})") from None
            if not data:
                self._decoder.close()
                raise ConnectionClosed(f"{self.peer}: connection closed")
            self.bytes_in += len(data)
            was_mid = self._decoder.mid_frame
            frames = self._decoder.feed(data)
            if self._decoder.mid_frame and (frames or not was_mid):
                self._frame_started = loop.time()
            self._pending.extend(messages.decode(f) for f in frames)
        return self._pending.pop(0)

    async def send(self, message: Message) -> None:
        """Queue one message; waits while the queue is full (back-pressure)."""
        frame = messages.encode(message)
        if len(frame) - 12 > self.peer_max_payload:
            raise ValueError(f"{type(message).__name__} of {len(frame)} bytes exceeds the peer's limit")
        if self._closed:
            raise ConnectionClosed(f"{self.peer}: connection closed")
        await self._queue.put(frame)

    async def _drain_queue(self) -> None:
        try:
            while (frame := await self._queue.get()) is not None:
                self._writer.write(frame)
                self.bytes_out += len(frame)
                await asyncio.wait_for(self._writer.drain(), self.write_timeout)
                self._queue.task_done()
        except TIMEOUTS:
            log.warning("%s: peer has not read for %.1f s; closing", self.peer, self.write_timeout)
            self.close_reason = PeerStalled(f"{self.peer}: the peer stopped reading")
            self._abort()
        except (ConnectionError, OSError, ssl.SSLError) as exc:
            self.close_reason = ConnectionClosed(f"{self.peer}: {exc}")
            self._abort()

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything queued so far has been handed to the socket."""
        waiter = asyncio.ensure_future(self._queue.join())
        await asyncio.wait([waiter, self._writer_task], timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()

    async def close(self, error: ProtocolError | Error | None = None) -> None:
        """Close, first sending `error` as an ERROR frame on stream 0 (best effort)."""
        was_closed = self._closed
        self._closed = True
        # Also after `abort()`, which closed the socket but left the writer task waiting on its
        # queue: one task leaked per connection aborted (every handshake evicted by a flood).
        await cancel_and_wait(self._writer_task)
        if was_closed:
            return
        if error is not None and not self._writer.is_closing():
            frame = error if isinstance(error, Error) else Error(0, int(error.code), str(error))
            with contextlib.suppress(Exception):
                self._writer.write(messages.encode(frame))
                await asyncio.wait_for(self._writer.drain(), 1.0)
                await self._linger()
        self._abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)

    async def _linger(self) -> None:
        """Half-close, then read and drop what the peer still sends, within `LINGER_S` and
        `LINGER_BYTES`: closing a socket with unread data makes the kernel answer with a reset,
        which discards the ERROR just written before the peer has read it (a 1 MB SYNTH got a
        reset instead of FRAME_TOO_LARGE). TLS cannot half-close; it only drains."""
        if self._writer.can_write_eof():
            self._writer.write_eof()
        loop = asyncio.get_running_loop()
        until = loop.time() + LINGER_S
        dropped = 0
        while dropped < LINGER_BYTES and (left := until - loop.time()) > 0:
            try:
                data = await asyncio.wait_for(self._reader.read(READ_SIZE), left)
            except TIMEOUTS:
                return
            if not data:
                return  # the peer closed too: nothing unread is left to cause a reset
            dropped += len(data)

    def abort(self) -> None:
        """Close now without a goodbye; a pending `read` ends with `ConnectionClosed`."""
        self._abort()

    def _abort(self) -> None:
        self._closed = True
        if not self._writer.is_closing():
            self._writer.close()


async def cancel_and_wait(task: asyncio.Future[object] | asyncio.Task[None], timeout: float = 2.0) -> None:
    """Cancel `task` and wait for it to end.

    Cancels repeatedly: on Python < 3.12 `asyncio.wait_for` can swallow a
    cancellation that lands just as its inner future completes, leaving the task
    running.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait([task], timeout=0.05)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: a failure here is not news at close time


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = f"[{peer[0]}]" if ":" in str(peer[0]) else str(peer[0])
        return f"{host}:{peer[1]}"
    return str(peer or "peer")


def server_tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """TLS 1.2+ server context from a PEM certificate chain and key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"server.tls_cert/tls_key: cannot load {cert} / {key} ({exc})") from None
    return ctx


def client_tls_context(ca: Path | None) -> ssl.SSLContext:
    """TLS client context verifying the server against `ca` (None: the system's trust store)."""
    try:
        ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"offload.tls_ca: cannot load {ca} ({exc})") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx

