"""Where speech comes from: a microphone, a WAV file, or raw PCM on a pipe.

Every source yields blocks of mono float32 samples at `TARGET_RATE` (16 kHz, what
the VAD and Whisper expect), whatever the rate and channel count it reads:
channels are averaged, rates converted with soxr. Bad input is an `AudioError`
raised when the source is opened whenever the header already shows it (not a WAV,
implausible rate, truncated), so nothing has been processed before it fails.
"""

from __future__ import annotations

import logging
import os
import queue
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import StreamResampler
from edge_agent.audio.sinks import AudioUnavailable, import_sounddevice
from edge_agent.audio.wav import decode_pcm
from edge_agent.errors import AudioError

log = logging.getLogger(__name__)

TARGET_RATE = 16000
"""Hertz of every block a source yields."""
MIN_RATE = 4000
MAX_RATE = 384000
_EMPTY = np.zeros(0, dtype=np.float32)


class AudioSource(Protocol):
    """An open stream of 16 kHz mono float32 blocks."""

    sample_rate: int
    """Hertz of the yielded blocks (always `TARGET_RATE`)."""
    live: bool
    """True for a real-time device: it cannot wait for a slow consumer."""

    def blocks(self) -> Iterator[Samples]:
        """Blocks of samples until the input ends (or the source is closed)."""
        ...

    def close(self) -> None:
        """Stop reading and release the input; `blocks` then ends."""
        ...


