"""WAV files: 16-bit PCM in and out, written atomically."""

from __future__ import annotations

import os
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.errors import AudioError


def to_pcm16(samples: Samples) -> bytes:
    """float32 in -1..1 to little-endian 16-bit PCM."""
    scaled = np.clip(samples, -1.0, 1.0) * 32767.0
    return np.round(scaled).astype("<i2").tobytes()


def from_pcm16(data: bytes) -> Samples:
    """Little-endian 16-bit PCM to float32 in -1..1."""
    usable = len(data) - len(data) % 2
    return np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) / 32768.0


class WavWriter:
    """Writes mono 16-bit PCM to a temp file beside `path`, renamed into place on `close`.

    A failed or interrupted synthesis never leaves a half-written file at `path`.
    """

    def __init__(self, path: Path, sample_rate: int) -> None:
        self.path = path
        self.sample_rate = sample_rate
        directory = path.parent if str(path.parent) else Path(".")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=directory)
        except OSError as exc:
            raise AudioError(f"cannot write {path}: {exc.strerror}") from None
        self._tmp = Path(tmp)
        self._file = os.fdopen(fd, "wb")
        self._wav = wave.open(self._file, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._wav.setnchannels(1)
        self._wav.setsampwidth(2)
        self._wav.setframerate(sample_rate)
        self.frames = 0

    def write(self, samples: Samples) -> None:
        self._wav.writeframes(to_pcm16(samples))
        self.frames += len(samples)

    def close(self) -> None:
        self._wav.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        try:
            self._wav.close()
            self._file.close()
        finally:
            self._tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class WavAudio:
    """A decoded WAV file, mixed down to mono float32."""

    samples: Samples
    sample_rate: int
    channels: int


def read_wav(path: Path) -> WavAudio:
    """Read a PCM WAV (8/16/24/32-bit integer), mixing channels down to mono."""
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.getnframes()
            data = wav.readframes(frames)
    except FileNotFoundError:
        raise AudioError(f"{path}: no such file") from None
    except (wave.Error, EOFError) as exc:
        raise AudioError(f"{path}: not a PCM WAV file ({exc or 'truncated'})") from None
    except OSError as exc:
        raise AudioError(f"{path}: cannot read: {exc.strerror}") from None
    if channels < 1 or rate < 1000:
        raise AudioError(f"{path}: implausible WAV header ({channels} channels, {rate} Hz)")
    expected = frames * channels * width
    if len(data) < expected:
        raise AudioError(f"{path}: truncated ({len(data)} of {expected} bytes of audio)")
    samples = _decode(data, width, path)
    if channels > 1:
        samples = samples[: len(samples) - len(samples) % channels].reshape(-1, channels).mean(axis=1)
    return WavAudio(samples.astype(np.float32, copy=False), rate, channels)


def _decode(data: bytes, width: int, path: Path) -> Samples:
    if width == 1:
        return (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 2:
        return from_pcm16(data)
    if width == 3:
        raw = np.frombuffer(data[: len(data) - len(data) % 3], dtype=np.uint8).reshape(-1, 3)
        ints = (raw[:, 0].astype(np.int32) | (raw[:, 1].astype(np.int32) << 8)
                | (raw[:, 2].astype(np.int32) << 16))
        ints = np.where(ints >= 1 << 23, ints - (1 << 24), ints)
        return ints.astype(np.float32) / float(1 << 23)
    if width == 4:
        return np.frombuffer(data[: len(data) - len(data) % 4], dtype="<i4").astype(np.float32) / 2.0**31
    raise AudioError(f"{path}: unsupported sample width of {width} bytes")


def decode_pcm(data: bytes, width: int, channels: int, source: Path) -> Samples:
    """Interleaved integer PCM frames (1-4 bytes per sample) to mono float32."""
    samples = _decode(data, width, source)
    if channels > 1:
        samples = samples[: len(samples) - len(samples) % channels].reshape(-1, channels).mean(axis=1)
    return samples.astype(np.float32, copy=False)
