"""Audio Home Assistant hands over as a URL (a TTS answer, an announcement, media to play).

Fetched with a bound on bytes and on the whole transfer's time, then decoded: WAV here,
FLAC and MP3 through libsndfile (`soundfile`, whose wheels bundle it with libFLAC and
mpg123). The media player asks Home Assistant's ffmpeg proxy for FLAC (`entities`), and
a URL that bypasses the proxy may be any of the three; anything else is refused with a
`MediaError` saying what came.

What a fetch may cost is bounded before it is spent:

- time: the deadline covers the whole transfer. Each read is a single receive whose
  socket timeout is what is left of the deadline, and the total is checked between
  reads, so a server that dribbles a byte a second is cut at the deadline, not after
  each read's timeout; `Transfer.abort` (the caller's timer at the deadline) shuts the
  socket under a read that is still blocked, even in the headers.
- memory: a `MediaBudget` shared by every fetch of the device counts the bytes held,
  checked before a chunk is kept and before the samples are decoded (a declared
  Content-Length, the running total, then the decoded size), and admits a few fetches
  at a time; a WAV longer than the announcement limit is refused from its header,
  before a sample is decoded, and so is a FLAC whose STREAMINFO states its length.
- compressed audio: what it decodes to is what counts, not its size. It is decoded a
  block at a time, each block counted in the budget before it is kept and the length
  checked against `max_samples` and `max_seconds` as it grows, so a small file that
  decodes to hours of silence (or one whose header lies about its length) is refused
  once it passes the bound, never decoded whole first. A file libsndfile cannot read,
  or one that yields no audio, is a `MediaError` naming the format and libsndfile's
  reason.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import io
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.wav import WavHeader, decode, read_wav_header
from edge_agent.errors import AudioError, EdgeError

READ_BYTES = 65536
"""Most bytes one read takes (one receive: it returns with what has arrived)."""
MAX_FETCHES = 2
"""Fetches running at once on the device; more are refused (each connection has one at most)."""
BUDGET_FETCHES = 3
"""The memory budget holds this many of the largest fetches' bodies (`MediaBudget.for_limit`)."""
SAMPLE_BYTES = 4
"""A decoded sample's size (mono float32)."""
HEADER_BYTES = 1 << 20
"""A WAV's samples must start within this many bytes (other chunks before them included)."""
DECODE_FRAMES = 16384
"""Frames one compressed-audio read decodes (at 8 channels of float32, 512 KiB held for it)."""


class MediaError(EdgeError):
    """A URL that cannot be played: not http(s), too large, too slow, not audio we decode, or the
    device busy."""


@dataclass(frozen=True)
class Fetched:
    samples: Samples
    sample_rate: int


class MediaBudget:
    """The bytes that every fetch of the device may hold at once, and how many fetches may run.

    A fetch `admit`s itself (refused when `max_fetches` already run), `take`s bytes before it
    keeps them (refused when the device's total would pass `limit_bytes`) and gives them all
    back with `release` once its audio has been handed on. Thread-safe.
    """

    def __init__(self, limit_bytes: int, max_fetches: int = MAX_FETCHES) -> None:
        self.limit_bytes = limit_bytes
        self.max_fetches = max_fetches
        self.held = 0
        """Bytes held by all fetches now."""
        self.peak = 0
        """The most bytes ever held at once."""
        self.running = 0
        self.kept_running = 0
        """Fetches running in the kept place."""
        self._lock = threading.Lock()

    @classmethod
    def for_limit(cls, max_bytes: int) -> MediaBudget:
        """A budget for fetches of at most `max_bytes` each: one such fetch decoded (its body
        and, at most, twice as many bytes of float32 samples: `max_samples`) fits, and a little
        more, so that a second small fetch can run beside a large one."""
        return cls(BUDGET_FETCHES * max_bytes)

    def admit(self, *, kept: bool = False) -> Reservation:
        """A place for one fetch, or `MediaError`. The last place is `kept` for one caller (Home
        Assistant's voice connection, whose answers must not wait behind other connections)."""
        with self._lock:
            others = self.running - self.kept_running
            if self.running >= self.max_fetches or (not kept and others >= max(self.max_fetches - 1, 1)):
                kept_note = "" if kept else ", one of them kept for Home Assistant's voice connection"
                raise MediaError(f"the device is already fetching {self.running} media URLs "
                                 f"(at most {self.max_fetches} at once{kept_note}); try again later")
            self.running += 1
            self.kept_running += kept
        return Reservation(self, kept=kept)

    def hold(self, n: int) -> bool:
        """Count `n` more bytes held, unless that would pass the limit (then False)."""
        with self._lock:
            if self.held + n > self.limit_bytes:
                return False
            self.held += n
            self.peak = max(self.peak, self.held)
            return True

    def give(self, n: int, *, ended: bool = False, kept: bool = False) -> None:
        """`n` bytes are free again (and, `ended`, a fetch is over, `kept`: the kept place's)."""
        with self._lock:
            self.held -= n
            self.running -= ended
            self.kept_running -= ended and kept


