"""`edge-agent bench wake` runs end to end and reports both engines side by side (run with -m bench)."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def test_bench_wake_reports_detection_false_accepts_and_cpu_for_both_engines():
    result = run_cli("bench", "wake", "--json", "--hours", "0.0167", "--no-kokoro", "--no-rss",
                     "--no-latency", timeout=1200)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    ours, reference = "microWakeWord (ours)", "openWakeWord 0.5.1 (reference)"
    assert set(report["positives"]) == {ours, reference}
    assert set(report["positives"][ours]["per_model"]) == {"okay_nabu", "hey_jarvis", "alexa", "hey_mycroft"}
    assert set(report["positives"][reference]["per_model"]) == {"hey_jarvis", "alexa", "hey_mycroft"}
    for side in (ours, reference):
        assert set(report["positives"][side]["overall"]) == {"clean", "20dB", "10dB", "0dB"}
        assert report["negatives"][side]["cpu_percent"] > 0
        assert report["negatives"][side]["audio_h"] == pytest.approx(1 / 60, abs=0.001)  # one 60 s segment
    assert report["chime_latency"]["runs"] == 10
    assert {"detection_clean", "detection_10db", "detection_0db", "false_accepts_per_hour",
            "cpu_percent"} <= set(report["goals"])
    points = report["operating_points"]["okay_nabu"]
    assert {"shipped", "chosen", "curve"} <= set(points)
    assert {p["window"] for p in points["curve"]} >= {1, 3, 5, 8}
