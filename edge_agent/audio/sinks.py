"""Where speech goes: the sound card, a command (`aplay`, `paplay`, `pw-play`), a WAV file, or nowhere.

`AudioOutput.open` picks the configured sink and, when the sound card or the
command cannot be opened (no PortAudio, no device, no such program), says so once
and uses the configured fallback.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import signal
import struct
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

import numpy as np

from edge_agent.audio.command import AudioProcess, CommandNotStarted, split_command
from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import StreamResampler
from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.wav import WavWriter, encode_pcm
from edge_agent.errors import AudioError

log = logging.getLogger(__name__)


class AudioUnavailable(AudioError):
    """The sound card cannot be used (no PortAudio library, no device, device busy)."""


class Sink(Protocol):
    """An open audio output for one stream of mono float32 samples."""

    sample_rate: int
    frames: int

    def write(self, samples: Samples) -> None: ...

    def close(self) -> None:
        """Finish: drain the device or move the file into place."""
        ...

    def abort(self) -> None:
        """Stop now and discard what is not yet out."""
        ...


class NullSink:
    """Discards audio, counting frames."""

    def __init__(self, sample_rate: int, reason: str = "audio.output is null") -> None:
        self.sample_rate = sample_rate
        self.frames = 0
        self.reason = reason
        """Why nothing is heard: the configuration, or the output that could not be opened."""

    def write(self, samples: Samples) -> None:
        self.frames += len(samples)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class WavSink:
    """Writes a WAV file atomically (nothing appears at `path` unless the stream finishes)."""

    def __init__(self, path: Path, sample_rate: int, volume: float = 1.0) -> None:
        self.path = path
        self.sample_rate = sample_rate
        self._volume = np.float32(volume)
        self._writer = WavWriter(path, sample_rate)
        self.frames = 0

    def write(self, samples: Samples) -> None:
        self._writer.write(samples * self._volume if self._volume != 1.0 else samples)
        self.frames += len(samples)

    def close(self) -> None:
        self._writer.close()

    def abort(self) -> None:
        self._writer.abort()


class SoundDeviceSink:
    """Plays through PortAudio, resampling when the device refuses the voice's rate."""

    def __init__(self, sample_rate: int, device: str | None = None, volume: float = 1.0) -> None:
        try:
            sd = import_sounddevice()
        except AudioUnavailable as exc:
            raise AudioUnavailable(f"no sound output: {exc}") from None
        self.sample_rate = sample_rate
        self.frames = 0
        self._volume = np.float32(volume)
        dev: int | str | None = int(device) if device and device.isdigit() else device
        try:
            self._stream, self._resampler = self._open(sd, dev, sample_rate)
        except (sd.PortAudioError, ValueError) as exc:  # ValueError: an unknown device name
            # PortAudio's own words ("Error querying device -1") name no cause a user can fix.
            log.debug("PortAudio cannot open output %r: %s", device, _pa_message(exc))
            if device is None:
                raise AudioUnavailable(f"no sound output: PortAudio finds no sound card; connect one, "
                                       f"or {OUTPUT_NEXT_STEP}") from None
            raise AudioUnavailable(f"no sound output: audio.output_device {device!r} cannot be opened "
                                   f"({_pa_message(exc)}); `python3 -m sounddevice` lists the devices, "
                                   f"or {OUTPUT_NEXT_STEP}") from None

    @staticmethod
    def _open(sd: Any, device: int | str | None, rate: int) -> tuple[Any, StreamResampler]:
        try:
            stream = sd.OutputStream(samplerate=rate, channels=1, dtype="float32", device=device)
            resampler = StreamResampler(rate, rate)
        except sd.PortAudioError as exc:
            if "sample rate" not in str(exc).lower():
                raise
            # Cards that only run at 44.1/48 kHz: resample here rather than crackle there.
            info = sd.query_devices(device, "output")
            device_rate = int(info["default_samplerate"])
            stream = sd.OutputStream(samplerate=device_rate, channels=1, dtype="float32",
                                     device=device)
            resampler = StreamResampler(rate, device_rate)
            log.info("sound card runs at %d Hz; resampling from %d Hz", device_rate, rate)
        stream.start()
        return stream, resampler

    def write(self, samples: Samples) -> None:
        out = self._resampler.push(samples * self._volume)
        if out.size:
            self._stream.write(np.ascontiguousarray(out.reshape(-1, 1)))
        self.frames += len(samples)

    def close(self) -> None:
        tail = self._resampler.push(np.zeros(0, dtype=np.float32), last=True)
        if tail.size:
            self._stream.write(np.ascontiguousarray(tail.reshape(-1, 1)))
        self._stream.stop()
        self._stream.close()

    def abort(self) -> None:
        self._stream.abort()
        self._stream.close()


