"""`edge-agent bench wyoming` runs end to end against the peers (run with -m bench: it builds their venv)."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def test_bench_wyoming_reports_every_figure_and_ratio(shared_cache: Path, whisper_dir: Path) -> None:
    result = run_cli("bench", "wyoming", "--json", "--repeats", "1", "--clips", "1",
                     "--set", f"models.cache_dir={shared_cache}", "--set", f"asr.model={whisper_dir}",
                     timeout=1200)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report["tts"]) == {"ours", "wyoming-piper"}
    assert set(report["asr"]) == {"ours", "wyoming-faster-whisper"}
    for side in report["tts"].values():
        for figures in side.values():
            assert 0 < figures["first_audio_s"] <= figures["total_s"] and figures["audio_s"] > 1
    assert {"tts_streamed_first_audio", "asr_latency", "wer_delta"} <= set(report["ratios"])


def test_wyoming_bench_runs_on_the_same_servers(shared_cache: Path, whisper_dir: Path) -> None:
    result = run_cli("bench", "wyoming", "--json", "--repeats", "1", "--clips", "1", "--wyoming-bench",
                     "--wyoming-bench-rounds", "1",
                     "--set", f"models.cache_dir={shared_cache}", "--set", f"asr.model={whisper_dir}",
                     timeout=2400)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    tts, stt = report["wyoming_bench"]["tts"], report["wyoming_bench"]["stt"]
    assert "(edge-speech)" in tts and "(piper)" in tts and "[streaming]" in tts
    assert "(edge-speech)" in stt and "(faster-whisper)" in stt and "WER" in stt
