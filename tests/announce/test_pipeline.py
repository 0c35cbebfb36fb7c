import json
import os
import threading
import time

import pytest

from edge_agent.announce.journal import Journal
from edge_agent.announce.pipeline import Announcer, Speaking
from edge_agent.announce.playout import DirOpener
from edge_agent.atomic import AppendFile
from edge_agent.config import AnnouncementSettings
from tests.conftest import FlakyWrites
from tests.mqtt_support import GatedOpener, ToneSynth, wait_until, wav_levels

VOICES = frozenset({"en_US-joe-medium"})


class Pipeline:
    def __init__(self, tmp_path, opener=None, synth=None, disk=None, **settings):
        self.statuses: list[dict] = []
        self.lock = threading.Lock()
        self.out = tmp_path / "out"
        self.synth = synth or ToneSynth()
        self.opener = opener or DirOpener(self.out)
        s = AnnouncementSettings(state_dir=tmp_path / "state", **settings)
        self.service = Announcer(Speaking(s, self.synth, self.opener, VOICES), Journal(
            s.state_dir, s, open_file=lambda path: AppendFile(path, write=disk or os.write)))
        self.service.observe(self._publish)
        self.service.recover()

    def _publish(self, doc):
        with self.lock:
            self.statuses.append(doc)

    def send(self, doc):
        payload = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        return self.service.submit(payload, "edge/dev/announce")

    def states(self, ann_id):
        with self.lock:
            return [d["state"] for d in self.statuses if d["id"] == ann_id]

    def wait_state(self, ann_id, state):
        wait_until(lambda: state in self.states(ann_id), what=f"{ann_id} {state}")

    def order(self):
        with self.lock:
            return [d["id"] for d in self.statuses if d["state"] == "done"]


@pytest.fixture
def pipeline(tmp_path):
    created = []

    def make(**kw):
        p = Pipeline(tmp_path, **kw)
        created.append(p)
        return p

    yield make
    for p in created:
        p.service.stop()


def test_an_announcement_goes_queued_speaking_done_with_the_engine(pipeline):
    p = pipeline()
    p.service.start()
    assert p.send({"id": "a", "text": "Hello. World."})
    p.wait_state("a", "done")
    assert p.states("a") == ["queued", "speaking", "done"]
    done = next(d for d in p.statuses if d["state"] == "done")
    assert done["engine"] == "local" and isinstance(done["ts"], float)
    assert wav_levels(p.out / "a.wav") == [0.1, 0.2]


def test_a_repeated_id_is_not_spoken_again_and_its_state_is_reported(pipeline):
    p = pipeline()
    p.service.start()
    p.send({"id": "a", "text": "Hello."})
    p.wait_state("a", "done")
    assert p.send({"id": "a", "text": "Hello again."})
    wait_until(lambda: len(p.states("a")) == 4)
    assert p.states("a")[-1] == "done"
    assert p.statuses[-1]["duplicate"] is True
    assert p.synth.calls == ["Hello."]


def test_invalid_payloads_are_rejected_with_a_reason_and_acknowledged(pipeline):
    p = pipeline(max_payload_bytes=1024)
    assert p.send(b"{oops")
    assert p.send({"id": "x"})
    assert p.send(b'{"id": "y", "text": "' + b"z" * 2000 + b'"}')
    rejected = [d for d in p.statuses if d["state"] == "rejected"]
    assert [d["id"] for d in rejected] == [None, "x", None]
    assert "invalid JSON" in rejected[0]["error"]
    assert "missing 'text'" in rejected[1]["error"]
    assert "limit is 1024" in rejected[2]["error"]


def test_an_urgent_announcement_interrupts_at_a_sentence_boundary_and_the_other_resumes(pipeline, tmp_path):
    opener = GatedOpener(tmp_path / "out", gated="long")
    p = pipeline(opener=opener)
    p.service.start()
    p.send({"id": "long", "text": "One. Two. Three.", "priority": 3})
    assert opener.entered.wait(30)  # "long" is writing its first sentence, held at the gate
    p.send({"id": "urgent", "text": "Fire.", "priority": 9})
    opener.gate.set()
    p.wait_state("long", "done")
    assert p.order() == ["urgent", "long"]
    assert p.states("long") == ["queued", "speaking", "queued", "speaking", "done"]
    assert wav_levels(tmp_path / "out" / "long.wav") == [0.1, 0.2, 0.3]  # whole, in order
    assert wav_levels(tmp_path / "out" / "urgent.wav") == [0.1]


def test_equal_priority_does_not_interrupt(pipeline, tmp_path):
    opener = GatedOpener(tmp_path / "out", gated="first")
    p = pipeline(opener=opener)
    p.service.start()
    p.send({"id": "first", "text": "One. Two."})
    assert opener.entered.wait(30)
    p.send({"id": "second", "text": "Three."})
    opener.gate.set()
    p.wait_state("second", "done")
    assert p.order() == ["first", "second"]
    assert p.states("first") == ["queued", "speaking", "done"]


