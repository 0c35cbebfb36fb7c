"""The wake engine on real microWakeWord models and speech our Piper voice makes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from edge_agent.config import WAKE_BUILTIN, WakeSettings
from edge_agent.errors import ConfigError, ModelError
from edge_agent.wake import WakeEngine, resolve
from edge_agent.wake.engine import Trigger
from edge_agent.wake.models import builtin_dir
from tests.speech_fixtures import noise, silence

PHRASES = {
    "okay_nabu": "Okay Nabu, turn on the kitchen lights.",
    "hey_jarvis": "Hey Jarvis, what time is it?",
    "alexa": "Alexa, stop the music.",
    "hey_mycroft": "Hey Mycroft, lock the front door.",
}
UNRELATED = "Remind me to call my mother at six o'clock this evening."


@pytest.fixture(scope="session")
def spoken(clip_cache: Path, piper_voice) -> dict[str, np.ndarray]:
    texts = {**PHRASES, "unrelated": UNRELATED}
    return {key: load_16k(piper_clip(text, clip_cache, piper_voice)) for key, text in texts.items()}


@pytest.fixture(scope="session")
def all_models() -> WakeEngine:
    return WakeEngine.load(WakeSettings(models=WAKE_BUILTIN))


def padded(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate([silence(0.5), *parts, silence(0.5)])


@pytest.mark.parametrize("model", sorted(PHRASES))
def test_each_builtin_model_fires_once_on_its_phrase_and_no_other(all_models, spoken, model):
    all_models.reset()
    audio = padded(spoken[model])
    found = all_models.feed(audio)
    assert [d.model for d in found] == [model]
    assert found[0].wake_word.lower().replace(" ", "_") == model
    # The phrase is the first second or so of the clip; the detection ends it, not the command.
    assert 0.6 < found[0].time < 0.5 + 1.8
    assert found[0].probability > resolve(model).probability_cutoff


def test_speech_without_a_wake_phrase_and_noise_fire_nothing(all_models, spoken):
    all_models.reset()
    assert all_models.feed(padded(spoken["unrelated"], noise(3.0, 0.05), silence(1.0))) == []
    assert all_models.stats.detections == 0
    assert all_models.stats.audio_s == pytest.approx(5.0 + len(spoken["unrelated"]) / 16000, abs=0.011)


def test_blocks_of_any_size_give_the_same_detections(spoken):
    engine = WakeEngine.load(WakeSettings(models=("okay_nabu",)))
    audio = padded(spoken["okay_nabu"])
    whole = engine.feed(audio)
    engine.reset()
    pieces = []
    for start in range(0, len(audio), 333):
        pieces += engine.feed(audio[start:start + 333])
    engine.reset()
    pcm = (np.clip(np.round(audio * 32767), -32768, 32767).astype("<i2")).tobytes()
    raw = [d for start in range(0, len(pcm), 1001) for d in engine.feed_pcm(pcm[start:start + 1001])]
    assert len(whole) == 1
    assert whole == pieces == raw


def test_refractory_period_makes_a_repeated_phrase_wake_once(spoken):
    phrase = spoken["okay_nabu"][: round(1.3 * 16000)]
    engine = WakeEngine.load(WakeSettings(models=("okay_nabu",), refractory_s=10.0))
    assert len(engine.feed(padded(phrase, silence(0.3), phrase))) == 1
    engine = WakeEngine.load(WakeSettings(models=("okay_nabu",), refractory_s=1.0))
    assert len(engine.feed(padded(phrase, silence(1.0), phrase))) == 2


def test_a_phrase_held_over_the_cutoff_wakes_once_without_a_refractory_period(spoken):
    # pymicro-wakeword answers 0.0 between inferences; read as a fall below the cutoff, that
    # re-armed the model every 30 ms and this phrase woke 18 times.
    engine = WakeEngine.load(WakeSettings(models=("okay_nabu",), refractory_s=0.0))
    found = engine.feed(padded(spoken["okay_nabu"]))
    assert len(found) == 1
    assert engine.stats.suppressed == 0


def test_the_trigger_fires_on_the_rise_of_its_windowed_mean_and_rearms_below_the_cutoff():
    trigger = Trigger(cutoff=0.5, window=3)
    pushed = [trigger.push(p) for p in (0.9, 0.9, 0.9, 0.9, 0.0, 0.0, 0.9, 0.9, 0.9)]
    assert [round(mean, 2) for mean, _ in pushed] == [0.0, 0.0, 0.9, 0.9, 0.6, 0.3, 0.3, 0.6, 0.9]
    assert [rising for _, rising in pushed] == [False, False, True, False, False, False, False, True, False]


def test_the_listener_hears_every_inference_once(spoken):
    heard: list[tuple[str, float, float]] = []
    engine = WakeEngine(
        [resolve("okay_nabu"), resolve("alexa")], listener=lambda *args: heard.append(args))
    audio = padded(spoken["okay_nabu"])
    found = engine.feed(audio)
    per_model = {name: [(t, p) for n, t, p in heard if n == name] for name in ("okay_nabu", "alexa")}
    steps = (len(audio) - 480) // 160 + 1  # a 30 ms feature window, moved 10 ms at a time
    assert len(per_model["okay_nabu"]) == len(per_model["alexa"]) == steps // 3
    times = [t for t, _ in per_model["okay_nabu"]]
    assert np.allclose(np.diff(times), 0.03)
    # The detection's probability is the mean of the last five inferences before it.
    last = [p for t, p in per_model["okay_nabu"] if t <= found[0].time][-5:]
    assert found[0].probability == pytest.approx(sum(last) / 5)


def test_probability_cutoff_override_applies_to_the_named_model():
    assert resolve("okay_nabu").probability_cutoff == 0.85  # the model's own, from its JSON
    assert resolve("okay_nabu", {"okay_nabu": 0.6}).probability_cutoff == 0.6
    assert resolve("hey_jarvis", {"okay_nabu": 0.6}).probability_cutoff == 0.97


def test_sliding_window_override_applies_to_the_named_model(spoken):
    assert resolve("okay_nabu").sliding_window_size == 5  # the model's own, from its JSON
    assert resolve("okay_nabu", windows={"okay_nabu": 8}).sliding_window_size == 8
    assert resolve("alexa", windows={"okay_nabu": 8}).sliding_window_size == 5
    # A longer window averages more of the phrase's probabilities: it wakes later, with a lower peak.
    woke = {}
    for window in (5, 8):
        engine = WakeEngine.load(WakeSettings(sliding_window={"okay_nabu": window},
                                              probability_cutoff={"okay_nabu": 0.75}))
        [found] = engine.feed(padded(spoken["okay_nabu"]))
        woke[window] = found.time
    assert woke[8] > woke[5]


def test_cutoff_and_models_are_checked_in_config():
    from edge_agent.config import load_settings

    with pytest.raises(ConfigError, match=r"wake.probability_cutoff.okay_nabu: 1.5 is outside"):
        load_settings(None, {"wake": {"probability_cutoff": {"okay_nabu": 1.5}}})
    with pytest.raises(ConfigError, match=r"wake.models"):
        load_settings(None, {"wake": {"models": []}})
    with pytest.raises(ConfigError, match=r"wake.sliding_window.okay_nabu: 0 is not a whole number"):
        load_settings(None, {"wake": {"sliding_window": {"okay_nabu": 0}}})


# -- a user's own model ------------------------------------------------------------------


def custom_model(directory: Path, name: str = "my_word", tflite: bytes | None = None,
                 **changes: object) -> Path:
    """A custom model: the okay_nabu weights under a new name, or `tflite` bytes instead."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = json.loads((builtin_dir() / "okay_nabu.json").read_text())
    doc.update({"model": f"{name}.tflite", "wake_word": "My Word"}, **changes)
    if tflite is None:
        shutil.copy(builtin_dir() / "okay_nabu.tflite", directory / f"{name}.tflite")
    else:
        (directory / f"{name}.tflite").write_bytes(tflite)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_custom_model_loads_from_its_json_and_fires(tmp_path, spoken):
    path = custom_model(tmp_path)
    engine = WakeEngine.load(WakeSettings(models=(str(path),), probability_cutoff={"my_word": 0.8}))
    assert engine.specs[0].probability_cutoff == 0.8
    found = engine.feed(padded(spoken["okay_nabu"]))
    assert [(d.model, d.wake_word) for d in found] == [("my_word", "My Word")]


