"""The end-of-turn model (Smart Turn v3.2, fetched from its wheel) and how it is bounded."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from edge_agent.config import ListenSettings
from edge_agent.listen.endofturn import (
    MODEL_FILE,
    MODEL_ID,
    WINDOW,
    EndOfTurn,
    SmartTurn,
    TurnAudio,
    load_end_of_turn,
    turn_features,
)
from edge_agent.models import ModelStore, load_catalog
from tests.speech_fixtures import run_cli, silence

COMPLETE = "Turn off all the lights downstairs."


@pytest.fixture(scope="module")
def model(turn_model: Path) -> SmartTurn:
    return SmartTurn.load(turn_model)


@pytest.fixture(scope="module")
def command(clip_cache: Path, piper_voice) -> np.ndarray:
    audio = load_16k(piper_clip(COMPLETE, clip_cache, piper_voice))
    voiced = np.nonzero(np.abs(audio) > 0.01)[0]
    return audio[:voiced[-1] + 1]


def test_features_are_whispers_log_mel_of_the_normalised_window(command):
    """The reference: openai-whisper's own log-mel on the window the feature extractor the model was
    trained with sees (8 s, zero-padded on the left, normalised to zero mean and unit variance)."""
    whisper = pytest.importorskip("whisper", reason="the reference needs the export extra")
    torch = pytest.importorskip("torch")
    window = np.concatenate([np.zeros(WINDOW - command.size, dtype=np.float32), command])
    normalised = (window - window.mean()) / np.sqrt(window.var() + 1e-7)
    reference = whisper.log_mel_spectrogram(torch.from_numpy(normalised.astype(np.float32))).numpy()
    ours = turn_features(command)
    assert ours.shape == (1, 80, 800) and ours.dtype == np.float32
    assert np.abs(ours[0] - reference).max() < 1e-4


def test_features_keep_the_last_eight_seconds():
    long = np.random.default_rng(1).normal(0, 0.1, WINDOW + 16000).astype(np.float32)
    assert np.array_equal(turn_features(long), turn_features(long[-WINDOW:]))


def test_a_finished_command_is_complete_and_one_cut_mid_phrase_is_not(model, command):
    pause = silence(0.15)
    assert model.probability(np.concatenate([command, pause])) > 0.9
    assert model.probability(np.concatenate([command[:command.size // 2], pause])) < 0.5


def test_turn_audio_keeps_the_last_window_newest_last():
    audio = TurnAudio()
    blocks = [np.full(48000, i, dtype=np.float32) for i in range(4)]
    for block in blocks:
        audio.add(block)
    last = audio.last()
    assert last.size == WINDOW and last[-1] == 3 and last[0] == 1


def test_a_pause_while_the_model_is_busy_is_skipped_not_queued(model, command):
    ender = EndOfTurn(model, 0.5)
    try:
        first = ender.ask(command)
        assert first is not None
        assert ender.ask(command) is None  # still running: this pause is left to the VAD
        verdict = ender.verdict(first, time.perf_counter(), 30.0)
        assert verdict.complete and verdict.probability is not None
        assert ender.stats.asked == 1 and ender.stats.skipped == 1 and ender.stats.complete == 1
        assert ender.ask(command) is not None  # free again
    finally:
        ender.close()


def test_a_verdict_later_than_the_caller_can_wait_is_dropped(model, command):
    ender = EndOfTurn(model, 0.5)
    try:
        verdict = ender.verdict(ender.ask(command), time.perf_counter(), 0.0)
        assert verdict.probability is None and not verdict.complete and ender.stats.late == 1
    finally:
        ender.close()


def our_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "edge_agent.listen.endofturn" and r.levelno == logging.WARNING]


def test_a_missing_model_falls_back_to_the_vad_with_one_warning(tmp_path, caplog):
    store = ModelStore(tmp_path, load_catalog())
    with caplog.at_level(logging.WARNING):
        assert load_end_of_turn(ListenSettings(), store) is None
    (warning,) = our_warnings(caplog)
    assert "edge-agent models fetch smart-turn" in warning and "VAD's hangover" in warning


def test_a_corrupt_model_falls_back_to_the_vad_with_one_warning(tmp_path, turn_model, caplog):
    mine = tmp_path / MODEL_ID / MODEL_FILE
    mine.parent.mkdir()
    shutil.copyfile(turn_model, mine)
    with mine.open("r+b") as fh:  # one flipped byte in the middle of the weights
        fh.seek(mine.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING):
        assert load_end_of_turn(ListenSettings(), ModelStore(tmp_path, load_catalog())) is None
    (warning,) = our_warnings(caplog)
    assert "does not match its sha256" in warning


def test_a_file_that_is_no_onnx_model_falls_back_with_one_warning(tmp_path, caplog):
    """A catalog of the user's own naming a file onnxruntime cannot load (its hash is right)."""
    junk = tmp_path / "cache" / MODEL_ID / MODEL_FILE
    junk.parent.mkdir(parents=True)
    junk.write_bytes(b"not an onnx graph")
    import hashlib

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(f"""models:
  - id: {MODEL_ID}
    task: end-of-turn
    licence: BSD-2-Clause
    source: {{kind: url, url: "http://127.0.0.1:9/"}}
    files:
      - name: {MODEL_FILE}
        size: {junk.stat().st_size}
        sha256: {hashlib.sha256(junk.read_bytes()).hexdigest()}
""")
    with caplog.at_level(logging.WARNING):
        store = ModelStore(tmp_path / "cache", load_catalog(catalog))
        assert load_end_of_turn(ListenSettings(), store) is None
    (warning,) = our_warnings(caplog)
    assert "cannot load ONNX model" in warning


