import pytest

from edge_agent.asr.wer import edit_distance, wer, words


def test_case_punctuation_and_number_spelling_do_not_count():
    assert words("Set a timer for 10 minutes!") == words("set a timer for ten minutes")
    assert words("It's 7:30.") == ["it's", "seven", "thirty"]


def test_edits_are_counted_over_reference_words():
    assert edit_distance(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    assert wer(["turn on the light"], ["turn the lights"]) == pytest.approx(2 / 4)
    assert wer(["a b", "c d e f"], ["a b", "c d e f"]) == 0.0
    assert wer([""], ["noise"]) == 1.0
    with pytest.raises(ValueError):
        wer(["a"], [])
