"""Audio on the wire: PCM16 always, Opus when libopus loads.

A sentence is the unit of encoding: every sentence starts a fresh Opus encoder
and decoder, so sentences can be encoded in parallel on the server and a
client that loses a connection mid-utterance never needs codec state from the
dead stream. Each AUDIO chunk says how many samples it yields once decoded:
the decoder drops the first `pre_skip` samples of each sentence (the encoder's
look-ahead) and any padding of the last packet.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.wav import to_pcm16
from edge_agent.offload.wire.framing import MalformedPayload
from edge_agent.offload.wire.messages import Codec

log = logging.getLogger(__name__)


OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
"""The only sample rates libopus encodes and decodes."""
OPUS_FRAME_MS = 20
MAX_OPUS_FRAME = 5760
"""120 ms at 48 kHz: the longest Opus packet."""
_U16 = struct.Struct(">H")


@lru_cache(maxsize=1)
def _opus() -> Any:
    """The `opuslib_next` module, or None when libopus cannot be loaded."""
    try:
        import opuslib_next

        opuslib_next.Encoder(24000, 1, "voip")  # loads the bundled libopus
    except Exception as exc:  # ImportError, OSError from ctypes, the loader's own error
        log.info("Opus unavailable (%s); PCM16 only", exc)
        return None
    return opuslib_next


def available_codecs() -> frozenset[Codec]:
    """Codecs this process can encode and decode."""
    return frozenset({Codec.PCM16, Codec.OPUS}) if _opus() is not None else frozenset({Codec.PCM16})


def opus_rate(rate: int) -> int:
    """The Opus rate to use for audio wanted at `rate`: the smallest at or above it."""
    for candidate in OPUS_RATES:
        if candidate >= rate:
            return candidate
    return OPUS_RATES[-1]


@dataclass(frozen=True)
class Chunk:
    """One AUDIO payload's worth of encoded audio."""

    samples: int
    data: bytes


class SentenceEncoder:
    """Encodes whole sentences into chunks of at most `max_data` bytes."""

    def __init__(self, codec: Codec, sample_rate: int, max_data: int, *,
                 chunk_samples: int = 8192, bitrate: int = 24000) -> None:
        self.codec = codec
        self.sample_rate = sample_rate
        self.max_data = max_data
        self.bitrate = bitrate
        self.frame_samples = 0
        self.pre_skip = 0
        if codec is Codec.OPUS:
            if _opus() is None:
                raise ValueError("Opus is not available in this process")
            if sample_rate not in OPUS_RATES:
                raise ValueError(f"Opus cannot run at {sample_rate} Hz")
            self.frame_samples = sample_rate * OPUS_FRAME_MS // 1000
            self.pre_skip = int(self._new_opus().lookahead)
            self.chunk_samples = chunk_samples
        else:
            self.chunk_samples = max(1, min(chunk_samples, max_data // 2))

    def _new_opus(self) -> Any:
        encoder = _opus().Encoder(self.sample_rate, 1, "voip")
        encoder.bitrate = self.bitrate
        encoder.signal = _opus().SIGNAL_VOICE
        return encoder

    def encode(self, samples: Samples) -> list[Chunk]:
        """Chunks of one sentence, in order (at least one, possibly of zero samples)."""
        if self.codec is Codec.PCM16:
            return self._pcm(samples)
        return self._opus_chunks(samples)

    def _pcm(self, samples: Samples) -> list[Chunk]:
        step = self.chunk_samples
        chunks = [Chunk(len(part), to_pcm16(part))
                  for part in (samples[i:i + step] for i in range(0, len(samples), step))]
        return chunks or [Chunk(0, b"")]

    def _opus_chunks(self, samples: Samples) -> list[Chunk]:
        frame = self.frame_samples
        valid = len(samples)
        total = valid + self.pre_skip
        padded = np.zeros(-(-total // frame) * frame if total else frame, dtype=np.float32)
        padded[:valid] = samples
        encoder = self._new_opus()
        chunks: list[Chunk] = []
        packets: list[bytes] = []
        size = 0
        skip, remaining = self.pre_skip, valid
        packet_budget = max(1, self.chunk_samples // frame)

        def flush() -> None:
            nonlocal packets, size, skip, remaining
            decoded = len(packets) * frame
            dropped = min(skip, decoded)
            skip -= dropped
            keep = min(decoded - dropped, remaining)
            remaining -= keep
            chunks.append(Chunk(keep, b"".join(packets)))
            packets, size = [], 0

        for start in range(0, len(padded), frame):
            packet = encoder.encode_float(padded[start:start + frame].tobytes(), frame)
            item = _U16.pack(len(packet)) + packet
            if packets and (size + len(item) > self.max_data or len(packets) >= packet_budget):
                flush()
            packets.append(item)
            size += len(item)
        flush()
        return chunks


class SentenceDecoder:
    """Decodes the chunks of one sentence; a fresh one per sentence."""

    def __init__(self, codec: Codec, sample_rate: int, frame_samples: int = 0, pre_skip: int = 0) -> None:
        self.codec = codec
        self.sample_rate = sample_rate
        self._skip = pre_skip
        self._decoder: Any = None
        self._frame = frame_samples
        if codec is Codec.OPUS:
            if _opus() is None:
                raise MalformedPayload("the server sent Opus, which this client cannot decode")
            if sample_rate not in OPUS_RATES or not 0 < frame_samples <= MAX_OPUS_FRAME:
                raise MalformedPayload(f"Opus at {sample_rate} Hz with {frame_samples}-sample frames")
            if pre_skip > MAX_OPUS_FRAME:
                raise MalformedPayload(f"Opus pre-skip {pre_skip} is implausible")
            self._decoder = _opus().Decoder(sample_rate, 1)

    def decode(self, samples: int, data: bytes) -> Samples:
        """The audio of one chunk: exactly `samples` samples, else `MalformedPayload`."""
        if self.codec is Codec.PCM16:
            if len(data) != 2 * samples:
                raise MalformedPayload(f"PCM16 chunk of {len(data)} bytes claims {samples} samples")
            pcm: Samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / np.float32(32768.0)
            return pcm
        decoded = self._opus_packets(data)
        dropped = min(self._skip, len(decoded))
        self._skip -= dropped
        decoded = decoded[dropped:]
        if len(decoded) < samples:
            raise MalformedPayload(f"Opus chunk decodes to {len(decoded)} samples, claims {samples}")
        return decoded[:samples]

    def _opus_packets(self, data: bytes) -> Samples:
        pieces: list[Samples] = []
        pos = 0
        while pos < len(data):
            if pos + 2 > len(data):
                raise MalformedPayload("Opus chunk ends inside a packet length")
            (length,) = _U16.unpack_from(data, pos)
            pos += 2
            if length == 0 or pos + length > len(data):
                raise MalformedPayload(f"Opus packet length {length} overruns its chunk")
            try:
                pcm = self._decoder.decode_float(data[pos:pos + length], self._frame)
            except Exception as exc:  # OpusError: a corrupt packet
                raise MalformedPayload(f"corrupt Opus packet ({exc})") from None
            pieces.append(np.frombuffer(pcm, dtype=np.float32))
            pos += length
        out: Samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        return out
