"""Ending a TCP connection after a refusal so that the refusal reaches the peer.

A server that writes an error and closes while the peer is still sending makes the
kernel answer with a reset (RST): closing a socket with unread data in it does that,
and so does every segment that arrives after the close. A reset makes the peer's next
read or write fail, and the peer usually loses the error still unread in its buffer.
So: write the error, half-close (`shutdown(SHUT_WR)`: the peer reads the error, then
the end of the stream), read and drop whatever the peer still sends until it stops
(its end of stream), and only then close. The lingering is bounded: by time, by bytes
(dropping costs little, but nothing is unbounded), and, by the caller, by how many
connections may linger at once; past a bound the close resets, as before.
"""

from __future__ import annotations

import asyncio
import contextlib

from edge_agent.errors import TIMEOUTS

READ_BYTES = 65536


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, linger_s: float,
                  max_bytes: int) -> bool:
    """Send what is buffered, half-close, and read and drop what the peer sends until its end of
    stream, for at most `linger_s` seconds and `max_bytes` bytes. True when the peer ended its side
    within them (closing now resets nothing); the caller closes either way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + linger_s
    dropped = 0
    with contextlib.suppress(ConnectionError, OSError, RuntimeError, *TIMEOUTS):
        if writer.can_write_eof():
            await asyncio.wait_for(writer.drain(), linger_s)
            writer.write_eof()
        while dropped <= max_bytes and (left := deadline - loop.time()) > 0:
            data = await asyncio.wait_for(reader.read(READ_BYTES), left)
            if not data:
                return True
            dropped += len(data)
    return False
