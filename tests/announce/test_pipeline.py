import json
import os
import threading
import time

import numpy as np
import pytest

from edge_agent.announce.journal import Journal
from edge_agent.announce.pipeline import Announcer, Speaking
from edge_agent.announce.playout import DirOpener, chime
from edge_agent.atomic import AppendFile
from edge_agent.audio.wav import read_wav
from edge_agent.config import AnnouncementSettings
from tests.conftest import FlakyWrites
from tests.mqtt_support import GatedOpener, ToneSynth, wait_until, wav_levels

VOICES = frozenset({"en_US-joe-medium"})


class Pipeline:
    def __init__(self, tmp_path, opener=None, synth=None, disk=None, state=None, **settings):
        self.statuses: list[dict] = []
        self.lock = threading.Lock()
        self.out = tmp_path / "out"
        self.synth = synth or ToneSynth()
        self.opener = opener or DirOpener(self.out)
        s = AnnouncementSettings(state_dir=state or tmp_path / "state", **settings)
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


def test_a_flood_of_rejections_is_one_log_line_a_second_and_a_status_each(pipeline, caplog):
    p = pipeline()
    with caplog.at_level("DEBUG", logger="edge_agent.announce.pipeline"):
        for n in range(50):
            assert p.send({"id": f"bad-{n}", "text": "Hi.", "priority": 12})
    rejected = [d for d in p.statuses if d["state"] == "rejected"]
    assert len(rejected) == 50 and all("'priority'" in d["error"] for d in rejected)
    lines = [r for r in caplog.records if r.getMessage().startswith("announcement rejected")]
    assert len(lines) == 50  # every one is in the debug log
    assert [r.levelname for r in lines].count("WARNING") <= 2  # 50 in far less than two seconds


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


def test_the_audio_budget_is_not_renewed_by_a_restart(tmp_path):
    opener = GatedOpener(tmp_path / "out", gated="long")
    first = Pipeline(tmp_path, opener=opener, max_audio_s=0.12)  # ToneSynth: 0.05 s per sentence
    first.send({"id": "long", "text": "One. Two. Three. Four. Five. Six."})
    first.service.start()
    assert opener.entered.wait(30)
    first.service.hold()  # stops after "One.": 0.05 s of the 0.12 s spent
    opener.gate.set()
    wait_until(lambda: first.states("long")[-1:] == ["queued"] and len(first.states("long")) == 3,
               what="'long' paused")
    first.service.stop()
    second = Pipeline(tmp_path, max_audio_s=0.12)
    second.service.start()
    try:
        second.wait_state("long", "done")
        done = [d for d in second.statuses if d["id"] == "long" and d["state"] == "done"]
        assert done[0]["truncated"] is True
        # What is left of the budget after the restart: 0.07 s ("Two." and 0.02 s of "Three.").
        assert len(read_wav(tmp_path / "out" / "long.wav").samples) == round(0.07 * 16000)
    finally:
        second.service.stop()


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


# -- audio announcements -----------------------------------------------------------------------

RATE = 8000


def tone(seconds, rate=RATE, amplitude=0.5):
    """A sweep, so any misplaced or repeated second shows in a sample comparison."""
    t = np.arange(round(seconds * rate), dtype=np.float32) / rate
    return (amplitude * np.sin(2 * np.pi * (200 + 100 * t) * t)).astype(np.float32)


def assert_same_audio(path, samples, rate=RATE):
    wav = read_wav(path)
    assert wav.sample_rate == rate and len(wav.samples) == len(samples)
    np.testing.assert_allclose(wav.samples, samples, atol=1e-4)  # two 16-bit round trips


def audio_dir(p):
    return p.service.audio_files.directory


def stored(p):
    directory = audio_dir(p)
    return sorted(f.name for f in directory.iterdir()) if directory.exists() else []


