"""The offload wire format: a 12-byte header, then a typed payload (see docs/protocol.md).

Pure: no I/O. `FrameDecoder` is incremental (feed it whatever the socket
returned) and never holds more than one header plus one payload of at most
`max_payload` bytes; a header claiming more is rejected before anything is
allocated. Every violation raises one `ProtocolError` subtype whose `code` goes
into the ERROR frame sent before the connection is closed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from edge_agent.errors import EdgeError

MAGIC = 0xED53
"""First two bytes of every frame (0xED 0x53): not ASCII, not a TLS record, not HTTP."""
VERSION = 1
HEADER_SIZE = 12
MAX_STREAM_ID = (1 << 24) - 1
DEFAULT_MAX_PAYLOAD = 64 * 1024
HARD_MAX_PAYLOAD = 16 * 1024 * 1024
"""No configuration may raise the payload limit past this."""

_HEADER = struct.Struct(">HBBII")
"""magic u16, version u8, type u8, flags << 24 | stream id (u32), payload length u32."""


class MessageType(IntEnum):
    """The `type` byte."""

    HELLO = 0x01
    CHALLENGE = 0x02
    AUTH = 0x03
    WELCOME = 0x04
    SYNTH = 0x10
    FORMAT = 0x11
    AUDIO = 0x12
    END = 0x13
    CANCEL = 0x14
    ERROR = 0x15
    PING = 0x20
    PONG = 0x21
    GOAWAY = 0x22


class Flag:
    """Flag bits; each message type allows only its own (see `ALLOWED_FLAGS`)."""

    LAST = 0x01
    """AUDIO: the last chunk of its sentence."""
    CANCELLED = 0x01
    """END: the stream ended because it was cancelled."""
    NOAUTH = 0x01
    """CHALLENGE / WELCOME: the server runs without a key (loopback only)."""


class ErrorCode(IntEnum):
    """Codes carried by ERROR and GOAWAY frames."""

    PROTOCOL = 1
    FRAME_TOO_LARGE = 2
    UNSUPPORTED_VERSION = 3
    AUTH_FAILED = 4
    TIMEOUT = 5
    UNEXPECTED = 6
    BAD_REQUEST = 100
    UNKNOWN_VOICE = 101
    UNSUPPORTED_CODEC = 102
    BUSY = 103
    DEADLINE = 104
    SHUTTING_DOWN = 105
    INTERNAL = 106
    TOO_MANY_STREAMS = 107


CONNECTION_TYPES = frozenset({
    MessageType.HELLO, MessageType.CHALLENGE, MessageType.AUTH, MessageType.WELCOME,
    MessageType.PING, MessageType.PONG, MessageType.GOAWAY,
})
"""Types that must carry stream id 0."""
STREAM_TYPES = frozenset({
    MessageType.SYNTH, MessageType.FORMAT, MessageType.AUDIO, MessageType.END, MessageType.CANCEL,
})
"""Types that must carry a non-zero stream id. ERROR may carry either."""

ALLOWED_FLAGS = {
    MessageType.AUDIO: Flag.LAST,
    MessageType.END: Flag.CANCELLED,
    MessageType.CHALLENGE: Flag.NOAUTH,
    MessageType.WELCOME: Flag.NOAUTH,
}

PAYLOAD_BOUNDS: dict[MessageType, tuple[int, int | None]] = {
    MessageType.HELLO: (22, 22 + 255),
    MessageType.CHALLENGE: (22, 22 + 255),
    MessageType.AUTH: (32, 32),
    MessageType.WELCOME: (34, None),
    MessageType.SYNTH: (10, None),
    MessageType.FORMAT: (11, 11),
    MessageType.AUDIO: (6, None),
    MessageType.END: (12, 12),
    MessageType.CANCEL: (0, 0),
    MessageType.ERROR: (4, 4 + 0xFFFF),
    MessageType.PING: (8, 8),
    MessageType.PONG: (8, 12),
    MessageType.GOAWAY: (4, 4 + 0xFFFF),
}
"""Smallest and largest payload per type (None: up to the negotiated maximum)."""


class ProtocolError(EdgeError):
    """The peer broke the protocol; the connection is closed after an ERROR frame."""

    code = ErrorCode.PROTOCOL


class BadMagic(ProtocolError):
    """The first bytes of a frame are not the magic: not our protocol, or out of sync."""


class UnsupportedVersion(ProtocolError):
    code = ErrorCode.UNSUPPORTED_VERSION


class UnknownMessageType(ProtocolError):
    pass


class BadFlags(ProtocolError):
    pass


class BadStreamId(ProtocolError):
    pass


class FrameTooLarge(ProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE


class MalformedPayload(ProtocolError):
    pass


class Truncated(ProtocolError):
    """The connection ended in the middle of a frame."""


class PeerStalled(ProtocolError):
    """A read deadline passed (mid-frame, during the handshake, or idle too long)."""

    code = ErrorCode.TIMEOUT


class UnexpectedMessage(ProtocolError):
    """A well-formed message that is not allowed in this state or direction."""

    code = ErrorCode.UNEXPECTED


class AuthenticationFailed(ProtocolError):
    code = ErrorCode.AUTH_FAILED


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame; the payload is not yet interpreted."""

    type: MessageType
    flags: int
    stream: int
    payload: bytes