class Reservation:
    """One admitted fetch's share of a `MediaBudget`."""

    def __init__(self, budget: MediaBudget, *, kept: bool = False) -> None:
        self.budget = budget
        self.kept = kept
        self.held = 0
        self._released = False
        self._running = True

    def take(self, n: int, what: str) -> None:
        """Hold `n` more bytes, or `MediaError` saying that the device has no room for `what`."""
        if n <= 0:
            return
        if self._released:  # a fetch cut by the assistant closing, still unwinding in its thread
            raise MediaError(f"{what}: the fetch was cancelled")
        if not self.budget.hold(n):
            raise MediaError(f"{what}: the device holds {self.budget.held >> 20} MiB of other media "
                             f"(at most {self.budget.limit_bytes >> 20} MiB for all fetches); "
                             "try again later")
        self.held += n

    def give(self, n: int) -> None:
        """Hand back `n` of the bytes held (a buffer freed before the fetch ends)."""
        n = min(n, self.held)
        self.held -= n
        self.budget.give(n)

    def keep(self) -> None:
        """The fetch is over but its audio stays (a track the media player holds): its place is
        free for another fetch, its bytes stay counted until `release`."""
        if not self._released and self._running:
            self._running = False
            self.budget.give(0, ended=True, kept=self.kept)

    def release(self) -> None:
        """The fetch is over and its audio handed on: its bytes and its place are free again."""
        if not self._released:
            self._released = True
            held, self.held = self.held, 0
            self.budget.give(held, ended=self._running, kept=self.kept)
            self._running = False


