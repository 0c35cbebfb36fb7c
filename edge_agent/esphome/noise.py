"""The ESPHome native API's encrypted transport (`esphome.encryption_key`), the server's side.

Noise_NNpsk0_25519_ChaChaPoly_SHA256 with the prologue `NoiseAPIInit\\0\\0`, as ESPHome devices
speak it. Every frame is 0x01, a 16-bit big-endian length, then the payload. The client
opens with an empty hello frame and a handshake frame (0x00 and its Noise message); the
server answers with its hello (0x01 for the protocol it chose, its name and MAC, each
ended by a zero byte) and its handshake frame (0x00 and the Noise reply), or, when the key
does not match, a failure frame (0x01 and `Handshake MAC failure`), which the client
reports as a wrong encryption key. After that each frame's payload is encrypted: the
message type and length (16 bits each, big-endian) and the protobuf message.

The Noise state machine and the ciphers are aioesphomeapi's own (`noise_encryption`, over
the `noiseprotocol` package); this module only plays the responder's part. Lengths are
checked against `FrameLimits.max_frame_bytes` before a frame is read, like plain text.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aioesphomeapi._frame_helper.noise_encryption import (
    ESPHOME_NOISE_BACKEND,
    NOISE_PROTOCOL_NAME,
    DecryptCipher,
    EncryptCipher,
    decode_noise_psk,
)
from aioesphomeapi.core import MESSAGE_TYPE_TO_PROTO
from cryptography.exceptions import InvalidTag
from google.protobuf.message import DecodeError, Message
from noise.connection import NoiseConnection

from edge_agent.errors import TIMEOUTS
from edge_agent.esphome.frames import NOISE, PLAINTEXT, TYPE_OF, FrameError, FrameLimits, preamble

PROLOGUE = b"NoiseAPIInit\x00\x00"
NNPSK0 = 0x01
"""The one protocol ESPHome defines (the first byte of the server's hello)."""
MAC_FAILURE = b"Handshake MAC failure"
"""What ESPHome devices answer a wrong key with; clients report it as an invalid key."""
REQUIRES_ENCRYPTION = bytes((NOISE, 0, 0))
"""Sent to a plain-text client: a noise frame, which its helper reports as 'requires encryption'."""


def check_key(key: str) -> bytes:
    """The 32-byte pre-shared key from its base64 text (empty: none); ValueError saying what is wrong."""
    return decode_noise_psk(key) if key else b""


class NoiseFrames:
    """One encrypted connection: `handshake`, then `read` messages and `encode` replies."""

    def __init__(self, reader: asyncio.StreamReader, limits: FrameLimits, psk: bytes) -> None:
        self._reader = reader
        self.limits = limits
        self._psk = psk
        self._encrypt: Any = None
        self._decrypt: Any = None

    async def handshake(self, name: str, mac: str) -> list[bytes]:
        """Read the client's hello and handshake; the frames to send back. A wrong key raises
        `WrongKey`, whose `frames` (our hello and the failure frame) tell the client so."""
        first = await preamble(self._reader, self.limits.frame_timeout_s)
        if first == PLAINTEXT:
            raise RequiresEncryption
        if first != NOISE:
            raise FrameError(f"bad preamble {first:#04x} (not the ESPHome native API)")
        try:
            await asyncio.wait_for(self._body(), self.limits.frame_timeout_s)  # the client's hello
            message = await asyncio.wait_for(self._frame(), self.limits.frame_timeout_s)
        except TIMEOUTS:
            raise FrameError(f"the handshake took longer than {self.limits.frame_timeout_s:g} s") from None
        hello = _frame(bytes((NNPSK0,)) + name.encode() + b"\0" + mac.encode() + b"\0")
        if not message or message[0] != 0:
            raise FrameError("the client's handshake frame is malformed")
        proto = NoiseConnection.from_name(NOISE_PROTOCOL_NAME, backend=ESPHOME_NOISE_BACKEND)
        proto.set_as_responder()
        proto.set_psks(self._psk)
        proto.set_prologue(PROLOGUE)
        proto.start_handshake()
        try:
            proto.read_message(message[1:])
        except (InvalidTag, ValueError) as exc:
            raise WrongKey([hello, _frame(b"\x01" + MAC_FAILURE)]) from exc
        reply = _frame(b"\x00" + proto.write_message())
        state = proto.noise_protocol
        self._encrypt = EncryptCipher(state.cipher_state_encrypt)
        self._decrypt = DecryptCipher(state.cipher_state_decrypt)
        return [hello, reply]

    async def read(self) -> Message | None:
        first = await preamble(self._reader, self.limits.idle_timeout_s)
        if first != NOISE:
            raise FrameError(f"bad preamble {first:#04x} on an encrypted connection")
        try:
            frame = await asyncio.wait_for(self._body(), self.limits.frame_timeout_s)
        except TIMEOUTS:
            raise FrameError(f"a frame took longer than {self.limits.frame_timeout_s:g} s") from None
        try:
            plain = self._decrypt.decrypt(frame)
        except InvalidTag:
            raise FrameError("a frame failed to decrypt (tampered, or out of order)") from None
        if len(plain) < 4:
            raise FrameError(f"a decrypted frame of {len(plain)} bytes (at least 4)")
        cls = MESSAGE_TYPE_TO_PROTO.get((plain[0] << 8) | plain[1])
        if cls is None:
            return None
        try:
            return cls.FromString(plain[4:])
        except DecodeError as exc:
            raise FrameError(f"malformed {cls.__name__}: {exc}") from None

    def encode(self, *messages: Message) -> list[bytes]:
        out = []
        for message in messages:
            data = message.SerializeToString()
            kind = TYPE_OF[type(message)]
            header = bytes(((kind >> 8) & 0xFF, kind & 0xFF, (len(data) >> 8) & 0xFF, len(data) & 0xFF))
            out.append(_frame(self._encrypt.encrypt(header + data)))
        return out

    async def _frame(self) -> bytes:
        head = await self._exactly(1)
        if head[0] != NOISE:
            raise FrameError(f"bad preamble {head[0]:#04x} in the handshake")
        return await self._body()

    async def _body(self) -> bytes:
        size = await self._exactly(2)
        length = (size[0] << 8) | size[1]
        if length > self.limits.max_frame_bytes:
            raise FrameError(f"frame of {length} bytes (at most {self.limits.max_frame_bytes})")
        return await self._exactly(length)

    async def _exactly(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise FrameError("the connection closed inside a frame") from None


class RequiresEncryption(FrameError):
    """A plain-text client reached a device with an encryption key."""

    def __init__(self) -> None:
        super().__init__("a plain-text client; this device requires encryption (esphome.encryption_key): "
                         "add the key in Home Assistant")


class WrongKey(FrameError):
    """The client's key is not ours; `frames` tell it so (it reports an invalid encryption key)."""

    def __init__(self, frames: list[bytes]) -> None:
        super().__init__("the client's encryption key does not match esphome.encryption_key")
        self.frames = frames


def _frame(payload: bytes) -> bytes:
    return bytes((NOISE, (len(payload) >> 8) & 0xFF, len(payload) & 0xFF)) + payload
