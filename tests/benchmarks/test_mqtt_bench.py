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


@pytest.mark.parametrize("topic", ["announce", "hermes"])
def test_bench_mqtt_burst_times_acknowledgement_on_slow_storage(topic):
    result = run_cli("bench", "mqtt", "--json", "--burst", "60", "--burst-topic", topic,
                     "--fsync-delay-ms", "20", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["burst"], report["burst_topic"], report["fsync_delay_ms"]) == (60, topic, 20.0)
    assert 0 < report["p50_acknowledged_s"] <= report["all_acknowledged_s"]
    # Group commit: the burst shares its fsyncs, whatever topic it came on (one each before).
    assert 1 <= report["journal_fsyncs"] < 60 // 2, report
