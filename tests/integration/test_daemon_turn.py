"""`edge-agent run` in wake mode with real models and a real mosquitto: what leaves the device."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from edge_agent.config import WakeSettings
from edge_agent.text.wer import wer
from edge_agent.wake import WakeEngine
from tests.mqtt_support import DaemonProcess, Watcher, wait_until
from tests.speech_fixtures import noise, silence, write_wav

WAKE_COMMAND = "Okay Nabu, turn on the kitchen lights."
PLAIN = ("Set a timer for ten minutes.", "What is the weather like tomorrow?")


@pytest.fixture(scope="module")
def voice_of(clip_cache, piper_voice):
    return lambda text: load_16k(piper_clip(text, clip_cache, piper_voice))


def run_daemon(tmp_path, broker, whisper_dir, wav, extra: str = "") -> DaemonProcess:
    daemon = DaemonProcess(tmp_path / "d", broker.url)
    daemon.config = tmp_path / "wake.yaml"
    daemon.config.write_text(f"asr:\n  model: {whisper_dir}\naudio:\n  input_file: {wav}\n{extra}")
    return daemon.start()


def logged(daemon: DaemonProcess, what: str) -> bool:
    return any(what in line.get("msg", "") for line in daemon.log_lines())


def ended(daemon: DaemonProcess, what: str) -> bool:
    """`what` is in the log of a daemon still running."""
    if not daemon.alive:
        raise AssertionError(f"the daemon exited:\n{daemon.log_text()[-3000:]}")
    return logged(daemon, what)


def test_wake_mode_publishes_one_turn_for_the_wake_phrase_and_nothing_for_other_speech(
        tmp_path, broker, whisper_dir, voice_of):
    audio = np.concatenate([silence(0.5), voice_of(PLAIN[0]), silence(1.5), voice_of(WAKE_COMMAND),
                            silence(2.0), voice_of(PLAIN[1]), silence(1.5)])
    wav = write_wav(tmp_path / "room.wav", audio)
    watcher = Watcher(broker.url)
    daemon = run_daemon(tmp_path, broker, whisper_dir, wav)
    try:
        wait_until(lambda: ended(daemon, "listener ended"), timeout=180, what="the file to be heard")
        woke = watcher.wait("edge/dev1/wake")
        heard = watcher.wait("edge/dev1/transcript")
        wait_until(lambda: ended(daemon, "running"), what="running")
    finally:
        daemon.close()
        watcher.close()
    assert len(woke) == 1 and len(heard) == 1
    assert woke[0]["wake_word"] == "Okay Nabu" and isinstance(woke[0]["ts"], float)
    assert heard[0]["conversation_id"] == woke[0]["conversation_id"]
    assert heard[0]["wake_word"] == "Okay Nabu"
    assert "kitchen lights" in heard[0]["text"].lower()
    assert (daemon.out_dir / f"wake-{woke[0]['conversation_id']}.wav").is_file()  # the chime


def test_a_second_sentence_after_a_pause_judged_complete_reaches_hermes_once_with_the_first(
        tmp_path, broker, whisper_dir, turn_model, dinner):
    """The end-of-turn model judges "Dinner is ready." complete and its transcript goes out; the second
    sentence, said before the VAD's hangover, sends the whole command again (`continued`). Hermes,
    whose dialogue manager acts on a session's first `textCaptured`, gets one: the whole command."""
    first, second = dinner
    wav = write_wav(tmp_path / "room.wav", np.concatenate([silence(0.5), first, silence(0.3), second,
                                                           silence(2.0)]))
    watcher = Watcher(broker.url, topic="#")
    daemon = run_daemon(tmp_path, broker, whisper_dir, wav, "hermes:\n  enabled: true\n  site_id: kitchen\n")
    try:
        wait_until(lambda: ended(daemon, "listener ended"), timeout=180, what="the file to be heard")
        heard = watcher.wait("edge/dev1/transcript", count=2)
        captured = watcher.wait("hermes/asr/textCaptured")
        wait_until(lambda: ended(daemon, "running"), what="running")
    finally:
        daemon.close()
        watcher.close()
    assert [h.get("continued", False) for h in heard] == [False, True], heard
    assert "table" not in heard[0]["text"].lower()
    assert len(captured) == 1 and captured[0]["text"] == heard[1]["text"]
    assert captured[0]["sessionId"] == heard[1]["conversation_id"] and captured[0]["siteId"] == "kitchen"
    assert wer(["dinner is ready please come to the table"], [captured[0]["text"]]) < 0.3


