"""The one clip set: what the exporter draws from it, where it is kept, what a cached clip needs."""

from pathlib import Path

import numpy as np
import pytest

from edge_agent.audio.wav import WavWriter
from edge_agent.bench import clips as clip_mod
from edge_agent.bench.clips import COMMANDS, EXPORT_SET, PARAGRAPH, PIPER_VOICE, clips_dir, make_set
from edge_agent.errors import UsageError


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