def check_format(rate: int, channels: int, width: int, name: str) -> None:
    """Reject formats that cannot be audio we can read."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"{name}: sample rate {rate} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")
    if not 1 <= channels <= 32:
        raise AudioError(f"{name}: {channels} channels is not a plausible channel count")
    if width not in (1, 2, 3, 4):
        raise AudioError(f"{name}: unsupported sample width of {width} bytes")


class PcmConverter:
    """Raw PCM bytes of any plausible format -> 16 kHz mono float32, carrying partial frames between
    pushes (files, pipes and network streams all arrive in arbitrary pieces)."""

    def __init__(self, rate: int, channels: int, width: int, name: str, encoding: str = "pcm") -> None:
        self.rate, self.channels, self.width, self.encoding = rate, channels, width, encoding
        self._name = Path(name)
        self._resampler = StreamResampler(rate, TARGET_RATE)
        self._carry = b""
        self.frames_in = 0

    def push(self, data: bytes) -> Samples:
        data = self._carry + data
        frame = self.channels * self.width
        usable = len(data) - len(data) % frame
        self._carry = data[usable:]
        if not usable:
            return _EMPTY
        self.frames_in += usable // frame
        if self.encoding == "float":
            samples = np.frombuffer(data[:usable], dtype="<f4" if self.width == 4 else "<f8")
            mono = samples.reshape(-1, self.channels).mean(axis=1, dtype=np.float64).astype(np.float32)
        else:
            mono = decode_pcm(data[:usable], self.width, self.channels, self._name)
        return self._resampler.push(mono)

    def finish(self) -> Samples:
        return self._resampler.push(_EMPTY, last=True)

    @property
    def leftover(self) -> int:
        """Bytes of an incomplete final frame."""
        return len(self._carry)


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


class WavFileSource:
    """A WAV file (8/16/24/32-bit integer or 32/64-bit float, any rate and channel count), in blocks."""

    live = False
    sample_rate = TARGET_RATE

    def __init__(self, path: Path, block_s: float = 0.5) -> None:
        self.path = path
        name = str(path)
        try:
            size = path.stat().st_size
            self._fh = path.open("rb")
        except FileNotFoundError:
            raise AudioError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise AudioError(f"{path}: is a directory") from None
        except OSError as exc:
            raise AudioError(f"{path}: cannot read: {exc.strerror}") from None
        try:
            header = read_wav_header(self._fh, name, size)
            frame = header.channels * header.width
            self.frames = header.data_bytes // frame
            if header.data_offset + header.data_bytes > size:
                have = max(0, size - header.data_offset)
                raise AudioError(f"{path}: truncated (the header promises {header.data_bytes} bytes of "
                                 f"audio, the file has {have})")
            if self.frames == 0:
                raise AudioError(f"{path}: contains no audio")
        except OSError as exc:
            self._fh.close()
            raise AudioError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except AudioError:
            self._fh.close()
            raise
        self.header = header
        self.rate, self.channels = header.rate, header.channels
        self.duration_s = self.frames / self.rate
        self._block_bytes = max(1, round(block_s * self.rate)) * frame
        self._convert = PcmConverter(self.rate, self.channels, header.width, name, header.encoding)
        self._closed = False

    def blocks(self) -> Iterator[Samples]:
        left = self.frames * self.header.channels * self.header.width
        while not self._closed and left > 0:
            try:
                data = self._fh.read(min(self._block_bytes, left))
            except (OSError, ValueError) as exc:
                if self._closed:
                    return
                raise AudioError(f"{self.path}: read failed ({exc})") from None
            if not data:
                break
            left -= len(data)
            out = self._convert.push(data)
            if out.size:
                yield out
        if self._closed:
            return
        if left > 0:
            done = self._convert.frames_in / self.rate
            raise AudioError(f"{self.path}: truncated after {done:.2f} s of {self.duration_s:.2f} s")
        tail = self._convert.finish()
        if tail.size:
            yield tail

    def close(self) -> None:
        self._closed = True
        self._fh.close()


class PcmStreamSource:
    """Raw interleaved little-endian PCM from a binary stream, e.g. `arecord ... | edge-agent`."""

    live = False
    sample_rate = TARGET_RATE

    def __init__(self, stream: BinaryIO, rate: int = TARGET_RATE, channels: int = 1, width: int = 2,
                 *, block_s: float = 0.1, name: str = "stdin") -> None:
        check_format(rate, channels, width, name)
        self.name = name
        self._stream = stream
        self._block_bytes = max(1, round(block_s * rate)) * channels * width
        self._convert = PcmConverter(rate, channels, width, name)
        self._closed = False

    def blocks(self) -> Iterator[Samples]:
        read = getattr(self._stream, "read1", self._stream.read)
        while not self._closed:
            try:
                data = read(self._block_bytes)
            except (OSError, ValueError) as exc:
                if self._closed:
                    return
                raise AudioError(f"{self.name}: read failed ({exc})") from None
            if not data:
                break
            out = self._convert.push(data)
            if out.size:
                yield out
        if self._closed:
            return
        if self._convert.frames_in == 0:
            raise AudioError(f"{self.name}: no audio (the stream was empty)")
        if self._convert.leftover:
            log.warning("%s: ignored %d bytes of an incomplete final frame", self.name,
                        self._convert.leftover)
        tail = self._convert.finish()
        if tail.size:
            yield tail

    def close(self) -> None:
        self._closed = True


def open_pcm_stdin(rate: int, channels: int, width: int = 2) -> PcmStreamSource:
    """Raw PCM on standard input."""
    return PcmStreamSource(os.fdopen(os.dup(0), "rb", buffering=0), rate, channels, width)


class SoundDeviceSource:
    """A microphone through PortAudio, resampled to 16 kHz when the card runs at another rate.

    The PortAudio callback only copies blocks into a bounded queue; when the
    consumer falls behind by more than `queue_s` seconds the oldest audio is
    dropped (and counted in `overflows`) rather than stalling the sound card.
    """

    live = True
    sample_rate = TARGET_RATE

    def __init__(self, device: str | None = None, block_s: float = 0.03, queue_s: float = 10.0) -> None:
        sd = import_sounddevice()
        self.overflows = 0
        self._closed = threading.Event()
        dev: int | str | None = int(device) if device and device.isdigit() else device
        try:
            info = sd.query_devices(dev, "input")
            rate = TARGET_RATE
            try:
                sd.check_input_settings(device=dev, samplerate=rate, channels=1, dtype="float32")
            except Exception:  # the card cannot capture at 16 kHz: capture at its own rate
                rate = int(info["default_samplerate"])
            self._rate = rate
            blocksize = max(1, round(block_s * rate))
            self._queue: queue.Queue[Samples] = queue.Queue(maxsize=max(1, round(queue_s / block_s)))
            self._stream = sd.InputStream(samplerate=rate, channels=1, dtype="float32", device=dev,
                                          blocksize=blocksize, callback=self._callback)
            self._stream.start()
        except sd.PortAudioError as exc:
            raise AudioUnavailable(f"no usable microphone ({_first_line(exc)})") from None
        except ValueError as exc:  # no such device, or no input device at all
            raise AudioUnavailable(f"no usable microphone ({exc})") from None
        self._resampler = StreamResampler(rate, TARGET_RATE)
        self.device_name = str(info.get("name", device))
        log.info("listening on %s at %d Hz", self.device_name, rate)

    def _callback(self, indata: Any, frames: int, time_info: Any, status: Any) -> None:
        block = np.array(indata[:, 0], dtype=np.float32)
        try:
            self._queue.put_nowait(block)
        except queue.Full:
            self.overflows += 1
            try:
                self._queue.get_nowait()
                self._queue.put_nowait(block)
            except (queue.Empty, queue.Full):
                pass

    def blocks(self) -> Iterator[Samples]:
        while not self._closed.is_set():
            try:
                block = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            out = self._resampler.push(block)
            if out.size:
                yield out

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._stream.stop()
            self._stream.close()
        except Exception as exc:  # closing a vanished device must not mask the real error
            log.debug("closing the input stream failed: %s", exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
