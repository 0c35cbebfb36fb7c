"""`edge-agent bench startup`: both programs in fresh processes, reported side by side (-m bench)."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def test_bench_startup_reports_say_and_the_piper_cli_side_by_side():
    result = run_cli("bench", "startup", "--json", "--repeats", "1", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for side in ("ours", "piper"):
        assert report[side]["wall_s"] > 0 and report[side]["cpu_s"] > 0 and report[side]["peak_rss_mb"] > 50
    assert report["ratio"] == pytest.approx(report["ours"]["wall_s"] / report["piper"]["wall_s"])
    rss = report["ours"]["peak_rss_mb"] / report["piper"]["peak_rss_mb"]
    assert report["rss_ratio"] == pytest.approx(rss)


def test_bench_startup_refuses_zero_repeats():
    result = run_cli("bench", "startup", "--repeats", "0")
    assert result.returncode == 2 and "--repeats" in result.stderr
