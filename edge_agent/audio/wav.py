"""WAV files: written atomically as 16-bit PCM; read (whole or in blocks) from any PCM or float WAV.

One reader serves every caller: `open_wav` walks the RIFF chunks and checks the header before a
sample is read, `read_wav` decodes a whole file, and `audio.sources.WavFileSource` streams one
block by block through the same header and the same `decode`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import struct
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.errors import AudioError

MIN_RATE = 4000
MAX_RATE = 384000


def to_pcm16(samples: Samples) -> bytes:
    """float32 in -1..1 to little-endian 16-bit PCM."""
    scaled = np.clip(samples, -1.0, 1.0)
    scaled *= 32767.0  # in place: a long announcement's audio is not copied three more times
    np.round(scaled, out=scaled)
    return scaled.astype("<i2").tobytes()


def from_pcm16(data: bytes | memoryview) -> Samples:
    """Little-endian 16-bit PCM to float32 in -1..1."""
    usable = len(data) - len(data) % 2
    samples = np.frombuffer(data[:usable], dtype="<i2").astype(np.float32)
    samples /= 32768.0  # in place: a long file's audio is held once, not twice
    return samples


def create_temp(directory: Path, prefix: str, suffix: str) -> tuple[int, Path]:
    """A new, empty temp file in `directory`: its descriptor and path, created with the umask.

    `tempfile.mkstemp` makes mode 0600 whatever the umask: right for private state, wrong for
    a WAV file that someone else plays or copies (0644 under the usual umask 022).
    """
    for _ in range(100):
        path = directory / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temp file name in {directory}")


class WavWriter:
    """Writes mono 16-bit PCM to a temp file beside `path`, renamed into place on `close`.

    A failed or interrupted synthesis never leaves a half-written file at `path`.
    """

    def __init__(self, path: Path, sample_rate: int) -> None:
        self.path = path
        self.sample_rate = sample_rate
        directory = path.parent if str(path.parent) else Path(".")
        try:
            fd, self._tmp = create_temp(directory, f".{path.name}.", ".part")
        except OSError as exc:
            raise AudioError(f"cannot write {path}: {exc.strerror}") from None
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
            # Closing patches the header, which fails again on the full disk that made us abort:
            # the file is being thrown away, so the descriptor must still be closed.
            with contextlib.suppress(OSError):
                self._wav.close()
            self._file.close()
        finally:
            self._tmp.unlink(missing_ok=True)


def check_format(rate: int, channels: int, width: int, name: str) -> None:
    """Reject formats that cannot be audio we can read."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"{name}: sample rate {rate} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")
    if not 1 <= channels <= 32:
        raise AudioError(f"{name}: {channels} channels is not a plausible channel count")
    if width not in (1, 2, 3, 4):
        raise AudioError(f"{name}: unsupported sample width of {width} bytes")


@dataclass(frozen=True)
class WavHeader:
    """Where a WAV file's samples are and how they are stored."""

    encoding: str
    """`pcm` (integer) or `float`."""
    channels: int
    rate: int
    width: int
    """Bytes per sample."""
    data_offset: int
    data_bytes: int

    @property
    def frames(self) -> int:
        return self.data_bytes // (self.channels * self.width)


_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


def read_wav_header(fh: BinaryIO, name: str, file_size: int) -> WavHeader:
    """Walk the RIFF chunks up to `data`: PCM, IEEE float and WAVE_FORMAT_EXTENSIBLE files."""
    riff = fh.read(12)
    if len(riff) < 12:
        reason = "empty file" if file_size == 0 else "too short for a WAV header"
        raise AudioError(f"{name}: not a PCM WAV file ({reason})")
    if riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
        raise AudioError(f"{name}: not a PCM WAV file (no RIFF/WAVE header)")
    fmt: tuple[int, int, int, int] | None = None
    while True:
        head = fh.read(8)
        if len(head) < 8:
            raise AudioError(f"{name}: not a PCM WAV file (no data chunk)")
        chunk, size = head[:4], struct.unpack("<I", head[4:])[0]
        if chunk == b"fmt ":
            body = fh.read(size + (size & 1))
            if size < 16 or len(body) < 16:
                raise AudioError(f"{name}: not a PCM WAV file (short fmt chunk)")
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if tag == _EXTENSIBLE and size >= 40:
                tag = struct.unpack("<H", body[24:26])[0]  # the sub-format GUID starts with the tag
            fmt = (tag, channels, rate, bits)
        elif chunk == b"data":
            if fmt is None:
                raise AudioError(f"{name}: not a PCM WAV file (data before fmt)")
            offset = fh.tell()
            if size in (0, 0xFFFFFFFF) and file_size > offset:  # written while streaming: size unknown
                size = file_size - offset
            return _header(fmt, offset, size, name)
        else:
            fh.seek(size + (size & 1), os.SEEK_CUR)