class Transfer:
    """One fetch's connection, so that another thread can cut it (`abort`) at its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.aborted = False

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            aborted = self.aborted
        if aborted:
            _shut(sock)

    def abort(self) -> None:
        """Unblock whatever read waits (any thread): the fetch then fails as timed out."""
        with self._lock:
            self.aborted = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def settimeout(self, seconds: float) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.settimeout(max(seconds, 0.001))


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def max_samples(max_bytes: int) -> int:
    """The most samples a fetch may decode to: what `max_bytes` of 16-bit mono PCM holds (an 8-bit
    file of `max_bytes` would otherwise decode to four times its size)."""
    return max_bytes // 2


def fetch_audio(url: str, *, max_bytes: int, timeout_s: float, max_seconds: float | None = None,
                reservation: Reservation | None = None, transfer: Transfer | None = None) -> Fetched:
    """The WAV, FLAC or MP3 at `url`, mixed down to mono (blocking: call it from a worker thread).

    `reservation` counts what the fetch holds against the device's `MediaBudget` (kept until
    the caller releases it: the samples returned are part of it); `transfer` lets another thread
    cut the connection; `max_seconds` refuses longer audio from its header.
    """
    name = _short(url)
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise MediaError(f"{name}: only http(s) URLs are fetched, not {scheme or 'a path'}")
    counted = _Counted(reservation, name)
    judge = functools.partial(_early_check, name, max_seconds=max_seconds, max_samples=max_samples(max_bytes))
    body = _download(url, name, max_bytes=max_bytes, timeout_s=timeout_s, transfer=transfer or Transfer(),
                     counted=counted, judge=judge)
    fetched = decode_audio(body, name, max_seconds=max_seconds, max_samples=max_samples(max_bytes),
                           reservation=reservation, prepaid=counted.prepaid)
    del body
    counted.give_back()  # the body goes now; the samples stay counted until the caller releases them
    return fetched


class _Counted:
    """A body's bytes as counted in a reservation (a declared length at once, then what comes)."""

    def __init__(self, reservation: Reservation | None, name: str) -> None:
        self.reservation = reservation
        self.name = name
        self.taken = 0
        self.prepaid = 0
        """Bytes taken ahead for the samples (`prepay`), which the decoder counts as its own."""

    def prepay(self, declared: int) -> None:
        """A declared body's samples, as 16-bit mono would decode (so that of two large fetches the
        first is decoded and the second refused at once, not both refused when they decode)."""
        if self.reservation is not None:
            self.reservation.take(declared * SAMPLE_BYTES // 2, self.name)
            self.prepaid = declared * SAMPLE_BYTES // 2

    def hold(self, size: int) -> None:
        if self.reservation is not None and size > self.taken:
            self.reservation.take(size - self.taken, self.name)
            self.taken = size

    def give_back(self, keep: int = 0) -> None:
        if self.reservation is not None and self.taken > keep:
            self.reservation.give(self.taken - keep)
            self.taken = keep


def _download(url: str, name: str, *, max_bytes: int, timeout_s: float, transfer: Transfer,
              counted: _Counted, judge: Callable[[int | None], Callable[[bytearray], bool]]) -> bytearray:
    """The body, read within the deadline and the byte bounds; `judge(declared length)` looks at
    the body as it arrives until it says it has judged (or raises)."""
    deadline = time.monotonic() + timeout_s
    late = MediaError(f"{name}: not fetched within {timeout_s:g} s")
    body = bytearray()
    try:
        opener = urllib.request.build_opener(_Handler(transfer), _SecureHandler(transfer))
        with opener.open(url, timeout=timeout_s) as response:
            declared = response.headers.get("Content-Length")
            length = int(declared) if declared is not None and declared.isdigit() else None
            if length is not None:
                if length > max_bytes:
                    raise MediaError(f"{name}: {declared} bytes (at most {max_bytes})")
                counted.hold(length)
                counted.prepay(length)
            early: Callable[[bytearray], bool] | None = judge(length)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or transfer.aborted:
                    raise late
                transfer.settimeout(left)
                chunk = response.read1(READ_BYTES)
                if not chunk:
                    break
                if len(body) + len(chunk) > max_bytes:
                    raise MediaError(f"{name}: more than {max_bytes} bytes")
                counted.hold(len(body) + len(chunk))
                body += chunk
                if early is not None and early(body):
                    early = None
            if transfer.aborted:
                raise late
    except urllib.error.HTTPError as exc:
        raise MediaError(f"{name}: HTTP {exc.code} {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, no such host
        if transfer.aborted or time.monotonic() >= deadline:
            raise late from None
        reason = getattr(exc, "reason", exc) or type(exc).__name__
        raise MediaError(f"{name}: cannot fetch: {reason}") from None
    counted.give_back(keep=len(body))  # a declared length the server did not send
    return body


def audio_kind(data: bytes | bytearray) -> str:
    """What the first bytes say the audio is: WAV, FLAC, MP3, or "" (none of them)."""
    head = bytes(data[:4])
    if head == b"RIFF":
        return "WAV"
    if head == b"fLaC":
        return "FLAC"
    # An ID3v2 tag, or an MPEG audio frame's sync word (11 bits set: layers I-III, any version).
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "MP3"
    return ""


def decode_audio(data: bytes | bytearray, name: str, *, max_seconds: float | None = None,
                 max_samples: int | None = None, reservation: Reservation | None = None,
                 prepaid: int = 0) -> Fetched:
    """WAV, FLAC or MP3 bytes to mono samples within the bounds (see `decode_wav`)."""
    kind = audio_kind(data)
    if kind in ("FLAC", "MP3"):
        return decode_compressed(data, name, kind, max_seconds=max_seconds, max_samples=max_samples,
                                 reservation=reservation, prepaid=prepaid)
    return decode_wav(data, name, max_seconds=max_seconds, max_samples=max_samples,
                      reservation=reservation, prepaid=prepaid)


def decode_wav(data: bytes | bytearray, name: str, *, max_seconds: float | None = None,
               max_samples: int | None = None, reservation: Reservation | None = None,
               prepaid: int = 0) -> Fetched:
    """WAV bytes (a streamed file's unknown data size included) to mono samples, refused from the
    header when longer than `max_seconds` or more than `max_samples`, and counted in `reservation`
    before a sample is decoded (`prepaid`: bytes the reservation already holds for them)."""
    header = _header(data, name)
    frame = header.channels * header.width
    frames = min(header.data_bytes, len(data) - header.data_offset) // frame
    _check_length(header.rate, frames, name, max_seconds, max_samples)
    # The decoded mono samples, and while several channels are mixed down, each channel's.
    decoding = frames * SAMPLE_BYTES * (header.channels + (header.channels > 1))
    if reservation is not None:  # `prepaid` of it is held already
        if decoding > prepaid:
            reservation.take(decoding - prepaid, name)
        else:
            reservation.give(prepaid - decoding)
    pcm = memoryview(data)[header.data_offset:header.data_offset + frames * frame]
    samples = decode(pcm, header.encoding, header.width, header.channels, Path(name))
    if reservation is not None:
        reservation.give(decoding - samples.nbytes)
    return Fetched(samples, header.rate)


def decode_compressed(data: bytes | bytearray, name: str, kind: str, *, max_seconds: float | None = None,
                      max_samples: int | None = None, reservation: Reservation | None = None,
                      prepaid: int = 0) -> Fetched:
    """FLAC or MP3 bytes to mono samples, a block at a time: each block counted in `reservation`
    (`prepaid` of it held already) and the length checked before it is kept."""
    sf = _soundfile(name, kind)
    blocks: list[Samples] = []
    counted = _Decoded(reservation, name, prepaid)
    frames = 0
    try:
        with sf.SoundFile(_View(data), mode="r") as audio:
            # soundfile seeks to where it thinks a read ended after every read of a seekable file,
            # and libsndfile's MP3 seek lands about a frame off (the audio jumps at every block):
            # read straight on instead, as one whole-file read does.
            audio.seekable = lambda: False
            rate, channels = int(audio.samplerate), int(audio.channels)
            if rate <= 0 or channels <= 0:
                raise MediaError(f"{name}: {kind} states {rate} Hz and {channels} channels")
            if kind == "FLAC":  # STREAMINFO's length, when stated (MP3's is only libsndfile's guess)
                _judge_flac(data, name, max_seconds, max_samples)
            while True:
                block = audio.read(DECODE_FRAMES, dtype="float32", always_2d=True)
                if len(block) == 0:
                    break
                frames += len(block)
                _check_length(rate, frames, name, max_seconds, max_samples)
                counted.take(len(block) * SAMPLE_BYTES)
                blocks.append(block[:, 0].copy() if channels == 1 else block.mean(axis=1, dtype=np.float32))
                del block
    except MediaError:
        counted.give_back()
        raise
    except (sf.LibsndfileError, RuntimeError, ValueError, EOFError) as exc:  # libsndfile's reading
        counted.give_back()
        reason = getattr(exc, "error_string", None) or str(exc)
        raise MediaError(f"{name}: not playable {kind} (libsndfile: {reason})") from None
    if frames == 0:
        counted.give_back()
        raise MediaError(f"{name}: {kind} with no audio in it")
    samples = _gather(blocks, frames)
    counted.settle()
    return Fetched(samples, rate)


class _Decoded:
    """Decoded samples as counted in a reservation, drawing first on what was `prepaid`."""

    def __init__(self, reservation: Reservation | None, name: str, prepaid: int) -> None:
        self.reservation = reservation
        self.name = name
        self.credit = prepaid
        self.taken = 0

    def take(self, n: int) -> None:
        if self.reservation is None:
            return
        from_credit = min(n, self.credit)
        self.credit -= from_credit
        self.reservation.take(n - from_credit, self.name)
        self.taken += n

    def settle(self) -> None:
        """Decoding is over: the prepaid bytes it did not need go back."""
        if self.reservation is not None:
            self.reservation.give(self.credit)
        self.credit = 0

    def give_back(self) -> None:
        """Refused: everything it held goes back (the blocks are dropped)."""
        if self.reservation is not None:
            self.reservation.give(self.taken + self.credit)
        self.taken = self.credit = 0


def _gather(blocks: list[Samples], frames: int) -> Samples:
    """The blocks as one array, each block dropped once copied, so that what is held stays about
    the decoded size (not twice it) while they are joined."""
    if len(blocks) == 1:
        return blocks[0]
    out = np.empty(frames, dtype=np.float32)
    at = 0
    blocks.reverse()
    while blocks:
        block = blocks.pop()
        out[at:at + len(block)] = block
        at += len(block)
    return out


class _View(io.RawIOBase):
    """A body's bytes as a file libsndfile reads through (without a copy of the whole body)."""

    def __init__(self, data: bytes | bytearray) -> None:
        self._data = memoryview(data)
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), len(self._data) - self._at))
        view[:n] = self._data[self._at:self._at + n]
        self._at += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._data)}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at


