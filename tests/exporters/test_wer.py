from exporters.wer import normalize, wer


def test_normalize_ignores_case_and_punctuation_but_keeps_apostrophes():
    assert normalize("Don't stop, Mr. Smith-Jones!") == ["don't", "stop", "mr", "smith", "jones"]


def test_wer_counts_substitutions_insertions_and_deletions_over_the_whole_set():
    refs = ["turn on the lights", "close the door"]
    hyps = ["turn off the lights please", "close door"]
    assert wer(refs, hyps) == 100 * 3 / 7


def test_wer_of_identical_transcripts_is_zero():
    assert wer(["A b."], ["a B"]) == 0.0
