"""Ending a TCP connection after a refusal so that the refusal reaches the peer.

A server that writes an error and closes while the peer is still sending closes a
socket with unread data in it, and the kernel answers with a reset: the peer's
kernel then usually throws away the error before the peer has read it. So a
refusal is followed by `hang_up`: our side is ended (`shutdown(SHUT_WR)`, a FIN
after the error), and what the peer still sends is read and dropped until it
closes too, for a bounded time and a bounded number of bytes; then `close`.
Protocol-neutral: any asyncio stream server can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import NamedTuple

from edge_agent.errors import TIMEOUTS

LINGER_S = 1.0
"""Longest time what the peer still sends is read and dropped after a refusal."""
LINGER_BYTES = 1 << 20
"""Most bytes dropped (a peer flooding past them is reset)."""
CLOSE_WAIT_S = 1.0
"""Longest `close` waits for what is buffered to go out before it resets the connection."""


class Linger(NamedTuple):
    """How a `hang_up` ended."""

    ended: bool
    """The peer closed its side within the bounds: closing now resets nothing."""
    dropped: int
    """Bytes the peer sent after the refusal, read and thrown away."""


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                  linger_s: float = LINGER_S, linger_bytes: int = LINGER_BYTES) -> Linger:
    """End our side once what is written has gone out, then read and drop what the peer still sends
    until it closes, for at most `linger_s` and `linger_bytes`.

    Never raises for a peer that is gone or slow: the connection is being ended either way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + linger_s
    dropped = 0
    with contextlib.suppress(ConnectionError, OSError, RuntimeError, *TIMEOUTS):
        if writer.can_write_eof() and not writer.is_closing():
            await asyncio.wait_for(writer.drain(), linger_s)
            writer.write_eof()
        while dropped < linger_bytes and (left := deadline - loop.time()) > 0:
            data = await asyncio.wait_for(reader.read(65536), left)
            if not data:
                return Linger(True, dropped)
            dropped += len(data)
    return Linger(False, dropped)


async def close(writer: asyncio.StreamWriter, timeout_s: float = CLOSE_WAIT_S) -> None:
    """Close after what is still buffered has been sent; a peer that takes none of it within
    `timeout_s` is reset (a transport keeps a socket open for as long as it has data to send)."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), timeout_s)
    except TIMEOUTS:
        writer.transport.abort()
    except Exception:  # already gone (reset, broken pipe): closed either way
        pass