def test_audio_is_journaled_then_played_from_its_file_at_its_rate_and_the_file_goes_after_done(pipeline):
    p = pipeline()
    samples = tone(2.5)
    assert p.service.submit_audio(samples, RATE, ann_id="ha-1", text="The garage is open.", priority=6)
    assert stored(p) == ["ha-1.wav"]
    entry = p.service.journal.get("ha-1")
    assert entry.announcement.audio == str(audio_dir(p) / "ha-1.wav")
    assert entry.announcement.text == "The garage is open." and entry.announcement.priority == 6
    p.service.start()
    p.wait_state("ha-1", "done")
    assert p.states("ha-1") == ["queued", "speaking", "done"]
    done = [d for d in p.statuses if d["state"] == "done"]
    assert done[0]["engine"] == "audio"
    assert_same_audio(p.out / "ha-1.wav", samples)
    assert p.synth.calls == []
    assert stored(p) == []


def test_audio_gets_the_chime_first_like_text(pipeline):
    p = pipeline()
    samples = tone(0.5)
    p.service.submit_audio(samples, RATE, ann_id="c", chime=True)
    p.service.start()
    p.wait_state("c", "done")
    bell = chime(RATE)
    out = read_wav(p.out / "c.wav").samples
    np.testing.assert_allclose(out[: len(bell)], bell, atol=1e-4)
    np.testing.assert_allclose(out[len(bell):], samples, atol=1e-4)


def test_an_mqtt_payload_cannot_name_an_audio_file_and_is_spoken_from_its_text(pipeline):
    p = pipeline()
    p.service.start()
    assert p.send({"id": "sneaky", "text": "Just text.", "audio": "/etc/passwd"})
    p.wait_state("sneaky", "done")
    assert p.synth.calls == ["Just text."]
    assert wav_levels(p.out / "sneaky.wav") == [0.1]
    done = next(d for d in p.statuses if d["state"] == "done")
    assert done["engine"] == "local"


def test_an_urgent_text_interrupts_audio_at_a_second_and_the_rest_plays_once(pipeline, tmp_path):
    opener = GatedOpener(tmp_path / "out", gated="long")
    p = pipeline(opener=opener)
    samples = tone(3.5)
    p.service.start()
    p.service.submit_audio(samples, RATE, ann_id="long", priority=3)
    assert opener.entered.wait(30)  # writing its first second, held at the gate
    p.send({"id": "urgent", "text": "Fire.", "priority": 9})
    opener.gate.set()
    p.wait_state("long", "done")
    assert p.order() == ["urgent", "long"]
    assert p.states("long") == ["queued", "speaking", "queued", "speaking", "done"]
    paused = [d for d in p.statuses if d["id"] == "long" and d["state"] == "queued"][1]
    assert paused["resume"] == 1  # stopped after one 1 s piece
    assert_same_audio(tmp_path / "out" / "long.wav", samples)  # whole, each second once, in order
    assert wav_levels(tmp_path / "out" / "urgent.wav") == [0.1]
    assert stored(p) == []


def test_pending_audio_is_played_after_a_restart(tmp_path):
    samples = tone(1.5)
    first = Pipeline(tmp_path)
    assert first.service.submit_audio(samples, RATE, ann_id="a")
    first.service.stop()
    second = Pipeline(tmp_path)
    second.service.start()
    try:
        second.wait_state("a", "done")
        assert_same_audio(tmp_path / "out" / "a.wav", samples)
        assert stored(second) == []
    finally:
        second.service.stop()


def test_audio_paused_at_a_second_resumes_from_there_after_a_restart(tmp_path):
    samples = tone(3.0)
    opener = GatedOpener(tmp_path / "out", gated="a")
    first = Pipeline(tmp_path, opener=opener)
    first.service.submit_audio(samples, RATE, ann_id="a")
    first.service.start()
    assert opener.entered.wait(30)
    first.service.hold()  # a wake word: stops at the next piece boundary
    opener.gate.set()
    wait_until(lambda: first.states("a")[-1:] == ["queued"] and len(first.states("a")) == 3,
               what="'a' paused")
    first.service.stop()  # the half-written out file is dropped; the journal keeps resume=1
    second = Pipeline(tmp_path)
    second.service.start()
    try:
        second.wait_state("a", "done")
        assert_same_audio(tmp_path / "out" / "a.wav", samples[RATE:])
        assert stored(second) == []
    finally:
        second.service.stop()