def _soundfile(name: str, kind: str) -> Any:
    """The `soundfile` module, or `MediaError` saying how to get it (or a libsndfile with MP3)."""
    try:
        import soundfile
    except (ImportError, OSError) as exc:  # not installed, or its libsndfile did not load
        raise MediaError(f"{name}: {kind} needs the soundfile package with libsndfile ({exc}); "
                         "pip install soundfile") from None
    if kind == "MP3" and "MP3" not in soundfile.available_formats():
        raise MediaError(f"{name}: this libsndfile ({soundfile.__libsndfile_version__}) reads no MP3; "
                         "install soundfile's wheel (libsndfile 1.1 or later bundled)")
    return soundfile


def compressed_playable() -> bool:
    """FLAC can be decoded here (what the media player asks Home Assistant for)."""
    try:
        import soundfile
    except (ImportError, OSError):
        return False
    return "FLAC" in soundfile.available_formats()


def _check_length(rate: int, frames: int, name: str, max_seconds: float | None,
                  max_samples: int | None) -> None:
    if max_seconds is not None and frames / rate > max_seconds:
        raise MediaError(f"{name}: the audio is {frames / rate:.1f} s long, the limit is "
                         f"{max_seconds:g} s (announcements.max_audio_s)")
    if max_samples is not None and frames > max_samples:
        raise MediaError(f"{name}: {frames} samples, more than the {max_samples} that media_max_bytes "
                         "allows (as 16-bit mono)")


