import jiwer
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.text.wer import edit_distance, wer, words


def test_case_punctuation_and_number_spelling_do_not_count():
    assert words("Set a timer for 10 minutes!") == words("set a timer for ten minutes")
    assert words("It's 7:30.") == ["it's", "seven", "thirty"]
    assert wer(["Turn the volume to 21%."], ["turn the volume to twenty one percent"]) == 0.0


def test_apostrophes_inside_words_stay_and_hyphens_split():
    assert words("Don't stop, Smith-Jones!") == ["don't", "stop", "smith", "jones"]
    assert words("'quoted' words") == ["quoted", "words"]


def test_letters_outside_ascii_stay_part_of_their_word():
    assert words("Café Müller, señor") == ["café", "müller", "señor"]


def test_edits_are_counted_over_reference_words_of_the_whole_set():
    assert edit_distance(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    assert wer(["turn on the light"], ["turn the lights"]) == pytest.approx(2 / 4)
    refs = ["turn on the lights", "close the door"]
    hyps = ["turn off the lights please", "close door"]
    assert wer(refs, hyps) == pytest.approx(3 / 7)
    assert wer(["a b", "c d e f"], ["a b", "c d e f"]) == 0.0


def test_the_unit_is_a_fraction_that_insertions_can_push_past_one():
    assert wer(["stop"], ["please stop it now"]) == 3.0


def test_empty_references_and_mismatched_lengths():
    assert wer([""], ["noise"]) == 1.0
    assert wer([""], [""]) == 0.0
    with pytest.raises(ValueError, match="1 references but 0 hypotheses"):
        wer(["a"], [])


_WORDS = st.sampled_from(["on", "off", "the", "light", "door", "kitchen", "open", "close"])
_SENTENCES = st.lists(_WORDS, min_size=0, max_size=8).map(" ".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_SENTENCES.filter(bool), _SENTENCES), min_size=1, max_size=4))
def test_wer_equals_jiwer_on_the_same_words(pairs):
    refs, hyps = [r for r, _ in pairs], [h for _, h in pairs]
    assert wer(refs, hyps) == pytest.approx(jiwer.wer(refs, hyps))


def test_wer_equals_jiwer_on_transcripts_after_our_normalisation():
    refs = ["Set a timer for 10 minutes.", "It is 7:30 pm and 21°C outside!", "Dr. Smith's dog barked."]
    hyps = ["set the timer for ten minute", "it is seven thirty p m and twenty one degrees",
            "doctor smith dog"]
    spoken = [" ".join(words(t)) for t in refs], [" ".join(words(t)) for t in hyps]
    assert wer(refs, hyps) == pytest.approx(jiwer.wer(*spoken))
