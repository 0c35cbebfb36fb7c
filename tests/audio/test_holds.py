from edge_agent.audio.holds import Holds


def test_overlapping_reasons_nest_and_the_music_comes_back_only_when_the_last_is_released():
    holds = Holds(duck_level=0.25)
    assert holds.hold("ducked", "announcement:a", on=True) == "ducked"
    assert holds.hold("ducked", "turn:t", on=True) is None  # already ducked: nothing to say
    assert holds.hold("ducked", "announcement:a", on=False) is None
    assert holds.ducked and holds.gain(0.8) == 0.8 * 0.25
    assert holds.hold("ducked", "turn:t", on=False) == "no longer ducked"
    assert not holds.ducked and holds.gain(0.8) == 0.8


def test_a_pause_silences_whatever_ducks_and_a_reason_released_twice_is_released_once():
    holds = Holds(duck_level=0.5)
    holds.hold("ducked", "speech", on=True)
    assert holds.hold("paused", "turn:t", on=True) == "paused"
    assert holds.gain(1.0) == 0.0
    assert holds.hold("paused", "turn:t", on=False) == "no longer paused"
    assert holds.hold("paused", "turn:t", on=False) is None
    assert holds.gain(1.0) == 0.5
