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
