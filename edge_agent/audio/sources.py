"""Where speech comes from: a microphone, a WAV file, raw PCM on a pipe, a FIFO or from a command.

Every source yields blocks of mono float32 samples at `TARGET_RATE` (16 kHz, what
the VAD and Whisper expect), whatever the rate and channel count it reads:
channels are averaged, or steered by the beamformer where
`audio.mic_geometry` says where the microphones are; rates converted with soxr. Bad input is an `AudioError`
raised when the source is opened whenever the header already shows it (not a WAV,
implausible rate, truncated), so nothing has been processed before it fails.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Protocol

import numpy as np

from edge_agent.audio.beamform import Mixer, make_mixer
from edge_agent.audio.command import AudioProcess, CommandNotStarted, split_command
from edge_agent.audio.frames import Samples
from edge_agent.audio.pace import Pace
from edge_agent.audio.rawcheck import PcmCheck
from edge_agent.audio.resample import StreamResampler
from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sinks import AudioUnavailable, import_sounddevice
from edge_agent.audio.wav import check_format, decode, open_wav
from edge_agent.errors import AudioError

log = logging.getLogger(__name__)

TARGET_RATE = 16000
"""Hertz of every block a source yields."""
POLL_S = 0.1
"""How often a read waiting on a pipe looks whether the source was closed."""
RESTART_S = (0.5, 10.0)
"""An input command that exits is started again after the first delay, doubling up to the second;
a run that lasted longer than the second starts the doubling over."""
STALL_S = 10.0
"""A recorder writes audio all the time (silence too): one silent this long is stuck, and restarted."""
MAX_INPUT_SPEED = 2.0
"""Times real time an input command or pipe is read at most. A live input runs at real time; one
that writes faster (a recorder gone wrong, a writer copying a file or garbage) waits its turn in
its pipe (`audio.pace.Pace`) instead of keeping a core busy (as it did unpaced)."""
PACE_BURST_S = 2.0
"""Seconds of audio an input may run ahead of its pace (what a recorder buffered while we were busy)."""
NOISE_WINDOWS = 3
"""Seconds of nothing but noise at full scale (`audio.rawcheck`) after which an input is taken for
garbage (the wrong format, a recorder gone wrong) and says so."""
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


class PcmConverter:
    """Raw PCM bytes of any plausible format -> mono float32 at `target_rate` (16 kHz unless told),
    carrying partial frames between pushes (files, pipes and network streams all arrive in
    arbitrary pieces)."""

    def __init__(self, rate: int, channels: int, width: int, name: str, encoding: str = "pcm", *,
                 target_rate: int = TARGET_RATE, mixer: Mixer | None = None) -> None:
        self.rate, self.channels, self.width, self.encoding = rate, channels, width, encoding
        self.mixer = mixer
        """Mixes the channels to mono (the beamformer); None averages them."""
        self._name = Path(name)
        self._resampler = StreamResampler(rate, target_rate)
        self._carry = b""
        self._skip = 0
        self.frames_in = 0

    def push(self, data: bytes) -> Samples:
        data = self._carry + data
        if self._skip:
            cut = min(self._skip, len(data))
            data, self._skip = data[cut:], self._skip - cut
        frame = self.channels * self.width
        usable = len(data) - len(data) % frame
        self._carry = data[usable:]
        if not usable:
            return _EMPTY
        self.frames_in += usable // frame
        if self.mixer is not None:
            interleaved = decode(data[:usable], self.encoding, self.width, 1, self._name)
            return self._resampler.push(self.mixer.process(interleaved.reshape(-1, self.channels)))
        mono = decode(data[:usable], self.encoding, self.width, self.channels, self._name)
        return self._resampler.push(mono)

    def finish(self) -> Samples:
        tail = self.mixer.flush() if self.mixer is not None else _EMPTY
        return self._resampler.push(tail, last=True)

    def drop_partial(self) -> None:
        """Forget the bytes of an incomplete frame: the writer that sent them has gone, and the
        next one starts a frame of its own."""
        self._carry = b""
        self._skip = 0

    def skip(self, count: int) -> None:
        """Drop the next `count` bytes: frames start that much later from here on."""
        self._skip += count

    @property
    def leftover(self) -> int:
        """Bytes of an incomplete final frame."""
        return len(self._carry)


def _converted(read: Callable[[], bytes], convert: PcmConverter, closed: Callable[[], bool],
               name: str) -> Iterator[Samples]:
    """Read, convert and yield until `read` returns nothing or the source is closed.

    A read that fails because `close()` pulled the input away ends the stream quietly;
    any other failure is an `AudioError` naming the input.
    """
    while not closed():
        try:
            data = read()
        except (OSError, ValueError) as exc:
            if closed():
                return
            raise AudioError(f"{name}: read failed ({exc})") from None
        if not data:
            break
        out = convert.push(data)
        if out.size:
            yield out


def _noise_problem(name: str, convert: PcmConverter) -> str:
    return (f"{name}: hears only noise at full scale (is it {convert.rate} Hz, "
            f"{8 * convert.width}-bit little-endian PCM?)")


def _keep_pace(pace: Pace, audio_s: float, stop: threading.Event) -> None:
    """Wait the turn of `audio_s` seconds of audio just read (less if `stop` is set meanwhile)."""
    delay = pace.wait_s(audio_s, time.monotonic())
    if delay > 0:
        stop.wait(delay)


class Stalled(AudioError):
    """A live input gave no bytes for longer than it may."""


def _fd_reader(fd: int, size: int, closed: Callable[[], bool],
               stall_s: float | None = None) -> Callable[[], bytes]:
    """Reads of up to `size` bytes from `fd` that give up (returning b"") once `closed()`: a read
    blocked on a quiet pipe would otherwise hold the pump past `close()`. Only the reading
    thread closes `fd`, after its last read, so the number is never read once reused. With
    `stall_s`, a read that waits longer raises `Stalled`."""
    def read() -> bytes:
        deadline = None if stall_s is None else time.monotonic() + stall_s
        while not closed():
            ready, _, _ = select.select([fd], [], [], POLL_S)
            if ready and not closed():
                try:
                    return os.read(fd, size)
                except BlockingIOError:  # a FIFO (non-blocking) that another reader emptied
                    continue
            if deadline is not None and time.monotonic() > deadline:
                raise Stalled(f"gave no audio for {stall_s:g} s")
        return b""
    return read


class WavFileSource:
    """A WAV file (8/16/24/32-bit integer or 32/64-bit float, any rate and channel count), in blocks."""

    live = False
    sample_rate = TARGET_RATE

    def __init__(self, path: Path, block_s: float = 0.5, *, mic_geometry: str | None = None,
                 beamformer: str = "superdirective") -> None:
        self.path = path
        self._fh, header = open_wav(path)
        self.frames = header.frames
        if self.frames == 0:
            self._fh.close()
            raise AudioError(f"{path}: contains no audio")
        frame = header.channels * header.width
        self.header = header
        self.rate, self.channels = header.rate, header.channels
        self.duration_s = self.frames / self.rate
        self._block_bytes = max(1, round(block_s * self.rate)) * frame
        self.mixer = make_mixer(mic_geometry, self.channels, self.rate, beamformer)
        self._convert = PcmConverter(self.rate, self.channels, header.width, str(path), header.encoding,
                                     mixer=self.mixer)
        self._closed = False

    def blocks(self) -> Iterator[Samples]:
        left = self.frames * self.header.channels * self.header.width

        def read() -> bytes:
            nonlocal left
            data = self._fh.read(min(self._block_bytes, left)) if left > 0 else b""
            left -= len(data)
            return data

        yield from _converted(read, self._convert, lambda: self._closed, str(self.path))
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
        yield from _converted(lambda: read(self._block_bytes), self._convert, lambda: self._closed, self.name)
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
    """Raw PCM on standard input, refused where it plainly is not (a terminal, a WAV file).

    Raw PCM carries no format, so what it is taken for is said in each refusal: `rate` Hz,
    `channels` channels, `width` bytes a sample (16 kHz mono 16-bit unless told otherwise).
    """
    taken_for = f"raw {8 * width}-bit little-endian PCM at {rate} Hz, {channels} channel(s)"
    if os.isatty(0):
        raise AudioError(f"'-' reads {taken_for} from standard input, which is a terminal: pipe audio "
                         "in (e.g. `arecord -t raw -f S16_LE -r 16000 -c 1 | ...`) or give a WAV file")
    try:
        head = os.pread(0, 4, 0)  # a regular file (`< x.wav`) can be looked at without reading it
    except OSError:  # a pipe: nothing to look at before reading
        head = b""
    if head == b"RIFF":
        raise AudioError(f"standard input holds a WAV file, but '-' reads {taken_for}: "
                         "give the file's path instead of '-'")
    return PcmStreamSource(os.fdopen(os.dup(0), "rb", buffering=0), rate, channels, width)


class PipeSource:
    """Raw PCM as it arrives on a FIFO, or on standard input (`-`), for scripts and tests that
    feed a running daemon a live stream.

    The FIFO is created (mode 0600) when missing and opened for reading without waiting for a
    writer. Writers may come and go: when the last one closes, the pipe is opened again (the new
    reader first, so a writer never finds none) and the stream goes on. Standard input ends the
    stream at its end. A writer that leaves in the middle of a sample (half of an s16 sample)
    has that part dropped, with a warning: kept, it would shift every later writer's samples
    by a byte, and the device would hear noise for good.

    The pipe itself is held by this process (`HeldPipe`) from the first source on it until
    `release_pipes`: closing the source (a mute, a restart of the hearing loop) only stops
    hearing it, and what arrives meanwhile is read and discarded. A writer such as
    `arecord > fifo` therefore never loses its reader and lives through a mute, and the
    source opened on unmute hears the audio of now, not a pipe's worth of the past. Reading
    and draining both keep to `MAX_INPUT_SPEED` times real time.

    What is heard is judged second by second (`audio.rawcheck.PcmCheck`, 16-bit input): a stream
    a byte out of step for `STEP_WINDOWS` seconds has a byte skipped, and noise at full scale for
    `NOISE_WINDOWS` seconds is taken for garbage (the wrong format, a writer gone wrong); either
    is logged and told to `on_trouble` (a line for the device status), and None once the stream
    sounds like audio again.
    """

    STEP_WINDOWS = 2

    live = True
    sample_rate = TARGET_RATE

    def __init__(self, where: str, rate: int = TARGET_RATE, channels: int = 1, width: int = 2, *,
                 block_s: float = 0.03, name: str = "audio.input_pipe",
                 mic_geometry: str | None = None, beamformer: str = "superdirective") -> None:
        check_format(rate, channels, width, name)
        self.name = f"{name} ({where})"
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._reading = False
        self._frame = channels * width
        self._block_bytes = max(1, round(block_s * rate)) * self._frame
        self.mixer = make_mixer(mic_geometry, channels, rate, beamformer)
        self._convert = PcmConverter(rate, channels, width, self.name, mixer=self.mixer)
        self._check = PcmCheck(rate * self._frame, width, channels)
        self._verdict, self._verdicts, self._troubled = "ok", 0, False
        self.on_trouble: Callable[[str | None], None] | None = None
        self.realigned = 0
        """Times a byte was skipped because the stream was out of step."""
        self._pipe: HeldPipe | None = HeldPipe.take(where, self.name, self._frame, rate * self._frame)

    def blocks(self) -> Iterator[Samples]:
        with self._lock:
            pipe = self._pipe
            if pipe is None or self._closed.is_set():
                return
            self._reading = True
        try:
            read = pipe.reader(self._block_bytes, self._closed, self._writer_left)

            def judged() -> bytes:
                data = read()
                verdict = self._check.push(data) if data else None
                if verdict is not None:
                    self._judge(verdict, pipe)
                return data

            yield from _converted(judged, self._convert, self._closed.is_set, self.name)
            if not self._closed.is_set():
                tail = self._convert.finish()
                if tail.size:
                    yield tail
        finally:
            with self._lock:
                self._reading = False
                self._let_go()

    def _writer_left(self) -> None:
        self._convert.drop_partial()
        self._check.restart()

    def _judge(self, verdict: str, pipe: HeldPipe) -> None:
        self._verdicts = self._verdicts + 1 if verdict == self._verdict else 1
        self._verdict = verdict
        if verdict == "ok":
            if self._troubled:
                self._troubled = False
                log.info("%s: audio again", self.name)
                if self.on_trouble is not None:
                    self.on_trouble(None)
        elif verdict == "out of step" and self._verdicts >= self.STEP_WINDOWS:
            self._convert.skip(1)
            pipe.offset -= 1  # so that a later source starts in step too
            self._check.restart(skip=1)
            self._verdicts = 0
            self.realigned += 1
            self._trouble(f"{self.name}: the stream was a byte out of step (half a sample written?); "
                          "skipped a byte")
        elif verdict == "noise" and self._verdicts == NOISE_WINDOWS:
            self._trouble(_noise_problem(self.name, self._convert))

    def _trouble(self, problem: str) -> None:
        log.warning("%s", problem)
        self._troubled = True
        if self.on_trouble is not None:
            self.on_trouble(problem)

    def close(self) -> None:
        """Stop reading; the reader (if one is reading) lets go of the pipe within `POLL_S`."""
        with self._lock:
            self._closed.set()
            if not self._reading:
                self._let_go()

    def _let_go(self) -> None:
        if self._pipe is not None:
            self._pipe.give_back()
            self._pipe = None


class HeldPipe:
    """A FIFO or standard input that this process keeps open while it runs, so that its writer
    always has a reader: one `PipeSource` at a time reads it (`take` ... `give_back`); between
    them a drain thread reads and discards what arrives.

    Only the thread that reads (a source's reader, or the drain thread, handed over under the
    registry's lock) touches the descriptor (reopened in place with `dup2` when the writers
    leave), and it is closed only when no one reads, so its number is never read once reused.
    `offset` counts every byte read (less a departed writer's partial frame), so the next
    reader starts on a frame boundary whatever the drain thread's reads cut.
    """

    _held: ClassVar[dict[str, HeldPipe]] = {}
    """Path (`-`: standard input) -> the pipe held open for it."""
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, key: str, fd: int, name: str, frame: int, bytes_per_s: int) -> None:
        self.key = key
        self.name = name
        self.fd: int | None = fd
        self.frame = frame
        self.bytes_per_s = bytes_per_s
        self.pace = Pace(MAX_INPUT_SPEED, PACE_BURST_S, time.monotonic())
        """One pace for the sources and the drain thread: a mute is no way around it."""
        self.partials_dropped = 0
        """Writers that left in the middle of a frame."""
        self.offset = 0
        """Bytes read from the pipe so far, by the sources and the drain thread."""
        self.drained = 0
        """Bytes the drain thread discarded (nobody was hearing)."""
        self.taken = False
        self._released = False
        self._drainer: threading.Thread | None = None
        self._stop_draining = threading.Event()

    @classmethod
    def take(cls, where: str, name: str, frame: int, bytes_per_s: int) -> HeldPipe:
        """The pipe `where` for one source to read (`frame` bytes a frame, `bytes_per_s` at real
        time): opened (a FIFO made) the first time, else the one held since, once its drain thread
        has stopped."""
        key = "-" if where == "-" else os.path.abspath(where)
        with cls._lock:
            pipe = cls._held.get(key)
            if pipe is not None and pipe.taken:
                raise AudioUnavailable(f"{name}: already read by another source")
            if pipe is not None and key != "-" and not pipe._same_fifo():
                pipe._stop_drain()  # the FIFO was removed (and perhaps made again): open the new one
                pipe._close()
                pipe = None
            if pipe is None:
                fd = os.dup(0) if key == "-" else _open_fifo(Path(key), name)
                pipe = cls._held[key] = HeldPipe(key, fd, name, frame, bytes_per_s)
            pipe._stop_drain()
            pipe.frame, pipe.bytes_per_s = frame, bytes_per_s
            pipe.taken = True
            return pipe

    def reader(self, size: int, stop: threading.Event,
               writer_left: Callable[[], None] = lambda: None) -> Callable[[], bytes]:
        """Reads for the thread that reads the pipe now (the source that took it, or the drain
        thread), from the next frame boundary on and at most `MAX_INPUT_SPEED` times real time;
        b"" at the end of standard input, or once `stop` is set. When a FIFO's writers have all
        left, `writer_left` is called (after a partial frame of theirs was dropped)."""
        fd = self.fd
        if fd is None:
            return lambda: b""
        read = _fd_reader(fd, size, stop.is_set)
        skip = -self.offset % self.frame

        def aligned() -> bytes:
            nonlocal skip
            while True:
                data = read()
                if not data:
                    if stop.is_set() or self.key == "-":
                        return data
                    self._writers_left(fd, stop)
                    writer_left()
                    skip = 0
                    continue
                self.offset += len(data)
                _keep_pace(self.pace, len(data) / self.bytes_per_s, stop)
                if skip:
                    data, skip = data[skip:], max(0, skip - len(data))
                if data:
                    return data
        return aligned

    def _writers_left(self, fd: int, stop: threading.Event) -> None:
        """No writer has the FIFO open any more: drop a partial frame, and open the FIFO again
        (a reader that has seen its writers go is woken for ever after, Linux's POLLHUP)."""
        partial = self.offset % self.frame
        if partial:
            self.offset -= partial
            self.partials_dropped += 1
            log.warning("%s: a writer left in the middle of a sample; dropped its %d byte(s) so that "
                        "the next writer is heard in step", self.name, partial)
        try:
            fresh = _open_fifo(Path(self.key), self.name)
        except AudioUnavailable as exc:
            log.warning("%s: cannot open the FIFO again (%s); trying again", self.name, exc)
            stop.wait(POLL_S)  # the old reader wakes at once: do not spin
            return
        os.dup2(fresh, fd, inheritable=False)  # the new reader is in place before the old one goes
        os.close(fresh)

    def give_back(self) -> None:
        """The source is done reading: drain until the next one takes the pipe (or let go of it
        after `release_pipes`)."""
        with HeldPipe._lock:
            self.taken = False
            if self._released or self.fd is None:
                self._close()
                return
            self._stop_draining.clear()
            self._drainer = threading.Thread(target=self._drain, name=f"drain {self.name}", daemon=True)
            self._drainer.start()

    def _drain(self) -> None:
        read = self.reader(65536, self._stop_draining)
        try:
            while data := read():
                self.drained += len(data)
        except OSError as exc:
            log.warning("%s: draining stopped (%s)", self.name, exc.strerror or exc)

    def _stop_drain(self) -> None:
        drainer, self._drainer = self._drainer, None
        if drainer is not None:
            self._stop_draining.set()
            drainer.join()

    def _same_fifo(self) -> bool:
        if self.fd is None:
            return False
        try:
            held, now = os.fstat(self.fd), os.stat(self.key)
        except OSError:
            return False
        return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)

    def _close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if HeldPipe._held.get(self.key) is self:
            del HeldPipe._held[self.key]

    @classmethod
    def release_all(cls) -> None:
        """Let go of every held pipe: at once where nobody reads, else when its source is done."""
        with cls._lock:
            for pipe in list(cls._held.values()):
                pipe._released = True
                if not pipe.taken:
                    pipe._stop_drain()
                    pipe._close()


def release_pipes() -> None:
    """Close the FIFOs (and standard input) held for `PipeSource`s: the daemon's shutdown."""
    HeldPipe.release_all()


def _open_fifo(path: Path, name: str) -> int:
    try:
        if not path.exists():
            os.mkfifo(path, 0o600)
            log.info("%s: created the FIFO", name)
        # Non-blocking: the open does not wait for a writer (reads wait in select).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise AudioUnavailable(f"{name}: cannot open ({exc.strerror or exc})") from None
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        raise AudioUnavailable(f"{name}: not a FIFO (make one with mkfifo, or let the agent create it)")
    return fd


class CommandSource:
    """Raw PCM from a command's standard output (`arecord`, `parecord`, `pw-record`).

    The command is started at once, so one that cannot run at all fails here with
    `AudioUnavailable`. One that exits later (a device unplugged, a sound server
    restarting) or stops writing (`STALL_S`) is started again with backoff (`RESTART_S`); one
    that writes faster than real time is read at `MAX_INPUT_SPEED` times real time, and one that
    writes nothing but noise at full scale for `NOISE_WINDOWS` s is a trouble too. `on_trouble`
    hears why (a line for the device status) and, with None, when audio flows again. Its stderr
    is logged at debug. The reading thread owns the process once it reads: `close`
    only says stop, and the reader stops the command within `POLL_S`.
    """

    live = True
    sample_rate = TARGET_RATE

    def __init__(self, command: str, rate: int = TARGET_RATE, channels: int = 1, width: int = 2, *,
                 block_s: float = 0.03, restart_s: tuple[float, float] = RESTART_S,
                 stall_s: float = STALL_S, name: str = "audio.input_command",
                 mic_geometry: str | None = None, beamformer: str = "superdirective") -> None:
        check_format(rate, channels, width, name)
        self.mixer = make_mixer(mic_geometry, channels, rate, beamformer)
        """One beamformer for every run: it keeps its steering across a restart."""
        self.name = name
        self.argv = split_command(command, name)
        self.format = (rate, channels, width)
        self.restart_s = restart_s
        self.stall_s = stall_s
        self.starts = 0
        """How often the command has been started."""
        self.on_trouble: Callable[[str | None], None] | None = None
        self._block_bytes = max(1, round(block_s * rate)) * channels * width
        self._bytes_per_s = rate * channels * width
        self._pace = Pace(MAX_INPUT_SPEED, PACE_BURST_S, time.monotonic())
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._reading = False
        self._troubled = False
        self._noise_s = 0
        """Seconds in a row of nothing but noise at full scale."""
        self._proc: AudioProcess | None = self._start()

    def _start(self) -> AudioProcess:
        try:
            proc = AudioProcess(self.argv, self.name, reads=True)
        except CommandNotStarted as exc:
            raise AudioUnavailable(str(exc)) from None
        self.starts += 1
        return proc

    def blocks(self) -> Iterator[Samples]:
        with self._lock:
            if self._closed.is_set():
                return
            self._reading = True
        try:
            yield from self._runs()
        finally:
            with self._lock:
                self._reading = False
                proc, self._proc = self._proc, None
            if proc is not None:
                proc.stop()

    def _runs(self) -> Iterator[Samples]:
        delay, problem = self.restart_s[0], ""
        while not self._closed.is_set():
            proc = self._proc
            if proc is not None:
                started = time.monotonic()
                try:
                    yield from self._run(proc)
                    stalled = ""
                except Stalled as exc:
                    stalled = f"{self.name} {exc}"
                if self._closed.is_set():
                    return
                self._proc = None
                code = proc.stop()
                problem = stalled or proc.describe_exit(code)
                if time.monotonic() - started > self.restart_s[1]:
                    delay = self.restart_s[0]  # it had been working: not the same failure again
            self._report(f"{problem}; starting it again in {delay:g} s")
            if self._closed.wait(delay):
                return
            delay = min(delay * 2, self.restart_s[1])
            try:
                self._proc = self._start()
            except AudioUnavailable as exc:
                problem = str(exc)

    def _run(self, proc: AudioProcess) -> Iterator[Samples]:
        """Its audio until it closes its output (or the source is closed)."""
        rate, channels, width = self.format
        convert = PcmConverter(rate, channels, width, self.name,  # a dead run's partial frame goes with it
                               mixer=self.mixer)
        fd_read = _fd_reader(proc.stdout_fd, self._block_bytes, self._closed.is_set, self.stall_s)
        check = PcmCheck(self._bytes_per_s, width, channels)

        def read() -> bytes:
            data = fd_read()
            _keep_pace(self._pace, len(data) / self._bytes_per_s, self._closed)
            verdict = check.push(data) if data else None
            if verdict is not None:
                self._noise_s = self._noise_s + 1 if verdict == "noise" else 0
                if self._noise_s == NOISE_WINDOWS:
                    self._report(_noise_problem(self.name, convert))
            return data

        for block in _converted(read, convert, self._closed.is_set, self.name):
            if self._troubled and self._noise_s < NOISE_WINDOWS:
                self._troubled = False
                log.info("%s: audio again", self.name)
                if self.on_trouble is not None:
                    self.on_trouble(None)
            yield block
        tail = convert.finish()  # the run's last samples, still in the resampler
        if tail.size and not self._closed.is_set():
            yield tail

    def _report(self, problem: str) -> None:
        log.warning("%s", problem)
        self._troubled = True
        if self.on_trouble is not None:
            self.on_trouble(problem)

    def close(self) -> None:
        """Stop: at once when nothing reads; else the command is told to stop now (a mute must not
        wait for the reader's current block) and the reader reaps it within `POLL_S`."""
        with self._lock:
            self._closed.set()
            proc = None if self._reading else self._proc
            if proc is not None:
                self._proc = None
            reading = self._proc if self._reading else None
        if proc is not None:
            proc.stop()
        elif reading is not None:
            reading.interrupt()


def open_source(audio: AudioSettings) -> AudioSource:
    """The configured input: `input_command`, `input_pipe`, `input_file`, else the microphone."""
    fmt = (audio.input_rate, audio.input_channels, audio.input_width)
    geometry, method = audio.mic_geometry, audio.beamformer
    if audio.input_command:
        return CommandSource(audio.input_command, *fmt, mic_geometry=geometry, beamformer=method)
    if audio.input_pipe:
        return PipeSource(audio.input_pipe, *fmt, mic_geometry=geometry, beamformer=method)
    if audio.input_file is not None:
        return WavFileSource(audio.input_file, mic_geometry=geometry, beamformer=method)
    return SoundDeviceSource(audio.input_device, channels=audio.input_channels, mic_geometry=geometry,
                             beamformer=method)


class SoundDeviceSource:
    """A microphone through PortAudio, resampled to 16 kHz when the card runs at another rate.

    With `channels` > 1 (a 2- or 4-microphone board) every channel is captured and goes through the
    same `PcmConverter` as a pipe's or a file's: averaged, or steered by the beamformer where a
    geometry is set (with its fallback to the best channel).

    The PortAudio callback only copies blocks into a bounded queue; when the
    consumer falls behind by more than `queue_s` seconds the oldest audio is
    dropped (and counted in `overflows`) rather than stalling the sound card.
    """

    live = True
    sample_rate = TARGET_RATE

    def __init__(self, device: str | None = None, block_s: float = 0.03, queue_s: float = 10.0, *,
                 channels: int = 1, mic_geometry: str | None = None, beamformer: str = "superdirective",
                 ) -> None:
        sd = import_sounddevice()
        self.overflows = 0
        self._closed = threading.Event()
        dev: int | str | None = int(device) if device and device.isdigit() else device
        try:
            info = sd.query_devices(dev, "input")
            if int(info.get("max_input_channels", channels)) < channels:
                raise AudioUnavailable(f"no usable microphone ({info.get('name', device)} has "
                                       f"{info.get('max_input_channels')} input channels, "
                                       f"audio.input_channels asks for {channels})")
            rate = TARGET_RATE
            try:
                sd.check_input_settings(device=dev, samplerate=rate, channels=channels, dtype="int16")
            except Exception:  # the card cannot capture at 16 kHz: capture at its own rate
                rate = int(info["default_samplerate"])
            self._rate = rate
            blocksize = max(1, round(block_s * rate))
            self._queue: queue.Queue[bytes] = queue.Queue(maxsize=max(1, round(queue_s / block_s)))
            self._stream = sd.RawInputStream(samplerate=rate, channels=channels, dtype="int16", device=dev,
                                             blocksize=blocksize, callback=self._callback)
            self._stream.start()
        except sd.PortAudioError as exc:
            raise AudioUnavailable(f"no usable microphone ({_first_line(exc)})") from None
        except ValueError as exc:  # no such device, or no input device at all
            raise AudioUnavailable(f"no usable microphone ({exc})") from None
        self.device_name = str(info.get("name", device))
        self.channels = channels
        self.mixer = make_mixer(mic_geometry, channels, rate, beamformer)
        self._convert = PcmConverter(rate, channels, 2, self.device_name, mixer=self.mixer)
        log.info("listening on %s at %d Hz, %d channel(s)", self.device_name, rate, channels)

    def _callback(self, indata: Any, frames: int, time_info: Any, status: Any) -> None:
        block = bytes(indata)
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
            out = self._convert.push(block)
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
