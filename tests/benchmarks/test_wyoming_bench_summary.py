"""What `bench wyoming --wyoming-bench` keeps of wyoming-bench's report: its summary tables, as printed."""

from pathlib import Path

from benchmarks.wyoming import summary

REPORT = Path(__file__).parent / "fixtures" / "wyoming-bench-stt.txt"
"""wyoming-bench 2026.10.0's STT report on our server and wyoming-faster-whisper, as it printed it."""


def test_the_summary_is_the_tables_after_the_heading() -> None:
    kept = summary(REPORT.read_text()).splitlines()
    assert kept[0] == "[non_streaming]"
    assert kept[1].split()[:3] == ["server", "ok", "WER"]
    assert [line.split()[1] for line in kept[2:]] == ["(faster-whisper)", "(edge-speech)"]


def test_a_report_without_a_summary_is_kept_whole() -> None:
    assert summary("wyoming-bench 2026.10.0 (tts)\nno servers answered\n") == (
        "wyoming-bench 2026.10.0 (tts)\nno servers answered")
