"""`edge-agent bench tts` runs end to end and reports ours against piper-tts 1.8.0 (run with -m bench: it
builds the peers' venv), and against piper-tts 1.2.0 where that is installed here."""

import importlib.metadata
import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def _installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_bench_tts_reports_both_sides_and_the_ratios():
    result = run_cli("bench", "tts", "--json", "--repeats", "1", "--pause", "0", timeout=1200)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["reference"] == "piper-tts 1.8.0" and report["pause_s"] == 0
    for key in ("ttfa_s", "total_s", "rtf", "reference_total_s", "ratio", "ttfa_ratio"):
        assert report[key] > 0, key
    assert report["ratio"] == pytest.approx(report["total_s"] / report["reference_total_s"])
    for text in report["texts"].values():
        assert 0 < text["ttfa"] <= text["total"] and text["audio_s"] > 1
        assert 0 < text["ref_ttfa"] <= text["ref_total"]
    old = report["reference_1_2"]
    assert (old is not None) == ((_installed("piper-tts") or "").startswith("1.2."))
    if old is not None:
        assert old["name"] == "piper-tts 1.2.0"
        assert old["ratio"] == pytest.approx(report["total_s"] / old["total_s"])