OUTPUT_NEXT_STEP = ("set audio.output_command to play through a program "
                    "(e.g. 'aplay -r 22050 -c 1 -f S16_LE -t raw')")
"""The way round a missing or unusable sound card, named in every error about one."""

WRITE_STALL_S = 10.0
"""An output command that takes no audio for this long is taken for hung."""
DRAIN_S = 30.0
"""How long an output command may take to play what it still holds after the last sample."""
POLL_S = 0.05
"""How often a command's pipe is looked at while it plays out what the pipe still holds."""


class CommandSink:
    """Plays through a command (one run per stream) that reads raw PCM on its standard input.

    Speech is resampled to the command's rate and written in its sample format; a slow
    player back-pressures synthesis (the pipe fills), a player that stops reading for
    `WRITE_STALL_S` or exits is an `AudioError` with its exit status and stderr, and is
    stopped with everything it started (its process group).
    """

    def __init__(self, command: str, sample_rate: int, *, rate: int = 22050, width: int = 2,
                 channels: int = 1, volume: float = 1.0, name: str = "audio.output_command") -> None:
        self.sample_rate = sample_rate
        self.frames = 0
        self.name = name
        self._format = (width, channels)
        self._volume = np.float32(volume)
        self._resampler = StreamResampler(sample_rate, rate)
        try:
            self._proc = AudioProcess(split_command(command, name), name, reads=False)
        except CommandNotStarted as exc:
            raise AudioUnavailable(str(exc)) from None
        self._fd = self._proc.stdin.fileno()
        os.set_blocking(self._fd, False)

    def write(self, samples: Samples) -> None:
        self._send(self._resampler.push(samples * self._volume if self._volume != 1.0 else samples))
        self.frames += len(samples)

    def _send(self, samples: Samples) -> None:
        """Write it all, or stop the command once it has taken nothing for `WRITE_STALL_S`.

        The pipe is non-blocking: one blocking write of a whole sentence would wait as long as
        the command does not read (for ever, for a hung player), where no deadline can act.
        """
        view = memoryview(encode_pcm(samples, *self._format))
        deadline = time.monotonic() + WRITE_STALL_S
        while view:
            try:
                sent = os.write(self._fd, view)
            except BlockingIOError:
                sent = 0
            except OSError as exc:  # EPIPE: it exited
                self._exited(exc)
            if sent:
                view = view[sent:]
                deadline = time.monotonic() + WRITE_STALL_S
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self._fd], [], left)[1]:
                self._stalled()

    def _drain(self) -> None:
        """Wait until the command has read what the pipe holds, as long as it keeps reading.

        Up to a pipe's worth of audio (64 KiB: 1.5 s at 22.05 kHz) fits without blocking a write:
        a command that never reads would otherwise be found out only `DRAIN_S` after the end.
        Nothing signals "the pipe is empty" to the writing end, so this looks every `POLL_S`.
        """
        unread, deadline = _unread(self._fd), time.monotonic() + WRITE_STALL_S
        while unread:
            if self._proc.wait(POLL_S) is not None:
                return  # it exited: its status says how (close)
            now_unread = _unread(self._fd)
            if now_unread < unread:
                deadline = time.monotonic() + WRITE_STALL_S
            elif time.monotonic() > deadline:
                self._stalled()
            unread = now_unread

    def _stalled(self) -> NoReturn:
        self.abort()
        raise AudioError(f"{self.name} took no audio for {WRITE_STALL_S:g} s; stopped it")

    def _exited(self, exc: OSError) -> NoReturn:
        code = self._proc.wait(1.0)
        self.abort()
        why = self._proc.describe_exit(code) if code is not None else f"{self.name}: {exc}"
        raise AudioError(f"{why} (while playing)") from None

    def close(self) -> None:
        """Send the rest, close its input and wait for it to play out."""
        self._send(self._resampler.push(np.zeros(0, dtype=np.float32), last=True))
        self._drain()
        self._proc.stdin.close()
        code = self._proc.wait(DRAIN_S)
        if code is None:
            self.abort()
            raise AudioError(f"{self.name} still playing {DRAIN_S:g} s after the end; stopped it")
        self._proc.stop()  # reaped; and anything it started is not left playing
        if code != 0:
            raise AudioError(self._proc.describe_exit(code))

    def abort(self) -> None:
        self._proc.stop()


