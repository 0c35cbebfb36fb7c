"""The one clip set: what the exporter draws from it, where it is kept, what a cached clip needs."""

from pathlib import Path

import numpy as np
import pytest

from benchmarks import clips as clip_mod
from benchmarks.clips import (
    COMMANDS,
    EXPORT_SET,
    PARAGRAPH,
    PIPER_VOICE,
    clip_settings,
    clips_dir,
    make_set,
    piper_clip,
)
from edge_agent.audio.wav import WavWriter
from edge_agent.config import TtsSettings
from edge_agent.errors import UsageError
from edge_agent.models import ModelStore, load_catalog
from edge_agent.tts.registry import VoiceRegistry


def test_the_exporter_measures_on_commands_of_the_bench_set_three_per_voice_and_the_paragraph():
    texts = [text for text, _ in EXPORT_SET]
    assert set(texts[:-1]) <= set(COMMANDS) and texts[-1] == PARAGRAPH
    engines = [engine for _, engine in EXPORT_SET[:-1]]
    assert engines.count("espeak") == engines.count("piper") == 3


def test_clips_are_kept_under_the_model_cache(tmp_path: Path):
    assert clips_dir(tmp_path / "models") == tmp_path / "models" / "clips"


def test_a_missing_piper_clip_needs_a_voice_and_a_made_one_does_not(tmp_path: Path):
    spec = [("Lock the front door.", "piper")]
    with pytest.raises(UsageError, match="need a loaded voice"):
        make_set(tmp_path, spec)
    writer = WavWriter(clip_mod._piper_path(tmp_path, PIPER_VOICE, spec[0][0]), 22050)
    writer.write(np.full(22050, 0.25, dtype=np.float32))
    writer.close()
    (clip,) = make_set(tmp_path, spec)
    audio = clip.audio()
    assert clip.text == spec[0][0] and clip.duration_s == pytest.approx(1.0, abs=0.01)
    audio[:] = 0.0  # a caller's copy: the next read is unchanged
    assert clip.audio()[8000] == pytest.approx(0.25, abs=1e-3)


def test_an_unknown_engine_is_a_usage_error(tmp_path: Path):
    with pytest.raises(UsageError, match="unknown clip engine 'festival'"):
        make_set(tmp_path, [("Hello.", "festival")])


def test_a_piper_clip_is_the_same_samples_from_every_load_of_the_voice_and_a_noisy_voice_makes_none(
        tmp_path: Path, shared_cache: Path):
    store = ModelStore(shared_cache, load_catalog())
    text = "Lock the front door."
    made = []
    for take in ("a", "b"):  # a fresh voice each time, as on another machine
        registry = VoiceRegistry(store, clip_settings(TtsSettings(threads=2)))
        try:
            made.append(piper_clip(text, tmp_path / take, registry.get(PIPER_VOICE)).read_bytes())
        finally:
            registry.close()
    assert made[0] == made[1]
    registry = VoiceRegistry(store, TtsSettings(threads=2))
    try:
        with pytest.raises(UsageError, match="clips need its noise off"):
            piper_clip(text, tmp_path / "noisy", registry.get(PIPER_VOICE))
    finally:
        registry.close()