def test_a_corrupt_custom_model_is_one_clear_error_naming_the_file(tmp_path):
    truncated = (builtin_dir() / "okay_nabu.tflite").read_bytes()[:20000]
    for name, data in [("junk", np.random.default_rng(1).bytes(3000)), ("truncated", truncated)]:
        path = custom_model(tmp_path, name, tflite=data)
        # TensorFlow Lite would crash this process on these files: the child-process probe says why.
        with pytest.raises(ModelError, match=rf"{name}\.tflite: not a TensorFlow Lite model"):
            WakeEngine.load(WakeSettings(models=(str(path),)))


@pytest.mark.parametrize(("change", "message"), [
    ({"model": "absent.tflite"}, r"absent\.tflite: No such file"),
    ({"model": "../x.tflite"}, r"'model' must name a \.tflite file beside it"),
    ({"micro": {"probability_cutoff": 2, "sliding_window_size": 5}}, r"probability_cutoff must be"),
    ({"micro": {"probability_cutoff": 0.5}}, r"sliding_window_size must be"),
    ({"wake_word": ""}, r"'wake_word' must be"),
])
def test_a_bad_custom_model_description_names_file_and_key(tmp_path, change, message):
    path = custom_model(tmp_path, **change)
    with pytest.raises(ModelError, match=message):
        WakeEngine.load(WakeSettings(models=(str(path),)))


def test_missing_or_unparsable_json_and_unknown_names_are_clear_errors(tmp_path):
    with pytest.raises(ModelError, match=r"nowhere\.json: No such file"):
        WakeEngine.load(WakeSettings(models=(str(tmp_path / "nowhere.json"),)))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ModelError, match=r"bad\.json: not valid JSON"):
        WakeEngine.load(WakeSettings(models=(str(tmp_path / "bad.json"),)))
    with pytest.raises(ModelError, match=r"'hey_siri': not a built-in name \(okay_nabu, hey_jarvis"):
        WakeEngine.load(WakeSettings(models=("hey_siri",)))
    with pytest.raises(ModelError, match="named twice"):
        WakeEngine.load(WakeSettings(models=("alexa", "alexa")))
