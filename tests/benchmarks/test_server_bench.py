"""`edge-agent bench server` runs end to end against a real `serve` (run with -m bench)."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def test_bench_server_reports_real_time_streams_per_concurrency_and_mode():
    # No deadline: every stream is admitted, so every level's streams all end (a loaded machine
    # would otherwise refuse some, and the counts would vary run by run).
    result = run_cli("bench", "server", "--json", "--concurrency", "1,2", "--sentences", "1",
                     "--deadline-ms", "0", "--voice", "en_US-joe-medium", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report["modes"]) == {"one_at_a_time", "batched"} and report["deadline_ms"] == 0
    for mode in report["modes"].values():
        assert "en_US-joe-medium [on cpu]" in mode["voices"] and mode["providers"] == "cpu"
        assert [level["devices"] for level in mode["levels"]] == [1, 2]
        for level in mode["levels"]:
            assert level["ended"] == level["devices"] and level["errors"] == {}
            assert 0 <= level["real_time"] <= level["devices"]
            assert 0 < level["first_audio_p50_s"] <= level["first_audio_p95_s"]
            assert level["rtf_p50"] > 0 and level["audio_s"] > 0 and level["gpu_memory_mib"] is None


def test_bench_server_refuses_a_bad_concurrency_list():
    result = run_cli("bench", "server", "--concurrency", "1,x", timeout=60)
    assert result.returncode == 2 and "--concurrency" in result.stderr


def test_bench_server_counts_the_streams_beyond_max_streams_apart():
    # Three devices at once against a server that opens two: the third is refused for want of a
    # slot (no deadline, so no other refusal), and the two are served whole.
    result = run_cli("bench", "server", "--json", "--concurrency", "1,3", "--max-streams", "2",
                     "--sentences", "3", "--deadline-ms", "0", "--mode", "batched",
                     "--voice", "en_US-joe-medium", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["max_streams"] == 2 and "server.max_streams 2" in result.stdout
    one, three = report["modes"]["batched"]["levels"]
    assert one["ended"] == 1 and one["errors"] == {}
    assert three["ended"] == 2 and three["errors"] == {"BUSY max_streams": 1}


def test_bench_server_refuses_max_streams_below_one():
    result = run_cli("bench", "server", "--max-streams", "0", timeout=60)
    assert result.returncode == 2 and "--max-streams: 0 is below 1" in result.stderr
