"""`edge-agent bench tts` runs end to end and reports ours against piper-tts (run with -m bench)."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def test_bench_tts_reports_both_sides_and_the_ratios():
    result = run_cli("bench", "tts", "--json", "--repeats", "1", "--pause", "0", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["reference"] == "piper-tts 1.2.0" and report["pause_s"] == 0
    for key in ("ttfa_s", "total_s", "rtf", "reference_total_s", "ratio", "ttfa_ratio"):
        assert report[key] > 0, key
    assert report["ratio"] == pytest.approx(report["total_s"] / report["reference_total_s"])
    for text in report["texts"].values():
        assert 0 < text["ttfa"] <= text["total"] and text["audio_s"] > 1
