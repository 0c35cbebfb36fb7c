"""Typed offload messages: one dataclass per frame type, `encode` and `decode` between them.

Integers are big-endian. `str8` is a u8 length then UTF-8, `str16` a u16
length then UTF-8. Decoding is strict: short fields, trailing bytes, invalid
UTF-8 and out-of-range values are `MalformedPayload`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Union

from edge_agent.offload.wire.framing import (
    ErrorCode,
    Flag,
    Frame,
    MalformedPayload,
    MessageType,
    encode_frame,
)

NONCE_SIZE = 16
MAC_SIZE = 32


class Codec(IntEnum):
    """Audio encodings; the value is also the codec's bit in a codec mask."""

    PCM16 = 0x01
    """Signed 16-bit little-endian mono PCM."""
    OPUS = 0x02
    """Opus packets, each prefixed by its u16 length."""


def codec_mask(codecs: frozenset[Codec] | set[Codec]) -> int:
    mask = 0
    for codec in codecs:
        mask |= codec
    return mask


def codecs_in(mask: int) -> frozenset[Codec]:
    return frozenset(c for c in Codec if mask & c)


_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_PONG_LOAD = struct.Struct(">QHH")
_HELLO = struct.Struct(f">{NONCE_SIZE}sBI")
_SYNTH = struct.Struct(">BII")
_FORMAT = struct.Struct(">IBHHH")
_AUDIO = struct.Struct(">HI")
_END = struct.Struct(">III")
_ERROR = struct.Struct(">HH")


