"""The ESPHome native API's plain-text frames, read with limits and deadlines.

A frame is a zero byte, the payload's length as a varint, the message type as a
varint, then the payload (a protobuf message from `aioesphomeapi.api_pb2`). The
reader checks each varint's size and the length against `max_frame_bytes` before
reading what it announces, so a client claiming a 4 GiB frame costs nothing;
a silent client gets `idle_timeout_s` to start a frame and a started frame
`frame_timeout_s` to finish. Anything wrong is a `FrameError` naming it, and the
connection is closed. Writing uses aioesphomeapi's own packet builder.

An encrypted client (the Noise transport, `noise.py`) starts its frames with 0x01: a
device without a key refuses it with a message saying the device speaks plain text.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aioesphomeapi._frame_helper.packets import make_plain_text_packets
from aioesphomeapi.core import MESSAGE_TYPE_TO_PROTO
from google.protobuf.message import DecodeError, Message

from edge_agent.errors import TIMEOUTS, EdgeError

PLAINTEXT, NOISE = 0x00, 0x01
VARINT_BYTES = 5
"""Longest varint taken: ESPHome's lengths and types are 32-bit."""
TYPE_OF: dict[type[Message], int] = {cls: kind for kind, cls in MESSAGE_TYPE_TO_PROTO.items()}


class FrameError(EdgeError):
    """A client broke the framing (too large, malformed, too slow); its connection is closed."""


@dataclass(frozen=True)
class FrameLimits:
    max_frame_bytes: int = 65536
    idle_timeout_s: float = 90.0
    frame_timeout_s: float = 10.0


async def preamble(reader: asyncio.StreamReader, timeout_s: float) -> int:
    """The first byte of the next frame; `FrameError` after `timeout_s` of silence, `EOFError` at a
    clean end of stream."""
    try:
        first = await asyncio.wait_for(reader.read(1), timeout_s)
    except TIMEOUTS:
        raise FrameError(f"nothing received for {timeout_s:g} s") from None
    if not first:
        raise EOFError
    return first[0]


def encode(*messages: Message) -> list[bytes]:
    """`messages` as plain-text frames, ready for `writelines`."""
    return make_plain_text_packets([(TYPE_OF[type(m)], m.SerializeToString()) for m in messages])


class FrameReader:
    """Whole messages from a stream: a decoded message, None for a type this side does not know
    (newer clients send more; the frame is skipped), or `EOFError` at a clean end of stream."""

    def __init__(self, reader: asyncio.StreamReader, limits: FrameLimits) -> None:
        self._reader = reader
        self.limits = limits

    @staticmethod
    def encode(*messages: Message) -> list[bytes]:
        return encode(*messages)

    async def read(self) -> Message | None:
        first = await preamble(self._reader, self.limits.idle_timeout_s)
        if first == NOISE:
            raise FrameError("the client asked for an encrypted connection, and this device speaks "
                             "plain text (set esphome.encryption_key on both sides, or neither)")
        if first != PLAINTEXT:
            raise FrameError(f"bad preamble {first:#04x} (not the ESPHome native API)")
        try:
            return await asyncio.wait_for(self._rest(), self.limits.frame_timeout_s)
        except TIMEOUTS:
            raise FrameError(f"a frame took longer than {self.limits.frame_timeout_s:g} s") from None

    async def _rest(self) -> Message | None:
        length = await self._varint("length")
        kind = await self._varint("message type")
        if length > self.limits.max_frame_bytes:
            raise FrameError(f"frame of {length} bytes (at most {self.limits.max_frame_bytes})")
        payload = await self._exactly(length)
        cls = MESSAGE_TYPE_TO_PROTO.get(kind)
        if cls is None:
            return None
        try:
            return cls.FromString(payload)
        except DecodeError as exc:
            raise FrameError(f"malformed {cls.__name__}: {exc}") from None

    async def _varint(self, what: str) -> int:
        value = 0
        for i in range(VARINT_BYTES):
            byte = (await self._exactly(1))[0]
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                return value
        raise FrameError(f"the {what} varint is longer than {VARINT_BYTES} bytes")

    async def _exactly(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise FrameError("the connection closed inside a frame") from None
