"""The daemon hears through a command and a FIFO and speaks through a command (real processes,
real models, a real mosquitto): what users of arecord/parecord/pw-record and aplay/paplay/pw-play run."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from edge_agent.audio.resample import resample
from edge_agent.audio.wav import decode, encode_pcm
from tests.daemon_support import HearingDaemon
from tests.mqtt_support import Producer, Watcher, wait_until
from tests.speech_fixtures import silence

WAKE_COMMAND = "Okay Nabu, turn on the kitchen lights."


@pytest.fixture(scope="module")
def room(clip_cache: Path, piper_voice: Any) -> np.ndarray:
    """The wake phrase and a command with silence around it, 16 kHz."""
    return np.concatenate([silence(0.5), load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice)),
                           silence(2.0)])


@pytest.fixture
def watcher(broker: Any) -> Any:
    w = Watcher(broker.url)
    yield w
    w.close()


def heard_the_turn(watcher: Watcher) -> tuple[dict[str, Any], dict[str, Any]]:
    woke = watcher.wait("edge/dev1/wake", timeout=180)[0]
    heard = watcher.wait("edge/dev1/transcript", timeout=180)[0]
    assert woke["wake_word"] == "Okay Nabu" and heard["conversation_id"] == woke["conversation_id"]
    assert "kitchen lights" in heard["text"].lower()
    return woke, heard


def test_the_daemon_hears_a_wake_word_and_command_through_an_input_command(
        tmp_path: Path, broker: Any, whisper_dir: Path, room: np.ndarray, watcher: Watcher) -> None:
    raw = tmp_path / "room.raw"  # what `arecord -r 22050 -c 2 -f S16_LE -t raw` would write
    raw.write_bytes(encode_pcm(resample(room, 16000, 22050), 2, 2))
    running = HearingDaemon(tmp_path, broker, whisper_dir, {
        "audio.input_command": f"cat {shlex.quote(str(raw))}", "audio.input_rate": 22050,
        "audio.input_channels": 2, "wake.chime": False})
    try:
        heard_the_turn(watcher)
    finally:
        running.stop()


def test_an_input_command_that_exits_is_on_the_status_and_started_again(
        tmp_path: Path, broker: Any, whisper_dir: Path, watcher: Watcher) -> None:
    starts = tmp_path / "starts"
    script = (f"echo run >> {shlex.quote(str(starts))}; "
              "echo 'arecord: main:850: audio open error: No such file or directory' >&2; exit 1")
    command = shlex.join(["sh", "-c", script])
    running = HearingDaemon(tmp_path, broker, whisper_dir, {"audio.input_command": command})
    try:
        status = watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "unavailable")
        wait_until(lambda: starts.exists() and len(starts.read_text().split()) >= 2, what="the second start")
    finally:
        running.stop()
    error = status[0]["listen"]["error"]
    assert error.startswith("audio.input_command exited with code 1: arecord: main:850: audio open error")
    assert error.endswith("starting it again in 0.5 s")


def test_an_input_command_that_cannot_start_leaves_the_daemon_announcing_and_says_why(
        tmp_path: Path, broker: Any, whisper_dir: Path, watcher: Watcher) -> None:
    running = HearingDaemon(tmp_path, broker, whisper_dir,
                            {"audio.input_command": "no-such-recorder -r 16000"})
    producer = Producer(broker.url)
    try:
        status = watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "unavailable")
        producer.publish("edge/dev1/announce", {"id": "still", "text": "Still here."})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "still" and d["state"] == "done")
    finally:
        producer.close()
        running.stop()
    assert status[0]["listen"]["error"] == ("audio.input_command: cannot start 'no-such-recorder' "
                                            "(No such file or directory)")


def test_the_daemon_hears_a_live_stream_fed_into_its_fifo(
        tmp_path: Path, broker: Any, whisper_dir: Path, room: np.ndarray, watcher: Watcher) -> None:
    fifo = tmp_path / "mic.pcm"
    running = HearingDaemon(tmp_path, broker, whisper_dir,
                            {"audio.input_pipe": str(fifo), "wake.chime": False})
    try:
        watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "listening")
        assert fifo.is_fifo()  # made by the daemon
        block = 320  # 20 ms, as a sound server delivers it
        started = time.monotonic()
        with fifo.open("wb", buffering=0) as mic:
            for start in range(0, len(room), block):
                mic.write(encode_pcm(room[start:start + block], 2))
                # Pacing, not synchronisation: the stream arrives in real time, as a microphone's.
                ahead = (start + block) / 16000 - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        heard_the_turn(watcher)
    finally:
        running.stop()


# `arecord -t raw > fifo`, as a test can steer it: 16 kHz s16le silence in real time, and the
# raw file named on a line of its standard input when told; SIGPIPE kills it as it kills arecord.
RECORDER = """
import os, select, signal, sys, time
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
fd = os.open(sys.argv[1], os.O_WRONLY)
block, pending, at = 640, b"", time.monotonic()
while True:
    if select.select([sys.stdin], [], [], 0)[0]:
        line = sys.stdin.readline()
        if not line:
            break
        pending += open(line.strip(), "rb").read()
    chunk, pending = pending[:block], pending[block:]
    os.write(fd, chunk.ljust(block, b"\\0"))
    at += 0.02
    time.sleep(max(0.0, at - time.monotonic()))  # pacing: a microphone's 20 ms blocks