def _early_check(name: str, declared: int | None, max_seconds: float | None,
                 max_samples: int | None) -> Callable[[bytearray], bool]:
    """A judge of a body still arriving: `MediaError` as soon as its header and length (the data
    size the header states, cut to the declared Content-Length) show audio too long; True once it
    has judged, False while the header is not all there or states no size (a stream)."""
    def judge(body: bytearray) -> bool:
        kind = audio_kind(body)
        if kind == "FLAC":
            return _judge_flac(body, name, max_seconds, max_samples)
        if kind == "MP3" or (kind == "" and len(body) >= 4):
            return True  # MP3 states no length it must keep: judged as it decodes
        try:
            header = read_wav_header(io.BytesIO(bytes(body[:HEADER_BYTES])), name, len(body))
        except AudioError:
            return len(body) >= HEADER_BYTES  # not all there yet, or not a WAV: decode_wav says
        size = header.data_bytes
        # A stream's unknown size (ffmpeg writing to a pipe states 0xFFFFFFFF, Home Assistant's
        # media proxy does that): counted so far, or still the placeholder while the body has
        # reached no further than the header.
        if size in (0, 0xFFFFFFFF) or size + header.data_offset == len(body):
            if declared is None:
                return False  # judged at the end
            size = declared - header.data_offset
        elif declared is not None:
            size = min(size, declared - header.data_offset)
        _check_length(header.rate, size // (header.channels * header.width), name, max_seconds, max_samples)
        return True
    return judge


def _judge_flac(body: bytes | bytearray, name: str, max_seconds: float | None,
                max_samples: int | None) -> bool:
    """A FLAC's STREAMINFO (the first metadata block, 34 bytes after `fLaC` and its 4-byte block
    header): its rate and total samples, when stated (0: unknown, judged as it decodes)."""
    if len(body) < 8 + 18:
        return False
    info = int.from_bytes(body[8 + 10:8 + 18], "big")  # rate 20 bits, channels 3, depth 5, samples 36
    rate, total = info >> 44, info & ((1 << 36) - 1)
    if rate > 0 and total > 0:
        _check_length(rate, total, name, max_seconds, max_samples)
    return True


def _header(data: bytes | bytearray, name: str) -> WavHeader:
    # Only the start is copied for the reader (a whole body copied would be held twice).
    try:
        return read_wav_header(io.BytesIO(data[:HEADER_BYTES]), name, len(data))
    except AudioError as exc:
        if audio_kind(data) == "":
            head = bytes(data[:8])
            raise MediaError(f"{name}: not WAV, FLAC or MP3 (it starts with {head!r})") from None
        raise MediaError(str(exc)) from None


class _Connection(http.client.HTTPConnection):
    transfer: Transfer

    def connect(self) -> None:
        super().connect()
        self.transfer.attach(self.sock)


class _SecureConnection(http.client.HTTPSConnection):
    transfer: Transfer

    def connect(self) -> None:
        super().connect()
        self.transfer.attach(self.sock)


class _Handler(urllib.request.HTTPHandler):
    """urllib's http handler, its connections handed to a `Transfer` (redirects still followed)."""

    def __init__(self, transfer: Transfer) -> None:
        super().__init__()
        self.transfer = transfer

    def http_open(self, req: urllib.request.Request) -> Any:
        transfer = self.transfer

        def connection(host: str, **kwargs: Any) -> _Connection:
            conn = _Connection(host, **kwargs)
            conn.transfer = transfer
            return conn

        return self.do_open(connection, req)


class _SecureHandler(urllib.request.HTTPSHandler):
    def __init__(self, transfer: Transfer) -> None:
        super().__init__()
        self.transfer = transfer

    def https_open(self, req: urllib.request.Request) -> Any:
        transfer = self.transfer

        def connection(host: str, **kwargs: Any) -> _SecureConnection:
            conn = _SecureConnection(host, **kwargs)
            conn.transfer = transfer
            return conn

        return self.do_open(connection, req, context=self._context)  # type: ignore[attr-defined]


def _short(url: str) -> str:
    """The URL without its query (Home Assistant's TTS URLs carry tokens)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
