"""The daemon in this process, with a tone synthesizer and a scripted listener: the wiring itself."""

import asyncio
import threading
import time

import pytest

from edge_agent.asr.transcriber import Transcript
from edge_agent.daemon import Daemon, SettingsSource
from edge_agent.listen import Heard
from edge_agent.parts import local_synthesizer
from tests.mqtt_support import Producer, ToneSynth, Watcher, device_config, signed, wait_until


def heard(text: str, start: float, end: float) -> Heard:
    """What the hearing loop reports for an utterance in `listen.mode: always`."""
    return Heard(Transcript(text, start, end))


class ScriptedListener:
    """A hearing loop that reports the events it is given, from its own thread."""

    def __init__(self, events):
        self.events = events
        self.stopped = threading.Event()

    def start(self, on_event, on_error=None, on_end=None):
        def work():
            for event in self.events:
                on_event(event)
            self.stopped.wait()

        threading.Thread(target=work, daemon=True).start()
        return self

    def halt(self):
        self.stopped.set()

    def stop(self, timeout=10.0):
        self.stopped.set()


class Running:
    def __init__(self, tmp_path, broker, overrides=None, **factories):
        # The group comes from the file: a command-line --group would outrank the fleet layer.
        config = device_config(tmp_path / "device.yaml", tmp_path, device={"group": "kitchen"})
        source = SettingsSource(config, {"mqtt.broker": broker.url, "device.id": "dev1",
                                         "daemon.out_dir": str(tmp_path / "out"), **(overrides or {})})
        self.daemon = Daemon(source, **factories)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.daemon.run()), daemon=True)
        self.thread.start()
        wait_until(lambda: self.daemon.bridge is not None and self.daemon.bridge.connected, what="connect")

    def stop(self):
        self.daemon.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture
def watcher(broker):
    w = Watcher(broker.url)
    yield w
    w.close()


def test_transcripts_are_published_but_not_while_the_device_speaks(tmp_path, broker, watcher):
    listener = ScriptedListener([heard("turn on the lights", 1.25, 2.5), heard("what time is it", 4.0, 5.1)])
    running = Running(tmp_path, broker, {"listen.mode": "always"}, synthesizer_factory=lambda s: ToneSynth(),
                      listener_factory=lambda s, accept_wake: listener)
    try:
        got = watcher.wait("edge/dev1/transcript", count=2)
        assert [(d["text"], d["start"], d["end"]) for d in got] == [
            ("turn on the lights", 1.25, 2.5), ("what time is it", 4.0, 5.1)]
        running.daemon.announcements.busy.set()  # speaking: what the microphone hears is ourselves
        running.daemon.turns.on_event(heard("announcement 7", 9.0, 10.0))
        running.daemon.announcements.busy.clear()
        assert watcher.find("edge/dev1/transcript", lambda d: d["text"] == "announcement 7") == []
    finally:
        running.stop()
    assert listener.stopped.is_set()


def test_a_group_change_by_fleet_config_moves_the_subscription(tmp_path, broker, watcher):
    running = Running(tmp_path, broker, synthesizer_factory=lambda s: ToneSynth())
    producer = Producer(broker.url)
    try:
        producer.publish("edge/group/kitchen/announce", {"id": "k1", "text": "Kitchen."})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "k1" and d["state"] == "done")
        producer.publish("edge/dev1/config", signed(3, {"device": {"group": "hall"}}))
        watcher.wait("edge/dev1/config/status", lambda d: d["version"] == 3 and d["state"] == "applied")
        wait_until(lambda: running.daemon.topics.group == "hall", what="the new group")
        wait_until(lambda: "edge/group/kitchen/announce" not in running.daemon.bridge._subscribed,
                   what="unsubscribe")
        producer.publish("edge/group/kitchen/announce", {"id": "k2", "text": "Kitchen again."})
        producer.publish("edge/group/hall/announce", {"id": "h1", "text": "Hall."})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "h1" and d["state"] == "done")
        assert watcher.statuses("dev1", "k2") == []
    finally:
        producer.close()
        running.stop()


def test_a_voice_that_fails_its_health_check_is_rolled_back_and_the_old_one_keeps_speaking(
        tmp_path, broker, watcher):
    class Silent(ToneSynth):
        def stream(self, text, voice=None):
            return iter(())

    def factory(settings):
        return Silent() if settings.tts.length_scale == 4.0 else ToneSynth()

    running = Running(tmp_path, broker, synthesizer_factory=factory)
    producer = Producer(broker.url)
    try:
        old = running.daemon.synth
        producer.publish("edge/dev1/config", signed(4, {"tts": {"length_scale": 4.0}}))
        report = watcher.wait("edge/dev1/config/status", lambda d: d["version"] == 4)[0]
        assert report["state"] == "rolled_back" and "no audio" in report["error"]
        assert report["active_version"] == 0
        assert running.daemon.synth is old  # the failed voice never replaced it
        producer.publish("edge/dev1/announce", {"id": "still", "text": "Still here."})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "still" and d["state"] == "done")
    finally:
        producer.close()
        running.stop()