def check_max_payload(max_payload: int) -> int:
    if not HEADER_SIZE <= max_payload <= HARD_MAX_PAYLOAD:
        raise ValueError(f"max payload {max_payload} is outside {HEADER_SIZE}..{HARD_MAX_PAYLOAD}")
    return max_payload


def encode_frame(kind: MessageType, flags: int, stream: int, payload: bytes) -> bytes:
    """Header plus payload. Raises ValueError on our own programming errors, never on input."""
    if not 0 <= stream <= MAX_STREAM_ID:
        raise ValueError(f"stream id {stream} does not fit in 24 bits")
    if flags & ~ALLOWED_FLAGS.get(kind, 0):
        raise ValueError(f"flags {flags:#x} are not allowed on {kind.name}")
    return _HEADER.pack(MAGIC, VERSION, kind, (flags << 24) | stream, len(payload)) + payload


@dataclass(frozen=True, slots=True)
class Header:
    type: MessageType
    flags: int
    stream: int
    length: int


def parse_header(data: bytes | bytearray | memoryview, max_payload: int) -> Header:
    """Validate a 12-byte header; everything about a frame is checked here, before its payload."""
    magic, version, kind, word, length = _HEADER.unpack(data)
    if magic != MAGIC:
        raise BadMagic(f"bad magic {magic:#06x}: the peer does not speak edge-offload")
    if version != VERSION:
        raise UnsupportedVersion(f"protocol version {version} is not supported (this side speaks {VERSION})")
    try:
        mtype = MessageType(kind)
    except ValueError:
        raise UnknownMessageType(f"unknown message type {kind:#04x}") from None
    flags, stream = word >> 24, word & MAX_STREAM_ID
    if flags & ~ALLOWED_FLAGS.get(mtype, 0):
        raise BadFlags(f"{mtype.name}: flags {flags:#04x} are not allowed")
    if mtype in CONNECTION_TYPES and stream != 0:
        raise BadStreamId(f"{mtype.name} must be sent on stream 0, not {stream}")
    if mtype in STREAM_TYPES and stream == 0:
        raise BadStreamId(f"{mtype.name} needs a stream id")
    if length > max_payload:
        raise FrameTooLarge(f"{mtype.name} frame claims {length} bytes; the limit is {max_payload}")
    low, high = PAYLOAD_BOUNDS[mtype]
    if length < low or (high is not None and length > high):
        raise MalformedPayload(f"{mtype.name}: payload of {length} bytes is outside its bounds")
    return Header(mtype, flags, stream, length)


class FrameDecoder:
    """Incremental frame decoder with bounded memory.

    `feed` copies into its buffer only the bytes of the frame in progress, so
    `buffered` never exceeds `HEADER_SIZE + max_payload`, however much data one
    call passes. After a `ProtocolError` the decoder is dead: the connection
    must be closed.
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.max_payload = check_max_payload(max_payload)
        self._buf = bytearray()
        self._header: Header | None = None
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for the frame in progress (header bytes or payload bytes)."""
        return len(self._buf)

    @property
    def mid_frame(self) -> bool:
        """True while part of a frame has arrived: the frame deadline is running."""
        return self._header is not None or bool(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Frames completed by `data`, in order."""
        if self._failed is not None:
            raise self._failed
        try:
            return self._feed(memoryview(data).cast("B"))
        except ProtocolError as exc:
            self._failed = exc
            self._buf = bytearray()
            self._header = None
            raise

    def _feed(self, view: memoryview) -> list[Frame]:
        frames: list[Frame] = []
        pos, end = 0, len(view)
        while pos < end:
            header = self._header
            if header is None:
                if not self._buf and end - pos >= HEADER_SIZE:
                    header = parse_header(view[pos:pos + HEADER_SIZE], self.max_payload)
                    pos += HEADER_SIZE
                else:
                    take = min(HEADER_SIZE - len(self._buf), end - pos)
                    self._buf += view[pos:pos + take]
                    pos += take
                    if len(self._buf) < HEADER_SIZE:
                        break
                    header = parse_header(self._buf, self.max_payload)
                    self._buf = bytearray()
                self._header = header
            if not self._buf and end - pos >= header.length:
                payload = bytes(view[pos:pos + header.length])
                pos += header.length
            else:
                take = min(header.length - len(self._buf), end - pos)
                self._buf += view[pos:pos + take]
                pos += take
                if len(self._buf) < header.length:
                    break
                payload = bytes(self._buf)
                self._buf = bytearray()
            frames.append(Frame(header.type, header.flags, header.stream, payload))
            self._header = None
        return frames

    def close(self) -> None:
        """The byte stream ended: a frame in progress is a `Truncated` error."""
        if self._failed is None and self.mid_frame:
            have = len(self._buf) + (HEADER_SIZE if self._header is not None else 0)
            raise Truncated(f"connection closed in the middle of a frame ({have} bytes of it received)")