"""


def listen_states(watcher: Watcher) -> list[str]:
    return [d["listen"]["state"] for d in watcher.find("edge/dev1/status", lambda d: "listen" in d)]


def test_a_recorder_writing_into_the_fifo_lives_through_a_mute_and_is_heard_after_it(
        tmp_path: Path, broker: Any, whisper_dir: Path, room: np.ndarray, watcher: Watcher) -> None:
    from edge_agent.audio.sources import HeldPipe

    fifo = tmp_path / "mic.pcm"
    said = tmp_path / "room.raw"
    said.write_bytes(encode_pcm(room, 2))
    running = HearingDaemon(tmp_path, broker, whisper_dir, {
        "audio.input_pipe": str(fifo), "wake.chime": False, "mqtt.ha_discovery": True})
    producer = Producer(broker.url)
    recorder = None
    try:
        watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "listening")
        recorder = subprocess.Popen([sys.executable, "-c", RECORDER, str(fifo)], stdin=subprocess.PIPE,
                                    text=True)
        producer.publish("edge/dev1/ha/mic_mute/set", b"ON")
        wait_until(lambda: listen_states(watcher)[-1] == "muted", what="the muted status")
        assert running.daemon.listener is None  # the hearing loop and its source are gone
        pipe = HeldPipe._held[str(fifo)]
        drained = pipe.drained
        wait_until(lambda: pipe.drained >= drained + 32000, what="a second written while muted")
        assert recorder.poll() is None  # it still has a reader

        producer.publish("edge/dev1/ha/mic_mute/set", b"OFF")
        wait_until(lambda: listen_states(watcher)[-1] == "listening", what="listening again")
        assert recorder.stdin is not None
        recorder.stdin.write(f"{said}\n")
        recorder.stdin.flush()
        heard_the_turn(watcher)  # the same writer, heard after the mute
        assert recorder.poll() is None
    finally:
        producer.close()
        running.stop()
        if recorder is not None:
            try:
                # The daemon let go of the FIFO at shutdown: the recorder's next write ends it.
                assert recorder.wait(30) == -signal.SIGPIPE
            finally:
                recorder.kill()
                recorder.wait()


def test_an_output_command_gets_the_announcement_as_raw_pcm_at_its_rate(
        tmp_path: Path, broker: Any, watcher: Watcher) -> None:
    played = tmp_path / "played.raw"
    command = shlex.join(["sh", "-c", f"cat > {shlex.quote(str(played))}"])  # aplay, for the test
    running = HearingDaemon(tmp_path, broker, None,
                            {"audio.output_command": command, "audio.output_rate": 22050})
    producer = Producer(broker.url)
    try:
        producer.publish("edge/dev1/announce", {"id": "a1", "text": "One. Two."})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "a1" and d["state"] == "done")
    finally:
        producer.close()
        running.stop()
    audio = decode(played.read_bytes(), "pcm", 2, 1, played)
    # ToneSynth: two sentences of 0.05 s at 16 kHz (levels 0.1 and 0.2), resampled to 22.05 kHz
    assert abs(len(audio) - 2 * 0.05 * 22050) <= 2
    assert np.median(np.abs(audio[200:1000])) == pytest.approx(0.1, abs=0.005)
    assert np.median(np.abs(audio[1300:2000])) == pytest.approx(0.2, abs=0.005)


def write_in_real_time(fifo: Path, audio: np.ndarray, lead: bytes = b"") -> None:
    """One writer: `lead`, then `audio` (16 kHz) in 20 ms blocks at the pace of a microphone."""
    block = 320
    started = time.monotonic()
    with fifo.open("wb", buffering=0) as mic:
        mic.write(lead)
        for start in range(0, len(audio), block):
            mic.write(encode_pcm(audio[start:start + block], 2))
            ahead = (start + block) / 16000 - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)  # pacing, not synchronisation


def test_a_fifo_writer_that_leaves_half_a_sample_does_not_make_the_device_deaf(
        tmp_path: Path, broker: Any, whisper_dir: Path, room: np.ndarray, watcher: Watcher) -> None:
    from edge_agent.audio.sources import HeldPipe

    # Seen: one odd byte left by a writer shifted every later writer's samples by a byte: the
    # device heard noise for good, logged nothing and said `listening`.
    fifo = tmp_path / "mic.pcm"
    running = HearingDaemon(tmp_path, broker, whisper_dir,
                            {"audio.input_pipe": str(fifo), "wake.chime": False})
    try:
        watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "listening")
        with fifo.open("wb") as first:
            first.write(encode_pcm(silence(0.5), 2) + b"\x01")
        pipe = HeldPipe._held[str(fifo)]
        wait_until(lambda: pipe.partials_dropped == 1, what="the half sample dropped")
        write_in_real_time(fifo, room)
        heard_the_turn(watcher)
    finally:
        running.stop()


def test_a_fifo_writer_of_garbage_at_full_speed_is_paced_and_on_the_status(
        tmp_path: Path, broker: Any, whisper_dir: Path, watcher: Watcher) -> None:
    from edge_agent.audio.sources import MAX_INPUT_SPEED, PACE_BURST_S

    # Seen: a writer faster than real time kept the daemon at a core, and garbage was `listening`.
    fifo = tmp_path / "mic.pcm"
    running = HearingDaemon(tmp_path, broker, whisper_dir,
                            {"audio.input_pipe": str(fifo), "wake.chime": False})
    writer = None
    try:
        watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "listening")
        writer = subprocess.Popen(["sh", "-c", f"exec cat /dev/urandom > {shlex.quote(str(fifo))}"])
        started = time.monotonic()
        status = watcher.wait("edge/dev1/status",
                              lambda d: d.get("listen", {}).get("state") == "unavailable")[-1]
        assert "hears only noise at full scale" in status["listen"]["error"]
        listener = running.daemon.listener
        assert listener is not None
        heard_s, elapsed = listener.audio_s, time.monotonic() - started
        # An upper bound, which load can only lower: no faster than the pace after its head start.
        assert heard_s <= PACE_BURST_S + MAX_INPUT_SPEED * elapsed + 0.5
        writer.kill()
        writer.wait()
        write_in_real_time(fifo, silence(2.5))  # audio again: the status says so
        watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "listening", count=2)
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
        running.stop()


def test_a_recorder_of_garbage_faster_than_real_time_is_paced_and_on_the_status(
        tmp_path: Path, broker: Any, whisper_dir: Path, watcher: Watcher) -> None:
    from edge_agent.audio.sources import MAX_INPUT_SPEED, PACE_BURST_S

    # Seen: garbage written as fast as a command could kept the daemon at 1.00 core, `listening`.
    running = HearingDaemon(tmp_path, broker, whisper_dir,
                            {"audio.input_command": "cat /dev/urandom", "wake.chime": False})
    try:
        watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "listening")
        listener = running.daemon.listener
        assert listener is not None
        wait_until(lambda: listener.audio_s >= PACE_BURST_S + 4 * MAX_INPUT_SPEED,
                   what="the audio of four seconds at the pace")
        started, heard = time.monotonic(), listener.audio_s
        wait_until(lambda: listener.audio_s >= heard + 2 * MAX_INPUT_SPEED, what="two seconds more")
        # A lower bound, which load can only lengthen: past the head start, the pace holds.
        assert time.monotonic() - started >= 2 * 0.9
        status = watcher.wait("edge/dev1/status",
                              lambda d: d.get("listen", {}).get("state") == "unavailable")[-1]
        assert "audio.input_command: hears only noise at full scale" in status["listen"]["error"]
    finally:
        running.stop()
