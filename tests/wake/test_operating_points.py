"""`bench wake`'s replay of a probability trace decides as the engine does, and its speech level."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from benchmarks.wake import detections, pink_noise, speech_rms, with_noise
from edge_agent.wake import WakeEngine, resolve
from tests.speech_fixtures import silence


@pytest.fixture(scope="module")
def phrase_twice(clip_cache: Path, piper_voice) -> np.ndarray:
    clip = load_16k(piper_clip("Okay Nabu, turn on the kitchen lights.", clip_cache, piper_voice))
    other = load_16k(piper_clip("Remind me to call my mother at six o'clock this evening.", clip_cache,
                                piper_voice))
    rng = np.random.default_rng(3)
    # Twice within the refractory period, then once after it, and once in pink noise.
    return np.concatenate([silence(0.5), clip[:round(1.4 * 16000)], silence(0.2), clip, silence(2.5), other,
                           clip, with_noise(clip, 10.0, "pink", [], rng), silence(0.5)])


@pytest.mark.parametrize(("cutoff", "window"), [(0.85, 5), (0.5, 5), (0.3, 1), (0.6, 8), (0.97, 3)])
def test_the_benchs_replay_of_a_trace_wakes_where_the_engine_does(phrase_twice, cutoff, window):
    heard: list[tuple[float, float]] = []
    spec = replace(resolve("okay_nabu"), probability_cutoff=cutoff, sliding_window_size=window)
    engine = WakeEngine([spec], refractory_s=2.0, listener=lambda _m, t, p: heard.append((t, p)))
    woke = [d.time for d in engine.feed(phrase_twice)]
    times = [t for t, _ in heard]
    replayed = [times[i] for i in detections(np.array([p for _, p in heard], np.float32), window, cutoff)]
    assert replayed == pytest.approx(woke)
    if cutoff < 0.9:
        assert len(woke) >= 2  # the rule was exercised: a rise, a refractory period, another rise


def test_speech_level_is_the_level_while_speaking_not_over_the_pauses():
    t = np.arange(32000) / 16000
    tone = (0.1 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    gated = tone * ((t % 1.0) < 0.5)  # half a second on, half off
    assert 20 * np.log10(speech_rms(tone) / (0.1 / np.sqrt(2))) == pytest.approx(0, abs=0.1)
    # P.56 counts 0.2 s of hangover after each burst as speech: 0.5 s on in 0.7 s active.
    assert 20 * np.log10(speech_rms(gated) / (0.1 / np.sqrt(2))) == pytest.approx(
        10 * np.log10(0.5 / 0.7), abs=0.3)
    assert speech_rms(np.zeros(1600, np.float32)) == 0.0


def test_noise_is_mixed_at_the_asked_snr_of_the_active_speech_level(phrase_twice):
    speech = phrase_twice[:5 * 16000]
    noise = pink_noise(speech.size, np.random.default_rng(1))
    mixed = with_noise(speech, 10.0, "pink", [], np.random.default_rng(1))
    added = mixed - speech
    assert 20 * np.log10(speech_rms(speech) / np.sqrt(np.mean(added ** 2))) == pytest.approx(10.0, abs=0.1)
    assert np.corrcoef(added, noise)[0, 1] > 0.999


def test_the_wake_phrase_in_babble_at_10_db_wakes_most_times(clip_cache: Path, piper_voice):
    # Issue 23: babble at "10 dB" woke 0 of 12 times in bench hear: the speech level it was mixed
    # against read 4-5 dB high, so the babble was at about 5 dB. At 10 dB below the active speech
    # level, four of our own sentences at once, the default model wakes on 9 of these 12 (8 or 9
    # over four noise draws).
    from benchmarks.clips import COMMANDS
    from benchmarks.wake import EVERYDAY, pad
    from edge_agent.config import WakeSettings

    def say(text: str) -> np.ndarray:
        return load_16k(piper_clip(text, clip_cache, piper_voice))

    pool = [say(t) for t in EVERYDAY[:12]]
    engine = WakeEngine.load(WakeSettings())
    rng = np.random.default_rng(11)
    woke = 0
    for command in COMMANDS:
        engine.reset()
        clean = say(f"Okay Nabu, {command[0].lower()}{command[1:]}")
        woke += bool(engine.feed(pad(with_noise(clean, 10.0, "babble", pool, rng))))
    assert woke >= 7