def test_the_vad_setting_loads_no_model(tmp_path, turn_model):
    store = ModelStore(turn_model.parent.parent, load_catalog())
    assert load_end_of_turn(ListenSettings(end_of_turn="vad"), store) is None
    ender = load_end_of_turn(ListenSettings(turn_probability=0.7), store)
    assert ender is not None and ender.threshold == 0.7
    ender.close()


def test_doctor_says_turns_end_at_the_vad_without_the_model(tmp_path):
    empty = ["--set", "mqtt.broker=''", "--set", f"models.cache_dir={tmp_path / 'cache'}"]
    result = run_cli("doctor", *empty)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if f"{MODEL_ID}:" in line]
    assert line.startswith("warn") and "turns end at the VAD's hangover" in line
    assert "models fetch smart-turn" in line
    result = run_cli("doctor", *empty, "--set", "listen.end_of_turn=vad")
    (line,) = [line for line in result.stdout.splitlines() if f"{MODEL_ID}:" in line]
    assert line.startswith("ok") and "not fetched (optional)" in line


def test_the_hearing_every_consumer_builds_asks_the_model_when_it_is_there(
        whisper_dir, turn_model, shared_cache, tmp_path, caplog):
    """`build_hearing` is where `listen`, the daemon (MQTT, Wyoming satellite, ESPHome API) get their
    hearing loop: the end of turn is wired there once."""
    from edge_agent.audio.sources import WavFileSource
    from edge_agent.config import load_settings
    from edge_agent.parts import build_hearing
    from tests.speech_fixtures import write_wav

    wav = write_wav(tmp_path / "quiet.wav", silence(0.5))

    def built(cache: Path, **listen: object):
        settings = load_settings(None, {"asr": {"model": str(whisper_dir)}, "listen": listen,
                                        "models": {"cache_dir": str(cache)}})
        loop = build_hearing(settings, ModelStore(cache, load_catalog()), WavFileSource(wav))
        loop.stop()
        return loop.hearing.end_of_turn

    assert isinstance(built(shared_cache), EndOfTurn)
    assert built(shared_cache, end_of_turn="vad") is None
    assert built(shared_cache, mode="always") is None  # no turns to end
    empty = tmp_path / "cache"
    shutil.copytree(shared_cache / "silero-vad", empty / "silero-vad")
    with caplog.at_level(logging.WARNING):
        assert built(empty) is None
    assert len(our_warnings(caplog)) == 1
