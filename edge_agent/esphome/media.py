"""Audio Home Assistant hands over as a URL (a TTS answer, an announcement, media to play).

Fetched with a bound on bytes and on the whole transfer's time, then decoded. Only WAV
is taken: the device's media player tells Home Assistant it plays WAV (`FORMATS`), so
Home Assistant's TTS and its ffmpeg proxy convert to that and no compressed-audio
decoder is needed on the device. Anything else is refused with a `MediaError` saying
what came.

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
  before a sample is decoded.
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


class MediaError(EdgeError):
    """A URL that cannot be played: not http(s), too large, too slow, not WAV, or the device busy."""


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

    def release(self) -> None:
        """The fetch is over and its audio handed on: its bytes and its place are free again."""
        if not self._released:
            self._released = True
            held, self.held = self.held, 0
            self.budget.give(held, ended=True, kept=self.kept)


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


def fetch_wav(url: str, *, max_bytes: int, timeout_s: float, max_seconds: float | None = None,
              reservation: Reservation | None = None, transfer: Transfer | None = None) -> Fetched:
    """The WAV at `url`, mixed down to mono (blocking: call it from a worker thread).

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
    fetched = decode_wav(body, name, max_seconds=max_seconds, max_samples=max_samples(max_bytes),
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
        """Bytes taken ahead for the samples (`prepay`), which `decode_wav` counts as its own."""

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


def decode_wav(data: bytes | bytearray, name: str, *, max_seconds: float | None = None,
               max_samples: int | None = None, reservation: Reservation | None = None,
               prepaid: int = 0) -> Fetched:
    """WAV bytes (a streamed file's unknown data size included) to mono samples, refused from the
    header when longer than `max_seconds` or more than `max_samples`, and counted in `reservation`
    before a sample is decoded (`prepaid`: bytes the reservation already holds for them)."""
    header = _header(data, name)
    frame = header.channels * header.width
    frames = min(header.data_bytes, len(data) - header.data_offset) // frame
    _check_length(header, frames, name, max_seconds, max_samples)
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


def _check_length(header: WavHeader, frames: int, name: str, max_seconds: float | None,
                  max_samples: int | None) -> None:
    if max_seconds is not None and frames / header.rate > max_seconds:
        raise MediaError(f"{name}: the audio is {frames / header.rate:.1f} s long, the limit is "
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
        try:
            header = read_wav_header(io.BytesIO(bytes(body[:HEADER_BYTES])), name, len(body))
        except AudioError:
            return len(body) >= HEADER_BYTES  # not all there yet, or not a WAV: decode_wav says
        size = header.data_bytes
        if size + header.data_offset == len(body):  # a stream's unknown size, counted so far
            if declared is None:
                return False  # judged at the end
            size = declared - header.data_offset
        elif declared is not None:
            size = min(size, declared - header.data_offset)
        _check_length(header, size // (header.channels * header.width), name, max_seconds, max_samples)
        return True
    return judge


def _header(data: bytes | bytearray, name: str) -> WavHeader:
    # Only the start is copied for the reader (a whole body copied would be held twice).
    try:
        return read_wav_header(io.BytesIO(data[:HEADER_BYTES]), name, len(data))
    except AudioError as exc:
        kind = data[:4]
        if kind[:3] == b"ID3" or kind[:2] in (b"\xff\xfb", b"\xff\xf3") or kind == b"fLaC":
            raise MediaError(f"{name}: compressed audio ({'FLAC' if kind == b'fLaC' else 'MP3'}); "
                             "this device plays WAV only") from None
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
