from edge_agent.tts.sentences import split_sentences


def test_splits_on_terminal_punctuation_before_a_capital():
    assert split_sentences("Dinner is ready. Come down! Are you there?") == [
        "Dinner is ready.", "Come down!", "Are you there?"]


def test_closing_quotes_stay_with_their_sentence():
    assert split_sentences('He said "stop." Then he left.') == ['He said "stop."', "Then he left."]


def test_lowercase_after_a_period_does_not_split():
    assert split_sentences("Version 2.5 is out. e.g. this stays") == [
        "Version 2.5 is out. e.g. this stays"]


def test_blank_lines_split_and_single_newlines_join():
    assert split_sentences("First part\ncontinues\n\nSecond part") == [
        "First part continues", "Second part"]


def test_overlong_sentences_are_cut_at_clauses_then_words():
    long = ", ".join(["the quick brown fox jumps"] * 40) + "."
    pieces = split_sentences(long, max_chars=120)
    assert all(len(p) <= 120 for p in pieces)
    assert " ".join(pieces).replace(" ", "") == long.replace(" ", "")
    words = split_sentences("word " * 100, max_chars=50)
    assert all(len(p) <= 50 for p in words) and sum(len(p.split()) for p in words) == 100


def test_empty_and_whitespace_give_nothing():
    assert split_sentences("") == []
    assert split_sentences("  \n\n  ") == []


def test_split_complete_releases_a_sentence_only_once_the_next_one_has_begun():
    from edge_agent.tts.sentences import split_complete

    assert split_complete("It is late.") == ("", "It is late.")
    assert split_complete("It is late. The") == ("It is late.", "The")
    assert split_complete("One. Two! Three? Fo") == ("One. Two! Three?", "Fo")
    assert split_complete("3.5 degrees") == ("", "3.5 degrees")


def test_a_word_longer_than_a_sentence_is_cut_into_pieces_never_shortened():
    url = "https://example.com/" + "x" * 1000
    cjk = "日本語のテキスト" * 100  # no spaces at all
    for text in (f"Open {url} now.", cjk):
        pieces = split_sentences(text)
        assert all(len(p) <= 300 for p in pieces) and len(pieces) > 1
        assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
