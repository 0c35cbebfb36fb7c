"""The default padding against Whisper's 30 s window over a sweep of commands, voices and speeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.asr.whisper import Padding
from edge_agent.config import AsrSettings
from tests.asr.sweep import ESPEAK_VOICES, PIPER_SPEEDS, TEXTS, clips, sweep

pytestmark = pytest.mark.slow


def test_no_default_transcript_is_more_than_a_word_shorter_than_the_full_window_one(
        whisper, clip_cache: Path, shared_cache: Path):
    clip_list = clips(clip_cache, shared_cache)
    assert len(clip_list) == len(TEXTS) * (len(PIPER_SPEEDS) + len(ESPEAK_VOICES)) >= 100
    results = sweep(whisper, Padding.from_settings(AsrSettings()), clip_list)
    lost = [(r.voice, r.default, r.full) for r in results if r.lost > 1]
    assert not lost, lost
