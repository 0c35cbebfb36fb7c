"""`edge-agent bench turn`: end of speech -> transcript, live through a FIFO, VAD-only and the model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from benchmarks.turn import kept, measure, summarise, trimmed, turn_clip
from tests.speech_fixtures import run_cli, silence

COMMAND = "Turn off all the lights downstairs."


def test_words_kept_counts_the_references_words_found_once_each():
    assert kept("Call mom. Tell her I'm running late.", "Call mom.") == (2, 7)
    assert kept("Turn it up.", "turn turn it up") == (3, 3)
    assert kept("Set a timer for 10 minutes.", "Set a timer for ten minutes") == (6, 6)


def test_trimmed_drops_the_silence_after_the_speech_and_optionally_before():
    audio = np.concatenate([silence(0.2), np.full(100, 0.5, dtype=np.float32), silence(0.3)])
    assert trimmed(audio).size == 3200 + 100
    assert trimmed(audio, keep_start=False).size == 100


def test_one_sentence_ends_sooner_with_the_model_live_through_a_fifo(whisper_dir, turn_model, shared_cache,
                                                                     clip_cache: Path, piper_voice):
    audio = load_16k(piper_clip(f"Okay Nabu. {COMMAND}", clip_cache, piper_voice))
    clip = turn_clip("piper", audio, (COMMAND,))
    passed = ["--set", f"asr.model={whisper_dir}", "--set", f"models.cache_dir={shared_cache}"]
    result = summarise(measure([clip], passed), [clip])
    vad, model = result["vad"], result["model"]
    assert vad["missed"] == model["missed"] == 0, result
    assert vad["words_kept"] == model["words_kept"] == 1.0, (vad["heard"], model["heard"])
    # Where the turn ended, in audio after the speech: the VAD waits its 500 ms hangover, the model
    # ends the turn at the 150 ms pause. Positions in the stream, so load on the machine cannot move them.
    assert model["decided_after_p50_s"] < vad["decided_after_p50_s"] - 0.2, result
    # The transcript itself also waits for Whisper, whose time a loaded machine stretches: generous.
    assert model["p50_s"] < 3.0, model["latencies_s"]


@pytest.mark.bench
def test_bench_turn_reports_both_ends_side_by_side(whisper_dir, turn_model, shared_cache):
    result = run_cli("bench", "turn", "--json", "--one", "1", "--two", "1", "--voices", "piper:joe",
                     "--set", f"asr.model={whisper_dir}", "--set", f"models.cache_dir={shared_cache}",
                     timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["bench"] == "turn" and report["clips"] == 2
    for end in ("vad", "model"):
        assert report[end]["turns"] == 2 and report[end]["cpu_cores"] > 0 and report[end]["peak_rss_mb"] > 0
    assert {"p50_le_0.30", "p90_le_0.50", "two_sentence_words_kept_ge_vad", "rss_le_330_mb"} == set(
        report["goals"])