def test_queued_announcements_play_in_priority_order(pipeline):
    p = pipeline()
    for ann_id, prio in (("low", 1), ("mid", 5), ("high", 9), ("mid2", 5)):
        p.send({"id": ann_id, "text": "Hi.", "priority": prio})
    p.service.start()
    wait_until(lambda: len(p.order()) == 4)
    assert p.order() == ["high", "mid", "mid2", "low"]


def test_expired_announcements_are_not_spoken(pipeline):
    p = pipeline()
    p.send({"id": "late", "text": "Too late.", "expires_at": time.time() - 1})
    p.send({"id": "soon", "text": "Soon.", "expires_at": time.time() + 0.2})
    assert p.states("late") == ["expired"]
    # let "soon" pass its deadline while waiting in the queue
    wait_until(lambda: all(item.announcement.expired() for item in p.service.queue.items()),
               what="'soon' to expire in the queue")
    p.service.start()
    p.wait_state("soon", "expired")
    assert p.states("soon") == ["queued", "expired"]
    assert p.synth.calls == []


def test_a_full_queue_rejects_new_announcements(pipeline):
    p = pipeline(queue_max=2)
    for ann_id in ("a", "b", "c"):
        p.send({"id": ann_id, "text": "Hi."})
    assert p.states("c") == ["rejected"]
    assert "queue full" in p.statuses[-1]["error"]


def test_a_journal_that_cannot_write_leaves_the_message_unacknowledged(pipeline):
    disk = FlakyWrites()
    p = pipeline(disk=disk)
    disk.full = True
    assert p.send({"id": "a", "text": "Hi."}) is False
    disk.full = False
    assert p.states("a") == []
    assert p.send({"id": "a", "text": "Hi."}) is True  # the broker's redelivery is accepted


def test_a_start_the_journal_refuses_waits_and_is_spoken_once_space_returns(pipeline):
    disk = FlakyWrites()
    p = pipeline(disk=disk)
    p.send({"id": "a", "text": "One. Two."})
    disk.full = True
    p.service.start()
    wait_until(lambda: disk.calls >= 3, what="the speaker to retry")
    # Between retries the item is back in its place: waiting, not dropped (the speaker holds it
    # only while it tries the journal, so wait for the queue rather than read it once).
    wait_until(lambda: len(p.service.queue) == 1, what="the item back in the queue")
    assert p.states("a") == ["queued"]
    disk.full = False
    p.wait_state("a", "done")
    assert p.states("a") == ["queued", "speaking", "done"]


def test_a_failing_voice_reports_failed_and_the_speaker_carries_on(pipeline):
    class Flaky(ToneSynth):
        def stream(self, text, voice=None):
            if "bad" in text:
                raise RuntimeError("voice exploded")
            return super().stream(text, voice)

    p = pipeline(synth=Flaky())
    p.service.start()
    p.send({"id": "a", "text": "bad."})
    p.send({"id": "b", "text": "good."})
    p.wait_state("b", "done")
    failed = [d for d in p.statuses if d["state"] == "failed"]
    assert failed[0]["id"] == "a" and failed[0]["error"] == "voice exploded"


def test_announcements_accepted_before_a_restart_are_spoken_after_it(tmp_path):
    first = Pipeline(tmp_path)
    for ann_id in ("a", "b"):
        first.send({"id": ann_id, "text": "Hi."})
    first.service.stop()
    second = Pipeline(tmp_path)
    second.service.start()
    try:
        wait_until(lambda: len(second.order()) == 2)
        assert second.order() == ["a", "b"]
    finally:
        second.service.stop()


def test_a_trigger_may_submit_a_decoded_document_and_gets_the_same_checks(pipeline):
    p = pipeline()
    p.service.start()
    assert p.service.submit({"id": "w1", "text": "From another trigger."}, "wyoming")
    assert p.service.submit({"id": "w2", "text": "x", "priority": 12}, "wyoming")
    p.wait_state("w1", "done")
    assert p.states("w1") == ["queued", "speaking", "done"]
    assert p.states("w2") == ["rejected"]
    rejected = next(d for d in p.statuses if d["id"] == "w2")
    assert rejected["error"] == "'priority' must be an integer 0..9"


def test_every_observer_sees_each_status_until_it_stops_and_a_failing_one_harms_none(pipeline):
    p = pipeline()
    seen: list[tuple[str, str]] = []

    def broken(doc):
        raise RuntimeError("observer bug")

    p.service.observe(broken)
    forget = p.service.observe(lambda doc: seen.append((doc["id"], doc["state"])))
    p.send({"id": "a", "text": "Hi."})
    forget()
    p.send({"id": "b", "text": "Hi."})
    assert seen == [("a", "queued")]
    assert p.states("a") == ["queued"] and p.states("b") == ["queued"]