def test_a_corrupt_custom_wake_model_is_reported_and_nothing_is_transcribed(
        tmp_path, broker, whisper_dir, voice_of):
    (tmp_path / "mine.tflite").write_bytes(np.random.default_rng(3).bytes(5000))
    (tmp_path / "mine.json").write_text(json.dumps({
        "wake_word": "Mine", "model": "mine.tflite",
        "micro": {"probability_cutoff": 0.9, "sliding_window_size": 5}}))
    wav = write_wav(tmp_path / "room.wav", np.concatenate([voice_of(WAKE_COMMAND), voice_of(PLAIN[0])]))
    watcher = Watcher(broker.url)
    daemon = run_daemon(tmp_path, broker, whisper_dir, wav, f"wake:\n  models: [{tmp_path / 'mine.json'}]\n")
    try:
        status = watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "unavailable",
                              timeout=120)[-1]
        wait_until(lambda: ended(daemon, "running"), what="running")
    finally:
        daemon.close()
        watcher.close()
    assert status["state"] == "online" and status["listen"]["mode"] == "wake"
    assert status["listen"]["error"] == (f"wake model {tmp_path / 'mine.tflite'}: not a TensorFlow Lite "
                                         "model (the flatbuffer does not verify)")
    assert watcher.find("edge/dev1/transcript") == []
    assert not any(line.get("msg") == "listening" for line in daemon.log_lines())


def test_our_own_voice_saying_the_wake_phrase_wakes_the_model_and_the_guard_drops_it(voice_of):
    """Measured: our playback mixed into the microphone fires okay_nabu; so does a user 20 dB above it.
    The own-voice guard tells them apart by the audio played (the reference), not by its words.

    (On the clips, which are the same samples on every machine: the echo at 0.5x with room noise
    peaks at 0.945 against the cutoff 0.85, our voice alone at 0.977, a user 20 dB above our
    playback at 0.959 and 10 dB above it at 0.891.)
    """
    from edge_agent.listen.ownvoice import OwnVoice

    own_text = "Okay Nabu is my wake word."
    other_text = "The washing machine has finished its program."
    engine = WakeEngine.load(WakeSettings())
    # The device's speaker into its microphone: attenuated, with room noise.
    own = np.concatenate([silence(0.3), voice_of(own_text)])
    heard_self = engine.feed(0.5 * own + noise(own.size / 16000, 0.01))
    engine.reset()
    playback = np.concatenate([silence(0.3), 0.1 * voice_of(other_text)])
    user = np.concatenate([silence(0.3), voice_of(WAKE_COMMAND)])[: playback.size]
    mix = playback[: user.size] + user
    heard_user = engine.feed(mix + noise(mix.size / 16000, 0.01))
    assert [d.model for d in heard_self] == ["okay_nabu"]  # the model alone cannot tell us from a user
    assert [d.model for d in heard_user] == ["okay_nabu"]
    guard = OwnVoice(WakeSettings())
    guard.hear(own)  # what the sink played, as the microphone's timeline holds it
    assert guard.is_own(heard_self[0])  # the daemon drops it: our own voice
    guard = OwnVoice(WakeSettings())
    guard.hear(playback[: mix.size])
    assert not guard.is_own(heard_user[0])  # barge-in
