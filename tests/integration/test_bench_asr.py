"""`edge-agent bench asr` runs end to end and reports what the issue asks for (no thresholds here)."""

import json

import pytest

from tests.speech_fixtures import run_cli

pytestmark = pytest.mark.slow


def test_bench_asr_reports_ratios_wer_latency_vad_and_peak_rss(whisper_dir):
    fetched = run_cli("models", "fetch", "silero-vad", timeout=300)  # the bench measures it where present
    assert fetched.returncode == 0, fetched.stderr
    result = run_cli("bench", "asr", "--json", "--clips", "2", "--voices", "espeak", "--repeats", "1",
                     "--variants", "int8", "--set", f"asr.model={whisper_dir}", "--set", "asr.variant=int8",
                     timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    engines = report["engines"]
    assert {"ours-int8", "ours-int8-full30s"} <= set(engines)
    assert report["clips"] == 2 and 0 < engines["ours-int8"]["rtf"] < 5
    assert 0 <= engines["ours-int8"]["wer"] <= 0.5
    if "faster-whisper-int8" in engines:
        assert report["ratio"] == pytest.approx(
            engines["ours-int8"]["total_s"] / engines["faster-whisper-int8"]["total_s"])
    if "torch-fp32" in engines:
        assert report["torch_ratio"] > 0
    assert report["latency"]["utterances"] == 2 and report["latency"]["median_s"] >= 0.5
    assert report["vad"]["webrtc"]["utterances"] == 2
    assert report["vad"]["silero"]["utterances"] == 2
    assert report["peak_rss_mb"] > 50
    assert report["rss"]["transcripts"]
    # The peak counts a decode in the retry window, which any unsure command may need.
    rss_stages = report["rss"]["stages"]
    assert rss_stages["retried"] >= rss_stages["transcribed"]
    assert report["peak_rss_mb"] >= rss_stages["retried"]
    stages = engines["ours-int8"]["stages_s"]
    assert stages["encoder"] > 0 and stages["decoder"] > 0 and stages["ms_per_decoder_step"] > 0
    assert report["reference_padding"].startswith("30 s")
    goals = report["goals"]
    assert set(goals) == {"ratio", "torch_ratio", "peak_rss_mb"}
    assert goals["peak_rss_mb"]["met"] == (report["peak_rss_mb"] <= goals["peak_rss_mb"]["target"])
    if report["ratio"] is not None:
        wer_ok = goals["ratio"]["wer_le_faster_whisper"]
        assert goals["ratio"]["met"] == (report["ratio"] <= goals["ratio"]["target"] and wer_ok)


def test_bench_asr_refuses_a_variant_that_was_not_exported(whisper_dir):
    result = run_cli("bench", "asr", "--variants", "int2", "--set", f"asr.model={whisper_dir}")
    assert result.returncode == 2 and "int2 not exported" in result.stderr