def test_a_reloaded_voice_speaks_next_and_the_replaced_one_is_closed(tmp_path, broker, watcher):
    made = []

    def factory(settings):
        made.append(ToneSynth(engine=f"voice{len(made)}"))
        return made[-1]

    running = Running(tmp_path, broker, synthesizer_factory=factory)
    producer = Producer(broker.url)
    try:
        producer.publish("edge/dev1/config", signed(5, {"tts": {"length_scale": 1.5}}))
        watcher.wait("edge/dev1/config/status", lambda d: d["version"] == 5 and d["state"] == "applied")
        assert running.daemon.synth is made[1]
        wait_until(lambda: made[0].closed, what="the replaced voice to be closed")
        assert not made[1].closed
        producer.publish("edge/dev1/announce", {"id": "after", "text": "New voice."})
        done = watcher.wait("edge/dev1/announce/status",
                            lambda d: d["id"] == "after" and d["state"] == "done")
        assert done[0]["engine"] == "voice1"
    finally:
        producer.close()
        running.stop()
    assert made[1].closed  # shutdown closes the voice in use


def test_an_idle_voice_is_unloaded_and_comes_back_for_the_next_announcement(tmp_path, broker, watcher):
    running = Running(tmp_path, broker, {"tts.idle_unload_s": 1.0}, synthesizer_factory=local_synthesizer)
    producer = Producer(broker.url)
    voices = running.daemon.synth.voices
    try:
        producer.publish("edge/dev1/announce", {"id": "a1", "text": "First."})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "a1" and d["state"] == "done")
        wait_until(lambda: voices.loaded() == [], timeout=10, what="the idle voice to be unloaded")
        producer.publish("edge/dev1/announce", {"id": "a2", "text": "Second."})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "a2" and d["state"] == "done")
        assert (tmp_path / "out" / "a2.wav").stat().st_size > 1000
    finally:
        producer.close()
        running.stop()


def test_a_flood_of_announcements_gets_every_id_a_final_status(tmp_path, broker, watcher):
    """1000 announcements at once against a queue of 300: each id ends done or rejected, and the
    outbox keeps one waiting status per id instead of dropping final ones."""
    gate = threading.Event()

    class HeldSynth(ToneSynth):
        """Speaks only once the whole flood is in, so the queue fills up."""

        def stream(self, text, voice=None):
            if text != "Ready.":  # the warm-up
                assert gate.wait(60)
            yield from super().stream(text, voice)

    running = Running(tmp_path, broker, {"announcements.queue_max": 300},
                      synthesizer_factory=lambda s: HeldSynth(per_sentence_s=0.01))
    try:
        producer = Producer(broker.url)
        ids = [f"flood-{i:04d}" for i in range(1000)]
        infos = [producer.publish("edge/dev1/announce", {"id": i, "text": "Hi."}, wait=False) for i in ids]
        for info in infos:
            info.wait_for_publish(timeout=60)
        wait_until(lambda: len(watcher.find("edge/dev1/announce/status", lambda d: d["state"] == "rejected"))
                   >= 1000 - 301, what="the rejections")
        gate.set()
        final = ("done", "rejected")

        def settled():
            docs = watcher.find("edge/dev1/announce/status", lambda d: d["state"] in final)
            return {d["id"] for d in docs} >= set(ids)

        wait_until(settled, timeout=120, what="a final status for every id")
        rejected = watcher.find("edge/dev1/announce/status", lambda d: d["state"] == "rejected")
        assert rejected and all("queue full" in d["error"] for d in rejected)
        assert running.daemon.bridge.outbox.dropped_final == 0
    finally:
        running.stop()