def test_a_swapped_bundle_speaks_the_next_announcement_and_the_current_one_ends_with_the_old(
        pipeline, tmp_path):
    opener = GatedOpener(tmp_path / "out", gated="first")
    p = pipeline(opener=opener)
    p.service.start()
    p.send({"id": "first", "text": "One. Two."})
    assert opener.entered.wait(30)  # speaking "first" with the old bundle, held at the gate
    assert not p.service.wait_idle(0)
    new_synth = ToneSynth(engine="remote")
    old = p.service.swap(Speaking(p.service.speaking.settings, new_synth, DirOpener(tmp_path / "new"),
                                  VOICES))
    assert old.synth is p.synth
    p.send({"id": "second", "text": "Three."})
    opener.gate.set()
    p.wait_state("second", "done")
    assert p.service.wait_idle(30)
    assert p.synth.calls == ["One. Two."] and new_synth.calls == ["Three."]
    assert wav_levels(tmp_path / "out" / "first.wav") == [0.1, 0.2]
    assert wav_levels(tmp_path / "new" / "second.wav") == [0.1]
    done = {d["id"]: d["engine"] for d in p.statuses if d["state"] == "done"}
    assert done == {"first": "local", "second": "remote"}


def test_an_announcement_is_cut_at_its_audio_budget_and_the_status_says_so(pipeline, tmp_path):
    from edge_agent.audio.wav import read_wav

    p = pipeline(max_audio_s=0.12)  # ToneSynth: 0.05 s per sentence
    p.service.start()
    p.send({"id": "long", "text": "One. Two. Three. Four. Five. Six."})
    p.send({"id": "next", "text": "Seven."})
    p.wait_state("next", "done")
    done = [d for d in p.statuses if d["id"] == "long" and d["state"] == "done"]
    assert done[0]["truncated"] is True and "announcements.max_audio_s" in done[0]["error"]
    wav = read_wav(tmp_path / "out" / "long.wav")
    assert len(wav.samples) == round(0.12 * 16000)
    assert wav_levels(tmp_path / "out" / "long.wav") == [0.1, 0.2, 0.3]  # the third cut short
    assert p.service.journal.get("long").extra["truncated"] is True


# -- conversation turns ------------------------------------------------------------------


def test_an_answer_with_a_conversation_id_is_spoken_before_queued_ones_of_any_priority(pipeline):
    p = pipeline()
    for ann_id, prio in (("low", 1), ("urgent", 9)):
        p.send({"id": ann_id, "text": "Hi.", "priority": prio})
    p.send({"id": "answer", "text": "It is noon.", "priority": 0, "conversation_id": "c1"})
    p.service.start()
    wait_until(lambda: len(p.order()) == 3)
    assert p.order() == ["answer", "urgent", "low"]
    done = next(d for d in p.statuses if d["id"] == "answer" and d["state"] == "done")
    assert done["conversation_id"] == "c1" and "expect_reply" not in done


def test_a_hold_pauses_at_a_sentence_boundary_lets_only_answers_through_and_release_resumes(
        pipeline, tmp_path):
    opener = GatedOpener(tmp_path / "out", gated="news")
    p = pipeline(opener=opener)
    p.service.start()
    p.send({"id": "news", "text": "One. Two. Three."})
    assert opener.entered.wait(30)  # "news" is writing its first sentence
    p.service.hold()  # a wake word: barge-in
    p.send({"id": "other", "text": "Later.", "priority": 9})
    opener.gate.set()
    wait_until(lambda: p.states("news")[-1:] == ["queued"], what="news paused")
    p.send({"id": "answer", "text": "Yes.", "conversation_id": "c9"})
    p.wait_state("answer", "done")
    assert p.order() == ["answer"] and p.states("other") == ["queued"]  # held: only the answer
    p.service.release()
    p.wait_state("news", "done")
    wait_until(lambda: len(p.order()) == 3)
    assert p.order() == ["answer", "other", "news"]
    assert wav_levels(tmp_path / "out" / "news.wav") == [0.1, 0.2, 0.3]  # whole, resumed in place


def test_conversation_fields_are_checked_and_expect_reply_is_reported_when_spoken(pipeline):
    p = pipeline()
    p.send({"id": "bad1", "text": "Hi.", "conversation_id": 5})
    p.send({"id": "bad2", "text": "Hi.", "expect_reply": "yes"})
    rejected = {d["id"]: d["error"] for d in p.statuses if d["state"] == "rejected"}
    assert "'conversation_id' must be" in rejected["bad1"] and "'expect_reply' must be" in rejected["bad2"]
    p.send({"id": "ask", "text": "Which room?", "expect_reply": True})
    p.service.start()
    p.wait_state("ask", "done")
    done = next(d for d in p.statuses if d["id"] == "ask" and d["state"] == "done")
    assert done["expect_reply"] is True
