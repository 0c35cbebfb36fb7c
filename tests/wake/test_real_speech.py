"""The built-in wake models on real people (`tests/data/real/NOTICE.md`), as recorded.

The clips are the held-out part of the benches' real `alexa` set (no cutoff was chosen on them)
and other words said by people. `bench hear --real` measures the same sets whole, in the room.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from edge_agent.wake import WakeEngine
from edge_agent.wake.models import builtin_dir
from edge_agent.wake.settings import WAKE_BUILTIN, WakeSettings

REAL = Path(__file__).resolve().parents[1] / "data" / "real" / "wake"
RATE = 16000


def said(path: Path) -> np.ndarray:
    """A recording with a second of quiet on each side (a clip may start at its first word)."""
    x, rate = soundfile.read(str(path), dtype="float32")
    assert rate == RATE
    pad = np.zeros(RATE, dtype=np.float32)
    return np.concatenate([pad, x, pad])


def woken(engine: WakeEngine, path: Path) -> set[str]:
    engine.reset()
    return {d.model for d in engine.feed(said(path))}


@pytest.fixture(scope="module")
def every_model():
    engine = WakeEngine.load(WakeSettings(models=WAKE_BUILTIN))
    yield engine
    engine.close()


def test_every_held_out_real_alexa_wakes_the_alexa_model_and_no_other(every_model: WakeEngine) -> None:
    clips = sorted((REAL / "alexa").glob("*.flac"))
    assert len(clips) == 16
    heard = {clip.name: woken(every_model, clip) for clip in clips}
    assert heard == {clip.name: {"alexa"} for clip in clips}


def test_alexa_never_wakes_on_other_words_said_by_real_people(every_model: WakeEngine) -> None:
    clips = sorted((REAL / "near").glob("*/*.flac"))
    assert len(clips) == 24
    assert [clip.name for clip in clips if "alexa" in woken(every_model, clip)] == []


def test_alexa_s_cutoff_is_the_one_chosen_on_real_people_and_the_config_still_overrides_it() -> None:
    from edge_agent.wake.models import TUNED_CUTOFFS, read_config, resolve

    own = read_config(builtin_dir() / "alexa.json", builtin=True).probability_cutoff
    assert (own, TUNED_CUTOFFS) == (0.9, {"alexa": 0.85})
    assert resolve("alexa").probability_cutoff == 0.85
    assert resolve("alexa", {"alexa": 0.95}).probability_cutoff == 0.95
    assert resolve("okay_nabu").probability_cutoff == 0.85  # its own: no real "Okay Nabu" to tune on
