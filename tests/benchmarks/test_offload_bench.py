"""`edge-agent bench offload` runs end to end and reports its ratios (run with -m bench)."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def test_bench_offload_reports_wire_ratios_and_first_audio():
    result = run_cli("bench", "offload", "--json", "--repeats", "1", "--skip-throughput",
                     "--voice", "en_US-joe-medium", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    wire = report["wire"]
    assert wire["opus_ratio"] < 0.15
    assert 0.85 < wire["pcm16_ratio"] < 1.0
    assert 140 < wire["wyoming_overhead_per_chunk"] < 170
    assert report["first_audio"]["local_s"] > 0