def _header(fmt: tuple[int, int, int, int], offset: int, size: int, name: str) -> WavHeader:
    tag, channels, rate, bits = fmt
    if tag not in (_PCM, _FLOAT):
        raise AudioError(f"{name}: not a PCM WAV file (format tag {tag:#x}; compressed audio is not read)")
    if bits % 8:
        raise AudioError(f"{name}: unsupported sample size of {bits} bits")
    encoding = "float" if tag == _FLOAT else "pcm"
    if encoding == "float" and bits not in (32, 64):
        raise AudioError(f"{name}: unsupported float sample size of {bits} bits")
    width = bits // 8
    check_format(rate, channels, width if encoding == "pcm" else 2, name)
    return WavHeader(encoding, channels, rate, width, offset, size)


def open_wav(path: Path) -> tuple[BinaryIO, WavHeader]:
    """`path` opened and positioned at its first sample, with its checked header.

    Every problem the header already shows (not a WAV, implausible format, fewer bytes than
    it promises) is an `AudioError` naming the file, raised before any sample is read.
    """
    try:
        size = path.stat().st_size
        fh = path.open("rb")
    except FileNotFoundError:
        raise AudioError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AudioError(f"{path}: is a directory") from None
    except OSError as exc:
        raise AudioError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        header = read_wav_header(fh, str(path), size)
        if header.data_offset + header.data_bytes > size:
            have = max(0, size - header.data_offset)
            raise AudioError(f"{path}: truncated (the header promises {header.data_bytes} bytes of "
                             f"audio, the file has {have})")
    except OSError as exc:
        fh.close()
        raise AudioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except AudioError:
        fh.close()
        raise
    return fh, header


@dataclass(frozen=True)
class WavAudio:
    """A decoded WAV file, mixed down to mono float32."""

    samples: Samples
    sample_rate: int
    channels: int


def read_wav(path: Path) -> WavAudio:
    """Read a whole WAV (8/16/24/32-bit integer or 32/64-bit float), mixing channels down to mono."""
    fh, header = open_wav(path)
    with fh:
        try:
            data = fh.read(header.frames * header.channels * header.width)
        except OSError as exc:
            raise AudioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    samples = decode(data, header.encoding, header.width, header.channels, path)
    return WavAudio(samples, header.rate, header.channels)


def decode(data: bytes | memoryview, encoding: str, width: int, channels: int, source: Path) -> Samples:
    """Interleaved frames (`pcm`: 1-4 byte integers; `float`: 4 or 8 bytes) to mono float32."""
    if encoding == "float":
        usable = len(data) - len(data) % (width * channels)
        frames = np.frombuffer(data[:usable], dtype="<f4" if width == 4 else "<f8").reshape(-1, channels)
        mono: Samples = frames.mean(axis=1, dtype=np.float64).astype(np.float32)
        return mono
    samples = _decode_pcm(data, width, source)
    if channels > 1:
        samples = samples[: len(samples) - len(samples) % channels].reshape(-1, channels).mean(axis=1)
    return samples.astype(np.float32, copy=False)


def _decode_pcm(data: bytes | memoryview, width: int, path: Path) -> Samples:
    if width == 1:
        samples = np.frombuffer(data, dtype=np.uint8).astype(np.float32)
        samples -= 128.0  # in place: the decoded audio is held once, not three times
        samples /= 128.0
        return samples
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


def encode_pcm(samples: Samples, width: int, channels: int = 1) -> bytes:
    """Mono float32 in -1..1 to interleaved little-endian integer PCM (`decode`'s widths: 1 is
    unsigned, 2-4 signed), the same sample in every channel."""
    clipped = np.clip(samples.astype(np.float64, copy=False), -1.0, 1.0)
    if width == 1:
        frames = np.round(clipped * 127.0 + 128.0).astype(np.uint8)
    elif width == 2:
        frames = np.round(clipped * 32767.0).astype("<i2")
    elif width == 3:
        ints = np.round(clipped * float((1 << 23) - 1)).astype("<i4")
        frames = ints.view(np.uint8).reshape(-1, 4)[:, :3]  # the low three bytes, little-endian
    elif width == 4:
        frames = np.round(clipped * float((1 << 31) - 1)).astype("<i4")
    else:
        raise AudioError(f"unsupported sample width of {width} bytes")
    if channels > 1:
        frames = np.repeat(frames[:, None], channels, axis=1)
    return np.ascontiguousarray(frames).tobytes()