def test_after_a_restart_audio_whose_file_is_missing_or_unreadable_fails_with_the_reason(tmp_path):
    first = Pipeline(tmp_path)
    for ann_id in ("gone", "broken", "fine"):
        first.service.submit_audio(tone(0.5), RATE, ann_id=ann_id)
    first.service.stop()
    directory = audio_dir(first)
    (directory / "gone.wav").unlink()
    (directory / "broken.wav").write_bytes(b"not a wav at all")
    (directory / "stray.wav").write_bytes(b"left by a crash")
    (directory / ".x.wav.123.part").write_bytes(b"half")
    second = Pipeline(tmp_path)
    try:
        assert second.states("gone") == ["failed"] and second.states("broken") == ["failed"]
        errors = {d["id"]: d["error"] for d in second.statuses if d["state"] == "failed"}
        assert "no such file" in errors["gone"] and "not a PCM WAV" in errors["broken"]
        assert second.service.journal.get("gone").state == "failed"
        assert stored(second) == ["fine.wav"]  # what no pending announcement needs is removed
        second.service.start()
        second.wait_state("fine", "done")
        assert stored(second) == []
    finally:
        second.service.stop()


def test_audio_interrupted_by_a_crash_is_failed_and_its_file_removed_at_start(tmp_path):
    first = Pipeline(tmp_path)
    first.service.submit_audio(tone(0.5), RATE, ann_id="a")
    first.service.journal.start("a")  # as the speaker does just before it plays
    first.service.stop()
    second = Pipeline(tmp_path)
    try:
        assert second.states("a") == ["failed"] and stored(second) == []
    finally:
        second.service.stop()


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"samples": tone(2.0)}, "the audio is 2.0 s long, the limit is 1 s (announcements.max_audio_s)"),
    ({"samples": np.zeros(0, dtype=np.float32)}, "the audio is empty"),
    ({"sample_rate": 4000}, "sample rate 4000 Hz is not plausible"),
    ({"sample_rate": 96000}, "sample rate 96000 Hz is not plausible"),
    ({"samples": np.zeros((100, 2), dtype=np.float32)}, "audio must be mono"),
    ({"samples": np.full(100, np.nan, dtype=np.float32)}, "NaN or infinite"),
    ({"priority": 10}, "'priority' must be an integer 0..9"),
    ({"conversation_id": "bad id"}, "'conversation_id' must be"),
])
def test_unplayable_audio_is_rejected_with_the_reason_and_leaves_no_file(pipeline, kwargs, reason):
    p = pipeline(max_audio_s=1.0)
    args = {"samples": tone(0.5), "sample_rate": RATE, **kwargs}
    assert p.service.submit_audio(args.pop("samples"), args.pop("sample_rate"), ann_id="x", **args)
    assert p.states("x") == ["rejected"]
    assert reason in p.statuses[-1]["error"]
    assert stored(p) == [] and p.service.journal.get("x") is None


def test_audio_with_a_bad_id_is_rejected_without_one(pipeline):
    p = pipeline()
    assert p.service.submit_audio(tone(0.5), RATE, ann_id="../../etc/x")
    assert p.statuses[-1]["id"] is None and p.statuses[-1]["state"] == "rejected"
    assert "'id' must be" in p.statuses[-1]["error"]
    assert stored(p) == []


def test_a_repeated_audio_id_is_reported_as_duplicate_and_writes_no_file(pipeline):
    p = pipeline()
    p.service.start()
    p.service.submit_audio(tone(0.5), RATE, ann_id="a")
    p.wait_state("a", "done")
    assert p.service.submit_audio(tone(1.0), RATE, ann_id="a")
    assert p.statuses[-1]["duplicate"] is True and p.statuses[-1]["state"] == "done"
    assert stored(p) == []
    assert_same_audio(p.out / "a.wav", tone(0.5))


