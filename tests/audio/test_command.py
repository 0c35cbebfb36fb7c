"""Audio through real commands: raw PCM from a recorder's stdout, to a player's stdin."""

from __future__ import annotations

import logging
import os
import shlex
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_agent.audio.sinks import AudioOutput, AudioUnavailable, CommandSink, NullSink
from edge_agent.audio.sources import TARGET_RATE, CommandSource, open_source
from edge_agent.audio.wav import decode, encode_pcm
from edge_agent.config import AudioSettings
from edge_agent.errors import AudioError
from tests.waiting import wait_until


def tone(freq: float, seconds: float, rate: int, level: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (level * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def dominant_frequency(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Reader:
    """Reads a source's blocks on a thread, as the listener's pump does."""

    def __init__(self, source: CommandSource) -> None:
        self.source = source
        self.blocks: list[np.ndarray] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for block in self.source.blocks():
                self.blocks.append(block)
        except BaseException as exc:
            self.error = exc

    @property
    def samples(self) -> int:
        return sum(len(b) for b in list(self.blocks))

    def stop(self) -> None:
        self.source.close()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the reader did not stop"


def test_a_recorders_raw_pcm_of_any_format_is_heard_as_16k_mono(tmp_path: Path) -> None:
    raw = tmp_path / "mic.raw"
    raw.write_bytes(encode_pcm(tone(440, 1.0, 48000), 4, 2))  # S32_LE, stereo, 48 kHz
    source = CommandSource(f"cat {shlex.quote(str(raw))}", rate=48000, channels=2, width=4)
    reader = Reader(source)
    try:
        wait_until(lambda: reader.samples >= TARGET_RATE, what="one second of audio")
    finally:
        reader.stop()
    first = np.concatenate(reader.blocks)[:TARGET_RATE]
    assert dominant_frequency(first, TARGET_RATE) == pytest.approx(440, abs=2)
    assert np.max(np.abs(first[1000:])) == pytest.approx(0.5, abs=0.02)


def test_a_command_that_exits_is_started_again_with_growing_delays(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    script = f"echo run >> {shlex.quote(str(starts))}; echo 'no such card' >&2; exit 1"
    source = CommandSource(f"sh -c {shlex.quote(script)}", restart_s=(0.05, 0.2))
    said: list[str | None] = []
    source.on_trouble = said.append
    reader = Reader(source)
    try:
        wait_until(lambda: len(said) >= 4, what="the fourth exit reported")
    finally:
        reader.stop()
    assert reader.error is None and reader.blocks == []
    assert source.starts >= 4
    assert said[0] == "audio.input_command exited with code 1: no such card; starting it again in 0.05 s"
    assert [s.rsplit(" ", 2)[-2] for s in said[:4] if s] == ["0.05", "0.1", "0.2", "0.2"]


def test_audio_again_after_a_restart_clears_the_trouble(tmp_path: Path) -> None:
    flag = tmp_path / "failed-once"
    script = (f"if [ -e {shlex.quote(str(flag))} ]; then exec cat /dev/zero; fi; "
              f"touch {shlex.quote(str(flag))}; exit 2")
    source = CommandSource(f"sh -c {shlex.quote(script)}", restart_s=(0.05, 0.2))
    said: list[str | None] = []
    source.on_trouble = said.append
    reader = Reader(source)
    try:
        wait_until(lambda: None in said, what="audio again")
    finally:
        reader.stop()
    assert said[0] is not None and "exited with code 2" in said[0] and said[1] is None


def test_a_recorder_that_stops_writing_is_taken_for_stuck_and_started_again() -> None:
    source = CommandSource("sleep 600", stall_s=0.3, restart_s=(0.05, 0.2))  # alive, silent
    said: list[str | None] = []
    source.on_trouble = said.append
    reader = Reader(source)
    try:
        wait_until(lambda: source.starts >= 2, what="the second start")
    finally:
        reader.stop()
    assert said[0] == "audio.input_command gave no audio for 0.3 s; starting it again in 0.05 s"


def test_a_command_that_cannot_start_is_unavailable_at_once() -> None:
    with pytest.raises(AudioUnavailable, match=r"audio.input_command: cannot start 'no-such-recorder'"):
        CommandSource("no-such-recorder -r 16000")
    with pytest.raises(AudioError, match="cannot split"):
        CommandSource("arecord 'unclosed")


def test_closing_stops_the_command_and_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"sleep 600 & echo $! > {shlex.quote(str(pid_file))}; wait"  # silent, and a child
    source = CommandSource(f"sh -c {shlex.quote(script)}")
    reader = Reader(source)
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the child's pid")
    child = int(pid_file.read_text())
    reader.stop()  # returns although the command never wrote a byte
    wait_until(lambda: not alive(child), timeout=10, what="the child to be gone")


def test_an_output_command_gets_the_speech_as_raw_pcm_in_its_format(tmp_path: Path) -> None:
    out = tmp_path / "played.raw"
    sink = CommandSink(f"sh -c {shlex.quote('cat > ' + shlex.quote(str(out)))}", 24000,
                       rate=22050, width=2, channels=2, volume=0.5)
    speech = tone(300, 1.0, 24000)
    for piece in np.array_split(speech, 7):
        sink.write(piece)
    sink.close()
    data = out.read_bytes()
    assert len(data) == 22050 * 2 * 2  # one second at the command's rate, width and channels
    played = decode(data, "pcm", 2, 2, out)
    assert dominant_frequency(played, 22050) == pytest.approx(300, abs=2)
    assert np.max(np.abs(played[2000:])) == pytest.approx(0.25, abs=0.01)
    assert sink.frames == 24000


def test_an_output_command_that_exits_is_an_error_with_its_reason(tmp_path: Path) -> None:
    sink = CommandSink("sh -c 'echo \"cannot open audio device\" >&2; exit 1'", 22050)
    with pytest.raises(AudioError, match="exited with code 1: cannot open audio device"):
        for _ in range(100):  # the pipe takes the first writes; the exit shows within a few
            sink.write(tone(300, 1.0, 22050))
        sink.close()


def test_an_output_command_that_cannot_start_falls_back_as_the_sound_card_would(
        caplog: pytest.LogCaptureFixture) -> None:
    output = AudioOutput(AudioSettings(output_command="no-such-player -", fallback="null"))
    with caplog.at_level(logging.WARNING):
        assert isinstance(output.open(22050), NullSink)
    assert "cannot start 'no-such-player'" in caplog.text
    with pytest.raises(AudioUnavailable):
        AudioOutput(AudioSettings(output_command="no-such-player -", fallback="error")).open(22050)


def test_the_configured_input_is_the_command(tmp_path: Path) -> None:
    raw = tmp_path / "x.raw"
    raw.write_bytes(encode_pcm(tone(200, 0.2, 8000), 1, 1))
    program = f"import sys; sys.stdout.buffer.write(open({str(raw)!r}, 'rb').read())"
    command = shlex.join([sys.executable, "-c", program])
    settings = AudioSettings(input_command=command, input_rate=8000, input_width=1)
    source = open_source(settings)
    assert isinstance(source, CommandSource)
    reader = Reader(source)
    try:
        wait_until(lambda: reader.samples >= 3000, what="the python command's audio")
    finally:
        reader.stop()


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (a zombie has ended: where no init reaps
    orphans, killpg(pgid, 0) would still find it)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


NEVER_READS = "sh -c 'sleep 600 & exec sleep 600'"
"""A speaker command that takes no audio (a hung player), with a child in its group."""


def test_an_output_command_that_never_reads_is_stopped_with_its_group_after_the_stall(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen: one os.write of a whole sentence blocked for as long as the command did not read,
    # so the stall check never ran and the announcement never ended.
    monkeypatch.setattr("edge_agent.audio.sinks.WRITE_STALL_S", 1.0)
    sink = CommandSink(NEVER_READS, 22050)
    pgid = sink._proc.pid
    errors: list[BaseException] = []

    def speak() -> None:
        try:
            sink.write(tone(300, 10.0, 22050))  # 430 KiB: far beyond what the pipe holds
            sink.close()
        except BaseException as exc:
            errors.append(exc)

    speaker = threading.Thread(target=speak, daemon=True)
    speaker.start()
    speaker.join(30)  # a generous bound: the stall is 1 s
    assert not speaker.is_alive(), "the write to a command that never reads did not end"
    assert len(errors) == 1 and isinstance(errors[0], AudioError)
    assert "took no audio for 1 s; stopped it" in str(errors[0])
    wait_until(lambda: not group_alive(pgid), timeout=10, what="the command and its child gone")


def test_a_short_sound_to_an_output_command_that_never_reads_ends_at_the_stall_not_the_drain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Half a second fits in the pipe: no write blocks, and only the wait for it to be played
    # can tell that nobody reads it.
    monkeypatch.setattr("edge_agent.audio.sinks.WRITE_STALL_S", 1.0)
    sink = CommandSink(NEVER_READS, 22050)
    pgid = sink._proc.pid
    sink.write(tone(300, 0.5, 22050))
    with pytest.raises(AudioError, match="took no audio for 1 s"):
        sink.close()  # DRAIN_S (30 s) is not waited
    wait_until(lambda: not group_alive(pgid), timeout=10, what="the command and its child gone")


def test_an_output_command_that_plays_slowly_is_not_taken_for_stuck(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A player reading at its own pace (here 32 KiB a second, 1.5x real time): each stall
    # deadline runs from the last byte it took, not from the start of the sentence.
    monkeypatch.setattr("edge_agent.audio.sinks.WRITE_STALL_S", 1.0)
    out = tmp_path / "played.raw"
    player = ("import sys, time\n"
              "with open(sys.argv[1], 'wb') as out:\n"
              "    while data := sys.stdin.buffer.read(4096):\n"
              "        out.write(data); time.sleep(0.125)\n")
    sink = CommandSink(shlex.join([sys.executable, "-c", player, str(out)]), 22050)
    sink.write(tone(300, 3.0, 22050))
    sink.close()
    assert len(out.read_bytes()) == 3 * 22050 * 2


def test_every_audio_command_still_running_is_stopped_at_shutdown() -> None:
    from edge_agent.audio.command import stop_all

    sink = CommandSink(NEVER_READS, 22050)
    source = CommandSource(NEVER_READS)  # never read: started, not yet owned by a reader
    groups = [sink._proc.pid, source._proc.pid]  # type: ignore[union-attr]
    stop_all()
    wait_until(lambda: not any(map(group_alive, groups)), timeout=10, what="every group gone")


def sigblk(proc_status: str) -> int:
    line = next(line for line in proc_status.splitlines() if line.startswith("SigBlk:"))
    return int(line.split()[1], 16)


def test_an_audio_command_starts_with_no_signal_blocked_whatever_its_thread_blocks() -> None:
    import signal

    from edge_agent.audio.command import AudioProcess

    # As PortAudio does in the thread that imports sounddevice: a recorder that inherited this
    # would get EPIPE instead of dying when its reader goes.
    seen: list[str] = []

    def start() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
        proc = AudioProcess(["cat", "/proc/self/status"], "audio.input_command", reads=True)
        with os.fdopen(os.dup(proc.stdout_fd), "rb") as out:
            seen.append(out.read().decode())
        proc.stop()
        seen.append(str(signal.pthread_sigmask(signal.SIG_BLOCK, set())))

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(10)
    assert sigblk(seen[0]) == 0
    assert seen[1] == str({signal.SIGPIPE})  # the thread's own mask is as it was


def test_importing_sounddevice_leaves_the_signal_mask_as_it_was() -> None:
    import subprocess

    # A fresh interpreter: whether PortAudio blocks SIGPIPE shows only on its first import.
    probe = ("import signal, subprocess\n"
             "from edge_agent.audio.sinks import AudioUnavailable, import_sounddevice\n"
             "try:\n    import_sounddevice()\nexcept AudioUnavailable:\n    print('no PortAudio')\n"
             "print(signal.pthread_sigmask(signal.SIG_BLOCK, set()))\n"
             "print(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert "no PortAudio" not in out, "libportaudio2 is not installed (scripts/test installs it)"
    assert out.splitlines()[0] == "set()"
    assert sigblk(out) == 0  # and so a child started afterwards dies of SIGPIPE as it should


def test_a_recorder_faster_than_real_time_is_heard_at_a_bounded_pace() -> None:
    import time

    from edge_agent.audio.sources import MAX_INPUT_SPEED, PACE_BURST_S

    # Seen: a command writing garbage as fast as it could kept the daemon at 1.00 core.
    source = CommandSource("cat /dev/urandom")
    said: list[str | None] = []
    source.on_trouble = said.append
    started = time.monotonic()
    reader = Reader(source)
    try:
        wait_until(lambda: reader.samples >= 6 * TARGET_RATE, what="six seconds of audio")
        elapsed = time.monotonic() - started
    finally:
        reader.stop()
    assert reader.error is None
    # A lower bound, which load can only lengthen: after the head start, no faster than the pace.
    assert elapsed >= (6 - PACE_BURST_S) / MAX_INPUT_SPEED
    # And it is garbage, which the status says (once, and not cleared while it lasts).
    assert said == ["audio.input_command: hears only noise at full scale "
                    "(is it 16000 Hz, 16-bit little-endian PCM?)"]
