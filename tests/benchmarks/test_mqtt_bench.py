"""`edge-agent bench mqtt` runs end to end and reports latency against its reference (run with -m bench)."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def test_bench_mqtt_reports_percentiles_and_the_overhead_against_direct_synthesis():
    result = run_cli("bench", "mqtt", "--json", "--count", "5", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["count"] == 5
    assert 0 < report["p50_s"] <= report["p95_s"] <= report["max_s"]
    assert report["reference_p50_s"] > 0 and report["ratio"] > 0
    assert report["goal_p95_s"] == 0.3 and isinstance(report["goal_met"], bool)
    assert len(report["loadavg_1min"]) == 2