def _unread(fd: int) -> int:
    """Bytes written to the pipe `fd` and not yet read from its other end."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]  # type: ignore[no-any-return]


def import_sounddevice() -> Any:
    """Import sounddevice, turning a missing PortAudio into `AudioUnavailable`."""
    # Initialising PortAudio (at import) blocks SIGPIPE in this thread, and every thread and
    # child started from it afterwards inherits that: a recorder behind our FIFO would get
    # EPIPE instead of dying with its reader. Python ignores SIGPIPE anyway, so the mask
    # protects nothing here: put it back, for the children of every thread, ours or not.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        import sounddevice
    except OSError:
        raise AudioUnavailable("PortAudio is not installed: install it (sudo apt install libportaudio2), "
                               "or use programs instead of the sound card (audio.output_command, "
                               "audio.input_command)") from None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return sounddevice


def _pa_message(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class AudioOutput:
    """Opens sinks as configured and remembers whether it already reported a fallback."""

    def __init__(self, settings: AudioSettings, heard: Callable[[Sink], Sink] | None = None) -> None:
        self.settings = settings
        self.heard = heard
        """Wraps each sink that reaches a loudspeaker (`audio.reference.ReferenceSink`: the echo
        canceller's reference); files and null are heard by nobody."""
        self._reported = False

    def open(self, sample_rate: int, name: str = "speech") -> Sink:
        s = self.settings
        if s.output_command is None and s.output == "null":
            return NullSink(sample_rate, "audio.output is null")
        if s.output_command is None and s.output == "wav":
            return self._wav(sample_rate, name)
        try:
            if s.output_command is not None:
                return self._heard(CommandSink(s.output_command, sample_rate, rate=s.output_rate,
                                               width=s.output_width, channels=s.output_channels,
                                               volume=s.volume))
            return self._heard(SoundDeviceSink(sample_rate, s.output_device, s.volume))
        except AudioUnavailable as exc:
            if s.fallback == "error":
                raise
            if not self._reported:
                where = f"WAV files in {s.fallback_dir}" if s.fallback == "wav" else "no output"
                log.warning("%s; falling back to %s", exc, where)
                self._reported = True
            if s.fallback == "wav":
                return self._wav(sample_rate, name)
            return NullSink(sample_rate, str(exc))

    def _heard(self, sink: Sink) -> Sink:
        return sink if self.heard is None else self.heard(sink)

    def _wav(self, sample_rate: int, name: str) -> WavSink:
        directory = self.settings.fallback_dir
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AudioError(f"cannot create {directory}: {exc.strerror}") from None
        stamp = time.strftime("%Y%m%dT%H%M%S")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
        return WavSink(directory / f"{stamp}-{safe}.wav", sample_rate, self.settings.volume)