class _Reader:
    """Bounds-checked reads from one payload."""

    __slots__ = ("_data", "_pos", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._pos = 0
        self._what = what

    def take(self, n: int) -> bytes:
        if self._pos + n > len(self._data):
            raise MalformedPayload(f"{self._what}: payload ends inside a field")
        out = self._data[self._pos:self._pos + n]
        self._pos += n
        return out

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        return fmt.unpack(self.take(fmt.size))

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(_U16.unpack(self.take(2))[0])

    def text(self, n: int) -> str:
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPayload(f"{self._what}: text is not valid UTF-8") from None

    def str8(self) -> str:
        return self.text(self.u8())

    def str16(self) -> str:
        return self.text(self.u16())

    def rest(self) -> bytes:
        out = self._data[self._pos:]
        self._pos = len(self._data)
        return out

    def done(self) -> None:
        if self._pos != len(self._data):
            raise MalformedPayload(f"{self._what}: {len(self._data) - self._pos} unexpected trailing bytes")


def _str8(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 0xFF:
        raise ValueError(f"{value[:20]!r}...: longer than 255 bytes")
    return bytes([len(raw)]) + raw


def _str16(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 0xFFFF:
        raw = raw[:0xFFFF].decode("utf-8", "ignore").encode("utf-8")
    return _U16.pack(len(raw)) + raw


def _codec(value: int, what: str) -> Codec:
    try:
        return Codec(value)
    except ValueError:
        raise MalformedPayload(f"{what}: unknown codec {value:#04x}") from None


# -- handshake ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Client -> server, first frame: a fresh nonce and what the client can take."""

    nonce: bytes
    codecs: int
    """Mask of `Codec` values the client can decode."""
    max_frame: int
    """Largest payload the client accepts."""
    name: str = ""
    """Free text for logs (program and version)."""

    kind = MessageType.HELLO

    def payload(self) -> bytes:
        return _HELLO.pack(self.nonce, self.codecs, self.max_frame) + _str8(self.name)

    @classmethod
    def parse(cls, frame: Frame) -> Hello:
        r = _Reader(frame.payload, "HELLO")
        nonce, codecs, max_frame = r.unpack(_HELLO)
        name = r.str8()
        r.done()
        return cls(nonce, codecs, max_frame, name)


@dataclass(frozen=True, slots=True)
class Challenge:
    """Server -> client: the server's nonce and what it can send."""

    nonce: bytes
    codecs: int
    max_frame: int
    name: str = ""
    noauth: bool = False
    """The server does not check keys (insecure loopback mode)."""

    kind = MessageType.CHALLENGE

    @property
    def flags(self) -> int:
        return Flag.NOAUTH if self.noauth else 0

    def payload(self) -> bytes:
        return _HELLO.pack(self.nonce, self.codecs, self.max_frame) + _str8(self.name)

    @classmethod
    def parse(cls, frame: Frame) -> Challenge:
        r = _Reader(frame.payload, "CHALLENGE")
        nonce, codecs, max_frame = r.unpack(_HELLO)
        name = r.str8()
        r.done()
        return cls(nonce, codecs, max_frame, name, bool(frame.flags & Flag.NOAUTH))


@dataclass(frozen=True, slots=True)
class Auth:
    """Client -> server: HMAC-SHA256 over the HELLO and CHALLENGE payloads."""

    mac: bytes

    kind = MessageType.AUTH

    def payload(self) -> bytes:
        return self.mac

    @classmethod
    def parse(cls, frame: Frame) -> Auth:
        return cls(frame.payload)


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    id: str
    sample_rate: int
    """Hertz"""


@dataclass(frozen=True, slots=True)
class Welcome:
    """Server -> client: the server's own proof of the key, the agreed codecs, its voices."""

    mac: bytes
    codecs: int
    voices: tuple[VoiceInfo, ...] = ()
    noauth: bool = False

    kind = MessageType.WELCOME

    @property
    def flags(self) -> int:
        return Flag.NOAUTH if self.noauth else 0

    def payload(self) -> bytes:
        if len(self.voices) > 0xFF:
            raise ValueError("at most 255 voices")
        parts = [self.mac, bytes([self.codecs, len(self.voices)])]
        for voice in self.voices:
            parts.append(_str8(voice.id) + _U32.pack(voice.sample_rate))
        return b"".join(parts)

    @classmethod
    def parse(cls, frame: Frame) -> Welcome:
        r = _Reader(frame.payload, "WELCOME")
        mac = r.take(MAC_SIZE)
        codecs, count = r.u8(), r.u8()
        voices = []
        for _ in range(count):
            voice_id = r.str8()
            (rate,) = r.unpack(_U32)
            voices.append(VoiceInfo(voice_id, rate))
        r.done()
        return cls(mac, codecs, tuple(voices), bool(frame.flags & Flag.NOAUTH))


# -- streams -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Synth:
    """Client -> server: open stream `stream` and speak `sentences`."""

    stream: int
    voice: str
    sentences: tuple[str, ...]
    """One sentence per line on the wire; audio comes back tagged with its index."""
    sample_rate: int = 0
    """Hertz wanted; 0 is the voice's own."""
    codec: Codec = Codec.PCM16
    deadline_ms: int = 0
    """Milliseconds from arrival by which synthesis must have started; 0 is none."""

    kind = MessageType.SYNTH

    def payload(self) -> bytes:
        if any("\n" in s for s in self.sentences):
            raise ValueError("a sentence may not contain a newline")
        text = "\n".join(self.sentences).encode("utf-8")
        return _SYNTH.pack(self.codec, self.sample_rate, self.deadline_ms) + _str8(self.voice) + text

    @classmethod
    def parse(cls, frame: Frame) -> Synth:
        r = _Reader(frame.payload, "SYNTH")
        codec, rate, deadline = r.unpack(_SYNTH)
        voice = r.str8()
        raw = r.rest()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPayload("SYNTH: text is not valid UTF-8") from None
        return cls(frame.stream, voice, tuple(text.split("\n")) if text else (), rate,
                   _codec(codec, "SYNTH"), deadline)


@dataclass(frozen=True, slots=True)
class Format:
    """Server -> client, first frame of a stream: how its audio is encoded."""

    stream: int
    sample_rate: int
    codec: Codec
    frame_samples: int = 0
    """Samples per Opus packet (0 for PCM16)."""
    pre_skip: int = 0
    """Decoder samples to drop at the start of every sentence (Opus look-ahead)."""
    sentences: int = 0

    kind = MessageType.FORMAT

    def payload(self) -> bytes:
        return _FORMAT.pack(self.sample_rate, self.codec, self.frame_samples, self.pre_skip, self.sentences)

    @classmethod
    def parse(cls, frame: Frame) -> Format:
        rate, codec, frame_samples, pre_skip, sentences = _FORMAT.unpack(frame.payload)
        if not 1 <= rate <= 384_000:
            raise MalformedPayload(f"FORMAT: sample rate {rate} Hz is out of range")
        return cls(frame.stream, rate, _codec(codec, "FORMAT"), frame_samples, pre_skip, sentences)


@dataclass(frozen=True, slots=True)
class Audio:
    """Server -> client: encoded audio of sentence `sentence`; `last` closes the sentence."""

    stream: int
    sentence: int
    samples: int
    """Samples this chunk decodes to (after trimming Opus padding)."""
    data: bytes
    last: bool = False

    kind = MessageType.AUDIO

    @property
    def flags(self) -> int:
        return Flag.LAST if self.last else 0

    def payload(self) -> bytes:
        return _AUDIO.pack(self.sentence, self.samples) + self.data

    @classmethod
    def parse(cls, frame: Frame) -> Audio:
        sentence, samples = _AUDIO.unpack_from(frame.payload)
        return cls(frame.stream, sentence, samples, frame.payload[_AUDIO.size:],
                   bool(frame.flags & Flag.LAST))


@dataclass(frozen=True, slots=True)
class End:
    """Server -> client: the stream is over; no more frames carry its id."""

    stream: int
    samples: int = 0
    """Samples sent in the whole stream."""
    queue_ms: int = 0
    synth_ms: int = 0
    cancelled: bool = False

    kind = MessageType.END

    @property
    def flags(self) -> int:
        return Flag.CANCELLED if self.cancelled else 0

    def payload(self) -> bytes:
        return _END.pack(self.samples, self.queue_ms, self.synth_ms)

    @classmethod
    def parse(cls, frame: Frame) -> End:
        samples, queue_ms, synth_ms = _END.unpack(frame.payload)
        return cls(frame.stream, samples, queue_ms, synth_ms, bool(frame.flags & Flag.CANCELLED))


@dataclass(frozen=True, slots=True)
class Cancel:
    """Client -> server: stop stream `stream`; the server answers with END (cancelled)."""

    stream: int

    kind = MessageType.CANCEL

    def payload(self) -> bytes:
        return b""

    @classmethod
    def parse(cls, frame: Frame) -> Cancel:
        return cls(frame.stream)


@dataclass(frozen=True, slots=True)
class Error:
    """Either way. On stream 0: the connection is closed after it. Else: that stream is over."""

    stream: int
    code: int
    message: str = ""

    kind = MessageType.ERROR

    def payload(self) -> bytes:
        return _U16.pack(self.code) + _str16(self.message)

    @classmethod
    def parse(cls, frame: Frame) -> Error:
        r = _Reader(frame.payload, "ERROR")
        code = r.u16()
        message = r.str16()
        r.done()
        return cls(frame.stream, code, message)

    @property
    def name(self) -> str:
        try:
            return ErrorCode(self.code).name
        except ValueError:
            return f"code {self.code}"


@dataclass(frozen=True, slots=True)
class Ping:
    nonce: int

    kind = MessageType.PING

    def payload(self) -> bytes:
        return _U64.pack(self.nonce)

    @classmethod
    def parse(cls, frame: Frame) -> Ping:
        return cls(_U64.unpack(frame.payload)[0])


@dataclass(frozen=True, slots=True)
class Load:
    """What a server reports about its work in a PONG: how a device picks the least busy server."""

    queue_depth: int
    """Sentences waiting for a synthesis worker."""
    streams: int
    """Streams open on the server, from every client."""

    @property
    def total(self) -> int:
        return self.queue_depth + self.streams


@dataclass(frozen=True, slots=True)
class Pong:
    nonce: int
    load: Load | None = None
    """The server's load (servers send it; a client answering a server's PING does not)."""

    kind = MessageType.PONG

    def payload(self) -> bytes:
        if self.load is None:
            return _U64.pack(self.nonce)
        return _PONG_LOAD.pack(self.nonce, min(self.load.queue_depth, 0xFFFF), min(self.load.streams, 0xFFFF))

    @classmethod
    def parse(cls, frame: Frame) -> Pong:
        if len(frame.payload) == _U64.size:
            return cls(_U64.unpack(frame.payload)[0])
        nonce, queue_depth, streams = _PONG_LOAD.unpack(frame.payload)
        return cls(nonce, Load(queue_depth, streams))


@dataclass(frozen=True, slots=True)
class GoAway:
    """Server -> client: no new streams on this connection; open ones still finish."""

    code: int = ErrorCode.SHUTTING_DOWN
    message: str = field(default="")

    kind = MessageType.GOAWAY

    def payload(self) -> bytes:
        return _U16.pack(self.code) + _str16(self.message)

    @classmethod
    def parse(cls, frame: Frame) -> GoAway:
        r = _Reader(frame.payload, "GOAWAY")
        code = r.u16()
        message = r.str16()
        r.done()
        return cls(code, message)


Message = Union[Hello, Challenge, Auth, Welcome, Synth, Format, Audio, End, Cancel, Error, Ping, Pong, GoAway]  # noqa: UP007

_PARSERS: dict[MessageType, Callable[[Frame], Message]] = {
    cls.kind: cls.parse
    for cls in (Hello, Challenge, Auth, Welcome, Synth, Format, Audio, End, Cancel, Error, Ping, Pong, GoAway)
}


def decode(frame: Frame) -> Message:
    """The message a frame carries (`MalformedPayload` if its payload does not parse)."""
    try:
        return _PARSERS[frame.type](frame)
    except struct.error:
        raise MalformedPayload(f"{frame.type.name}: payload has the wrong size") from None


def encode(message: Message) -> bytes:
    """The frame for a message."""
    flags: int = getattr(message, "flags", 0)
    return encode_frame(message.kind, flags, getattr(message, "stream", 0), message.payload())
