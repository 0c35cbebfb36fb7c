"""The conversation turn (`listen.turn.Conversation`) over a real announcer: barge-in, hold and
release around a turn, the own-voice guard of `listen.mode: always`, reply turns, the fan-out."""

import json
import threading
from dataclasses import replace

import pytest

from edge_agent.announce.journal import Journal
from edge_agent.announce.pipeline import Announcer, Speaking
from edge_agent.announce.playout import DirOpener
from edge_agent.asr.transcriber import Transcript
from edge_agent.config import AnnouncementSettings, Settings
from edge_agent.listen.hearing import Heard, Streamed, TurnEnded, Woke
from edge_agent.listen.turn import Conversation, HearObserver, RemoteHeard
from edge_agent.metrics import Metrics
from edge_agent.wake.engine import Detection
from tests.mqtt_support import GatedOpener, ToneSynth
from tests.waiting import wait_until

WOKE = Woke(Detection("okay_nabu", "Okay Nabu", 3.2, 0.97), "c1")


class Told(HearObserver):
    """Records what it is told, by method name; a later observer records into the same list."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def woke(self, event):
        self.log.append((self.name, "woke", event))

    def streamed(self, event):
        self.log.append((self.name, "streamed", event))

    def heard(self, event):
        self.log.append((self.name, "heard", event))

    def remote_heard(self, event):
        self.log.append((self.name, "remote_heard", event))

    def turn_ended(self, event):
        self.log.append((self.name, "turn_ended", event))


class Turns:
    def __init__(self, tmp_path, opener=None, settings=None):
        s = AnnouncementSettings(state_dir=tmp_path / "state")
        self.announcer = Announcer(Speaking(s, ToneSynth(), opener or DirOpener(tmp_path / "out"),
                                            frozenset()), Journal(s.state_dir, s))
        self.announcer.recover()
        self.settings = settings or Settings()
        self.told: list = []
        self.chimes: list[str] = []
        self.chimed = threading.Event()
        self.opened: list[str] = []
        self.listening = True
        self.metrics = Metrics()
        self.turns = Conversation(self.announcer, lambda: self.settings, self.metrics,
                                  [Told("first", self.told), Told("second", self.told)],
                                  chime=self._chime, open_turn=self._open)

    def _chime(self, name):
        self.chimes.append(name)
        self.chimed.set()

    def _open(self, conversation_id):
        if self.listening:
            self.opened.append(conversation_id)
        return self.listening

    def send(self, doc):
        assert self.announcer.submit(json.dumps(doc).encode(), "edge/dev/announce")

    def close(self):
        self.turns.close()
        self.announcer.stop()


@pytest.fixture
def make(tmp_path):
    made = []

    def build(**kw):
        made.append(Turns(tmp_path, **kw))
        return made[-1]
    yield build
    for turns in made:
        turns.close()


def settings(wake=None, listen=None):
    base = Settings()
    return replace(base, wake=replace(base.wake, **(wake or {})),
                   listen=replace(base.listen, **(listen or {})))


def speaking(make, tmp_path, **kw):
    """A conversation whose announcer is in the middle of speaking `news` (held at its first sentence)."""
    opener = GatedOpener(tmp_path / "out", gated="news")
    t = make(opener=opener, **kw)
    t.announcer.start()
    t.send({"id": "news", "text": "One. Two."})
    assert opener.entered.wait(30)
    assert t.announcer.busy.is_set()
    return t, opener


def test_a_wake_word_is_accepted_while_quiet_and_barges_in_while_speaking_unless_told_to_ignore(
        make, tmp_path):
    quiet = make()
    assert quiet.turns.accept_wake(WOKE.detection)
    barge, opener = speaking(make, tmp_path)
    assert barge.turns.accept_wake(WOKE.detection)
    barge.settings = settings(wake={"during_playback": "ignore"})  # read at each wake word
    assert not barge.turns.accept_wake(WOKE.detection)
    opener.gate.set()


def test_a_wake_word_holds_the_announcer_tells_every_observer_in_order_and_chimes(make):
    t = make(settings=settings(wake={"chime": True}))
    t.turns.on_event(WOKE)
    assert t.announcer.held
    assert t.told == [("first", "woke", WOKE), ("second", "woke", WOKE)]
    assert t.chimed.wait(10) and t.chimes == ["wake-c1"]
    assert t.metrics.snapshot()["counters"]["wakes"] == 1


def test_no_chime_when_wake_chime_is_off(make):
    t = make(settings=settings(wake={"chime": False}))
    t.turns.on_event(WOKE)
    t.turns.on_event(TurnEnded("c1", "timeout", 4.0))
    wait_until(lambda: not t.announcer.held, what="released")
    assert t.chimes == []


def test_the_end_of_a_turn_releases_the_hold_after_the_answer_wait(make):
    t = make(settings=settings(listen={"answer_wait_s": 0.05}))
    t.turns.on_event(WOKE)
    ended = TurnEnded("c1", "heard", 4.8)
    t.turns.on_event(ended)
    assert t.told[-2:] == [("first", "turn_ended", ended), ("second", "turn_ended", ended)]
    wait_until(lambda: not t.announcer.held, what="the hold released after answer_wait_s")


def test_an_answer_releases_the_hold_at_once_without_waiting_for_the_answer_wait(make):
    t = make(settings=settings(listen={"answer_wait_s": 120.0}))
    t.turns.on_event(WOKE)
    t.turns.on_event(TurnEnded("c1", "heard", 4.8))
    t.turns.on_event(Woke(WOKE.detection, "c2"))  # a second command before the first is answered
    t.turns.on_event(TurnEnded("c2", "heard", 9.0))
    assert t.announcer.held
    t.turns.on_announce_status({"id": "a", "state": "speaking", "conversation_id": "c2"})
    assert t.announcer.held  # only a final state is the answer
    t.turns.on_announce_status({"id": "b", "state": "done"})
    assert t.announcer.held  # an announcement outside the conversation is no answer
    t.turns.on_announce_status({"id": "a", "state": "done", "conversation_id": "c2"})
    assert not t.announcer.held


def test_an_announcement_expecting_a_reply_opens_a_turn_when_it_is_over(make):
    t = make()
    t.turns.on_announce_status({"id": "ask", "state": "speaking", "expect_reply": True})
    assert t.opened == []
    t.turns.on_announce_status({"id": "ask", "state": "done", "expect_reply": True})
    t.turns.on_announce_status({"id": "ask2", "state": "failed", "expect_reply": True,
                                "conversation_id": "c7"})
    assert t.opened == ["ask", "c7"]
    t.listening = False
    t.turns.on_announce_status({"id": "ask3", "state": "done", "expect_reply": True})
    assert t.opened == ["ask", "c7"]


def test_in_mode_always_a_transcript_while_speaking_is_own_voice_and_dropped(make, tmp_path):
    t, opener = speaking(make, tmp_path)
    own = Heard(Transcript("one two", 0.0, 1.0))
    t.turns.on_event(own)
    assert t.told == [] and "transcripts" not in t.metrics.snapshot()["counters"]
    command = Heard(Transcript("what time is it", 3.4, 4.5), "c1", "Okay Nabu")
    t.turns.on_event(command)  # a turn's command is never taken for our voice
    assert t.told == [("first", "heard", command), ("second", "heard", command)]
    assert t.metrics.snapshot()["counters"]["transcripts"] == 1
    opener.gate.set()


def test_a_transcript_when_quiet_and_a_remote_transcript_reach_every_observer(make):
    t = make()
    t.announcer.last_spoke = float("-inf")
    heard = Heard(Transcript("hello", 0.0, 1.0))
    t.turns.on_event(heard)
    t.turns.remote_heard("turn on the lights", "c3", "Okay Nabu")
    remote = RemoteHeard("turn on the lights", "c3", "Okay Nabu")
    assert t.told == [("first", "heard", heard), ("second", "heard", heard),
                      ("first", "remote_heard", remote), ("second", "remote_heard", remote)]
    assert t.metrics.snapshot()["counters"]["transcripts"] == 2


def test_streamed_audio_goes_to_the_observers_and_touches_no_hold(make):
    import numpy as np

    t = make()
    block = Streamed(np.zeros(160, dtype=np.float32), "c1")
    t.turns.on_event(block)
    assert t.told == [("first", "streamed", block), ("second", "streamed", block)]
    assert not t.announcer.held


@pytest.mark.parametrize("told", ["after the end of the turn", "before the end of the turn"])
def test_a_run_the_remote_side_ends_without_an_answer_releases_the_hold_without_the_answer_wait(
        make, told):
    t = make(settings=settings(listen={"answer_wait_s": 120.0}))
    states: list[str] = []
    t.announcer.observe(lambda doc: states.append(doc["state"]) if doc["id"] == "meanwhile" else None)
    t.turns.on_event(WOKE)
    t.announcer.start()
    t.send({"id": "meanwhile", "text": "Meanwhile."})
    if told == "before the end of the turn":  # Home Assistant's error while the command streams
        t.turns.unanswered("c1")
        assert t.announcer.held and states == ["queued"]  # the turn still listens: nothing over it
    t.turns.on_event(TurnEnded("c1", "ended", 4.8))
    if told == "after the end of the turn":
        assert t.announcer.held  # an answer may still come
        t.turns.unanswered("c2")  # another conversation's run: no answer of this one's
        assert t.announcer.held and states == ["queued"]
        t.turns.unanswered("c1")
    wait_until(lambda: "done" in states, what="the announcement spoken once the run ended")
    assert not t.announcer.held


def test_a_run_ended_without_an_answer_does_not_release_the_next_turns_hold(make):
    t = make(settings=settings(listen={"answer_wait_s": 120.0}))
    t.turns.on_event(WOKE)
    t.turns.on_event(TurnEnded("c1", "ended", 4.8))
    t.turns.on_event(Woke(WOKE.detection, "c2"))  # the next command, before c1's run ended
    t.turns.unanswered("c1")
    assert t.announcer.held
    t.turns.on_event(TurnEnded("c2", "ended", 9.0))
    assert t.announcer.held  # c2's answer may still come