def test_audio_the_journal_refuses_leaves_no_file_and_the_retry_is_played_once(pipeline):
    disk = FlakyWrites()
    p = pipeline(disk=disk)
    samples = tone(1.0)
    disk.full = True
    assert p.service.submit_audio(samples, RATE, ann_id="a") is False
    assert stored(p) == [] and p.states("a") == []
    disk.full = False
    assert p.service.submit_audio(samples, RATE, ann_id="a") is True
    p.service.start()
    p.wait_state("a", "done")
    assert p.states("a") == ["queued", "speaking", "done"]
    assert_same_audio(p.out / "a.wav", samples)


def test_on_a_real_full_disk_audio_is_refused_without_a_trace_and_the_retry_is_played_once(
        tmp_path, small_disk):
    p = Pipeline(tmp_path, state=small_disk.path / "announcements")
    try:
        samples = tone(1.0)
        small_disk.fill()
        assert p.service.submit_audio(samples, RATE, ann_id="a") is False
        assert stored(p) == [] and p.states("a") == [] and p.service.journal.get("a") is None
        small_disk.free()
        assert p.service.submit_audio(samples, RATE, ann_id="a") is True
        p.service.start()
        p.wait_state("a", "done")
        assert p.states("a") == ["queued", "speaking", "done"]
        assert_same_audio(tmp_path / "out" / "a.wav", samples)
        assert stored(p) == []
    finally:
        p.service.stop()


def test_a_document_the_checks_choke_on_is_rejected_with_a_reason_not_raised(pipeline):
    """Whatever a trigger hands over, a check that raises ends as one rejection: the trigger
    acknowledges its message instead of getting it again for ever."""

    class Hostile(dict):
        def get(self, key, default=None):
            if key == "volume":
                raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
            return super().get(key, default)

    p = pipeline()
    assert p.service.submit(Hostile(id="poison-2", text="Hi.", volume=1), "hermes/tts/say")
    assert p.states("poison-2") == ["rejected"]
    rejected = next(d for d in p.statuses if d["id"] == "poison-2")
    assert rejected["error"] == "payload could not be checked (ValueError)"
    assert p.send({"id": "after-2", "text": "Hi."}) and p.states("after-2") == ["queued"]


def test_a_batch_is_checked_journaled_once_and_answered_like_each_submit(pipeline):
    disk = FlakyWrites()
    p = pipeline(disk=disk, queue_max=3)
    assert p.send({"id": "old", "text": "Seen before."})
    writes = disk.calls
    batch = [{"id": "a", "text": "One."}, b"{not json", {"id": "old", "text": "Again."},
             {"id": "a", "text": "One, twice in the batch."}, {"id": "b", "text": "Two."},
             {"id": "c", "text": "The queue is full by now."}]
    payloads = [json.dumps(d).encode() if isinstance(d, dict) else d for d in batch]
    results = p.service.submit_many([(payload, "edge/dev/announce") for payload in payloads])
    assert results == [True] * 6  # each may be acknowledged: stored or finally answered
    assert disk.calls == writes + 1  # a and b: one write (and its one fsync)
    with p.lock:
        seen = [(d["id"], d["state"], d.get("duplicate", False)) for d in p.statuses]
    assert seen[1:] == [(None, "rejected", False), ("old", "queued", True), ("c", "rejected", False),
                        ("a", "queued", False), ("b", "queued", False), ("a", "queued", True)]


def test_a_batch_the_journal_refuses_is_stored_and_acknowledged_none_of_it(pipeline, tmp_path):
    disk = FlakyWrites()
    p = pipeline(disk=disk, state=tmp_path / "full")
    disk.full = True
    batch = [(json.dumps({"id": i, "text": "Hello."}).encode(), "edge/dev/announce") for i in "dee"]
    assert p.service.submit_many(batch) == [False, False, False]  # the broker delivers them again
    assert [p.service.journal.get(i) for i in "de"] == [None, None] and p.statuses == []
    disk.full = False
    assert p.service.submit_many(batch) == [True, True, True]
    assert [(d["id"], d.get("duplicate", False)) for d in p.statuses] == [("d", False), ("e", False),
                                                                         ("e", True)]
