"""`netclose.hang_up`: a refusal reaches a peer that is still sending, and the linger is bounded.

A real asyncio server on loopback refuses each connection with one line and hangs up;
the peer is a raw socket that keeps sending.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable

from edge_agent import netclose

REFUSAL = b"refused: too large\n"


def _serve(on_connection: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
           peer: Callable[[int], None]) -> None:
    """Run a server whose one connection `on_connection` handles while `peer(port)` runs in a thread;
    returns once both have finished."""

    async def main() -> None:
        finished = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await on_connection(reader, writer)
            finally:
                finished.set()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            await asyncio.wait_for(asyncio.to_thread(peer, port), 30)
            await asyncio.wait_for(finished.wait(), 30)

    asyncio.run(main())


def _send_all(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(data)


def test_a_peer_still_sending_reads_the_refusal_and_a_clean_end_not_a_reset() -> None:
    dropped: list[int] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        writer.write(REFUSAL)
        dropped.append((await netclose.hang_up(reader, writer)).dropped)
        await netclose.close(writer)

    received = bytearray()

    def peer(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sender = threading.Thread(target=_send_all, args=(sock, bytes(512 * 1024)), daemon=True)
            sender.start()
            while chunk := sock.recv(4096):  # a reset raises ConnectionResetError here
                received.extend(chunk)
            sender.join(10)

    _serve(refuse, peer)
    assert bytes(received) == REFUSAL
    assert 0 < dropped[0] < 512 * 1024


def test_a_peer_that_never_stops_sending_is_closed_after_the_linger() -> None:
    took: list[float] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        writer.write(REFUSAL)
        started = time.monotonic()
        await netclose.hang_up(reader, writer, linger_s=0.3)
        took.append(time.monotonic() - started)
        await netclose.close(writer)

    def peer(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"x")
            assert sock.recv(4096) == REFUSAL
            with contextlib.suppress(OSError):  # a byte every 20 ms until the device has closed
                while not took:
                    sock.sendall(b"x")
                    time.sleep(0.02)  # the peer's pace

    _serve(refuse, peer)
    assert 0.25 < took[0] < 2.0  # bounded by linger_s, not by the peer


def test_a_peer_flooding_past_the_byte_budget_is_cut_off_at_it() -> None:
    dropped: list[int] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        writer.write(REFUSAL)
        linger = await netclose.hang_up(reader, writer, linger_s=10.0, linger_bytes=64 * 1024)
        dropped.append(linger.dropped)
        writer.transport.abort()

    def peer(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            _send_all(sock, bytes(8 << 20))

    _serve(refuse, peer)
    assert 64 * 1024 <= dropped[0] < 64 * 1024 + 65536 + 1
