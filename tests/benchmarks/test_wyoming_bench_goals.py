"""`bench wyoming` judges each ratio by its own goal: TTS rows at 0.8 of wyoming-piper, the rest at 0.5."""

from benchmarks.wyoming import GOAL, TTS_GOAL, goal, lines


def test_tts_rows_are_held_to_the_tts_goal_and_the_rest_to_half() -> None:
    assert (TTS_GOAL, GOAL) == (0.8, 0.5)
    assert goal("tts_short_first_audio") == goal("tts_streamed_total") == TTS_GOAL
    assert goal("asr_latency") == GOAL


def test_the_report_says_which_goal_each_ratio_met() -> None:
    report = {"repeats": 1, "clips": 1, "load": 0.5, "pause_s": 0.1, "tts": {}, "asr": {},
              "ratios": {"tts_short_total": 0.7, "asr_latency": 0.7, "wer_delta": 0.01}}
    out = lines(report)
    assert "  tts_short_total              0.700  (goal <= 0.8: met)" in out
    assert "  asr_latency                  0.700  (goal <= 0.5: missed)" in out
    assert any(line.startswith("  wer_delta") and "goal" not in line for line in out)
