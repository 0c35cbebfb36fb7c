"""The pace that holds live input to a bounded multiple of real time."""

from edge_agent.audio.pace import Pace


def test_pace_lets_a_head_start_through_then_holds_audio_to_its_speed() -> None:
    pace = Pace(speed=2.0, burst_s=2.0, now=100.0)
    assert pace.wait_s(2.0, 100.0) == 0.0  # the head start
    assert pace.wait_s(1.0, 100.0) == 0.5  # then 1 s of audio per 0.5 s at twice real time
    assert pace.wait_s(1.0, 100.5) == 0.5  # waited its turn: the next second is due at 101.0
    assert pace.wait_s(1.0, 110.0) == 0.0  # a pause earns the head start back, no more
    assert pace.wait_s(2.0, 110.0) == 0.5