def test_a_burst_of_2000_announcements_gets_every_id_its_first_status_and_drops_nothing(
        tmp_path, broker, watcher):
    """2000 announcements in about a second against a queue of 1000 (issue 21): every accepted
    one is answered `queued` and every other `rejected`, while nothing is spoken yet, so each
    id's first status is the one the daemon published at its arrival; the outbox drops none
    (it used to push 988 `queued` out for the `rejected` ones), and the metrics say so."""
    gate = threading.Event()

    class HeldSynth(ToneSynth):
        def stream(self, text, voice=None):
            if text != "Ready.":  # the warm-up
                assert gate.wait(120)
            yield from super().stream(text, voice)

    running = Running(tmp_path, broker, {"announcements.queue_max": 1000, "daemon.metrics_s": 0.5},
                      synthesizer_factory=lambda s: HeldSynth(per_sentence_s=0.01))
    producer = Producer(broker.url)
    try:
        ids = [f"burst-{i:04d}" for i in range(2000)]
        infos = []
        start = time.monotonic()
        for n, ann_id in enumerate(ids):
            while time.monotonic() < start + n / 2000:  # paced over one second
                time.sleep(0.0005)
            infos.append(producer.publish("edge/dev1/announce", {"id": ann_id, "text": "Hi."}, wait=False))
        for info in infos:
            info.wait_for_publish(timeout=60)

        def first_statuses():
            seen = {}
            for doc in watcher.find("edge/dev1/announce/status"):
                seen.setdefault(doc["id"], doc["state"])
            return seen if set(seen) >= set(ids) else None

        first = wait_until(first_statuses, what="a first status for each of the 2000 ids")
        states = [first[i] for i in ids]
        counters = running.daemon.metrics.snapshot()["counters"]
        assert states.count("queued") == counters["announcements_accepted"] >= 1000
        assert states.count("rejected") == counters["announcements_rejected"] == 2000 - states.count("queued")
        outbox = running.daemon.bridge.outbox
        assert (outbox.dropped, outbox.expired) == (0, 0)
        metrics = watcher.wait("edge/dev1/metrics", lambda d: "mqtt_outbound_dropped" in d.get("gauges", {}))
        assert metrics[-1]["gauges"]["mqtt_outbound_dropped"] == 0
    finally:
        gate.set()
        producer.close()
        running.stop()


class TurnListener(ScriptedListener):
    """A scripted hearing loop that also records the reply turns the daemon opens."""

    def __init__(self, events):
        super().__init__(events)
        self.hearing = self
        self.opened: list[str] = []
        self.streamed: list[str] = []

    def open_turn(self, conversation_id, stream=False):
        (self.streamed if stream else self.opened).append(conversation_id)


def test_a_turn_publishes_wake_and_transcript_holds_announcements_and_the_answer_goes_first(
        tmp_path, broker, watcher):
    from edge_agent.listen import TurnEnded, Woke
    from edge_agent.wake import Detection

    listener = TurnListener([])
    running = Running(tmp_path, broker, {"listen.answer_wait_s": 30.0},
                      synthesizer_factory=lambda s: ToneSynth(),
                      listener_factory=lambda s, accept_wake: listener)
    producer = Producer(broker.url)
    daemon = running.daemon
    try:
        daemon.turns.on_event(Woke(Detection("okay_nabu", "Okay Nabu", 3.2, 0.97), "c1"))
        wake = watcher.wait("edge/dev1/wake")[0]
        assert (wake["wake_word"], wake["conversation_id"]) == ("Okay Nabu", "c1")
        assert daemon.announcements.held
        producer.publish("edge/dev1/announce", {"id": "queued", "text": "Meanwhile.", "priority": 9})
        daemon.turns.on_event(Heard(Transcript("what time is it", 3.4, 4.5), "c1", "Okay Nabu"))
        daemon.turns.on_event(TurnEnded("c1", "heard", 4.8))
        doc = watcher.wait("edge/dev1/transcript")[0]
        assert (doc["text"], doc["conversation_id"]) == ("what time is it", "c1")
        assert doc["wake_word"] == "Okay Nabu"
        producer.publish("edge/dev1/announce", {"id": "answer", "text": "Noon.", "conversation_id": "c1"})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "queued" and d["state"] == "done")
        spoken = [d["id"] for d in watcher.find("edge/dev1/announce/status", lambda d: d["state"] == "done")]
        assert spoken == ["answer", "queued"]  # the answer released the hold (30 s not waited)
        assert (tmp_path / "out" / "wake-c1.wav").is_file()
    finally:
        producer.close()
        running.stop()


def test_expect_reply_opens_exactly_one_turn_after_it_is_spoken(tmp_path, broker, watcher):
    listener = TurnListener([])
    running = Running(tmp_path, broker, synthesizer_factory=lambda s: ToneSynth(),
                      listener_factory=lambda s, accept_wake: listener)
    producer = Producer(broker.url)
    try:
        producer.publish("edge/dev1/announce", {"id": "ask", "text": "Which room?", "expect_reply": True})
        producer.publish("edge/dev1/announce", {"id": "plain", "text": "Done."})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "plain" and d["state"] == "done")
        assert listener.opened == ["ask"]
    finally:
        producer.close()
        running.stop()
