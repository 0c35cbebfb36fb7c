"""`listen.remote.RemoteRouter`: a streamed turn goes to the first taker streaming at its wake word."""

import numpy as np

from edge_agent.asr.transcriber import Transcript
from edge_agent.listen.hearing import Heard, Streamed, TurnEnded, Woke
from edge_agent.listen.remote import RemoteRouter
from edge_agent.wake.engine import Detection

DETECTION = Detection("okay_nabu", "Okay Nabu", 3.2, 0.97)


class Taker:
    """A `RemoteTurns` that records the turns handed to it."""

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.got: list[tuple] = []

    def begin_turn(self, conversation_id, wake_model, wake_word, timestamp_s):
        self.got.append(("begin", conversation_id, wake_model, wake_word, timestamp_s))

    def audio(self, conversation_id, samples):
        self.got.append(("audio", conversation_id, len(samples)))

    def end_turn(self, conversation_id):
        self.got.append(("end", conversation_id))


def test_a_streamed_turn_goes_whole_to_the_first_taker_streaming_at_its_wake_word():
    idle, first, second = Taker(False), Taker(True), Taker(True)
    ended: list[str] = []
    router = RemoteRouter(lambda: [idle, first, second], ended.append)
    assert router.streaming()
    router.woke(Woke(DETECTION, "c1", streamed=True))
    first.streaming = False  # a controller going away mid-turn does not move the turn
    router.streamed(Streamed(np.zeros(320, dtype=np.float32), "c1"))
    router.turn_ended(TurnEnded("c1", "ended", 5.0))
    assert first.got == [("begin", "c1", "okay_nabu", "Okay Nabu", 3.2), ("audio", "c1", 320), ("end", "c1")]
    assert idle.got == [] and second.got == [] and ended == []
    router.streamed(Streamed(np.zeros(320, dtype=np.float32), "c1"))  # after the turn: nowhere
    assert len(first.got) == 3


def test_with_no_taker_streaming_the_turn_is_ended_at_once():
    idle = Taker(False)
    ended: list[str] = []
    router = RemoteRouter(lambda: [idle], ended.append)
    assert not router.streaming()
    router.woke(Woke(DETECTION, "c2", streamed=True))
    assert ended == ["c2"] and idle.got == []


def test_a_turn_heard_on_the_device_is_none_of_the_takers_business():
    taker = Taker(True)
    router = RemoteRouter(lambda: [taker], [].append)
    router.woke(Woke(DETECTION, "c3"))
    router.heard(Heard(Transcript("hi", 0.0, 1.0), "c3", "Okay Nabu"))
    router.turn_ended(TurnEnded("c3", "heard", 2.0))
    assert taker.got == []
