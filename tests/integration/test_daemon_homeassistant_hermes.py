"""Home Assistant discovery and Hermes through the daemon, a real mosquitto and paho clients.

Announcements are written to `<out>/<id>.wav` by the daemon (ToneSynth: sentence i is
the constant level (i + 1) / 10), so "spoken once" is a file and a `done` status.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.asr.transcriber import Transcript
from edge_agent.audio.wav import read_wav
from edge_agent.daemon import Daemon, SettingsSource
from edge_agent.homeassistant.discovery import NOTIFY_TEMPLATE
from edge_agent.listen import Heard, TurnEnded, Woke
from edge_agent.wake.engine import Detection
from tests.mqtt_support import Producer, ToneSynth, Watcher, device_config, signed, wait_until


class Listening:
    """A listener that stays open until stopped, counting how often the daemon made one."""

    made = 0

    def __init__(self) -> None:
        Listening.made += 1
        self.halted = threading.Event()
        """The microphone closed (at once, from the thread that got the switch)."""
        self.stopped = threading.Event()

    def start(self, on_transcript: Any, on_error: Any = None, on_end: Any = None) -> Listening:
        self.on_transcript = on_transcript
        return self

    def halt(self) -> None:
        self.halted.set()

    def stop(self, timeout: float = 10.0) -> None:
        self.halted.set()
        self.stopped.set()


class InProcess:
    def __init__(self, tmp_path: Path, broker: Any, overrides: dict[str, Any]) -> None:
        config = device_config(tmp_path / "device.yaml", tmp_path)
        self.out = tmp_path / "out"
        source = SettingsSource(config, {"mqtt.broker": broker.url, "device.id": "dev1",
                                         "daemon.out_dir": str(self.out), **overrides})
        self.daemon = Daemon(source, synthesizer_factory=lambda s: ToneSynth(),
                             listener_factory=lambda s, accept_wake: Listening())
        self.thread = threading.Thread(target=lambda: asyncio.run(self.daemon.run()), daemon=True)
        self.thread.start()
        wait_until(lambda: self.daemon.bridge is not None and self.daemon.bridge.connected, what="connect")

    def stop(self) -> None:
        self.daemon.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def _render_notify(message: str, stamp: str) -> bytes:
    """What Home Assistant sends for `message` with our template (its Jinja, done by hand)."""
    assert NOTIFY_TEMPLATE.startswith('{"id": "ha-{{ now().timestamp()')
    import json

    return json.dumps({"id": f"ha-{stamp}", "text": message}).encode()


def test_discovery_is_published_retained_and_again_when_home_assistant_comes_online(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    running = InProcess(tmp_path, broker, {"mqtt.ha_discovery": True})
    try:
        first = everything.wait("homeassistant/device/dev1/config")[0]
        late = Watcher(broker.url, topic="homeassistant/#")  # retained: a late subscriber gets it
        try:
            wait_until(lambda: [m.retain for m in late.messages] == [True], what="retained discovery")
        finally:
            late.close()
        producer.publish("homeassistant/status", b"online")
        everything.wait("homeassistant/device/dev1/config", count=2)
        assert everything.wait("edge/dev1/ha/volume")  # states come with it
    finally:
        running.stop()
    platforms = {c["p"] for c in first["cmps"].values()}
    assert platforms == {"notify", "sensor", "event", "number", "switch"}
    assert first["availability"][0]["topic"] == "edge/dev1/status"


def test_a_notify_message_is_spoken_exactly_once_even_when_redelivered(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    running = InProcess(tmp_path, broker, {"mqtt.ha_discovery": True})
    try:
        payload = _render_notify("The washing machine is done.", "1733200000-123456")
        producer.publish("edge/dev1/ha/notify", payload)
        producer.publish("edge/dev1/ha/notify", payload)  # the same message again (a redelivery)
        producer.publish("edge/dev1/ha/notify", b"Plain text works too.")
        done = everything.wait("edge/dev1/announce/status", lambda d: d["state"] == "done", count=2)
        # The redelivery came before the plain text on the one MQTT thread, so it has been handled.
        # (Its `duplicate` status may never be published: the outbox keeps the newest status per id.)
        duplicates = running.daemon.announcements.metrics.counter("announcements_duplicate")
    finally:
        running.stop()
    assert duplicates == 1
    assert everything.statuses("dev1", "ha-1733200000-123456").count("done") == 1
    assert sum(d["id"] == "ha-1733200000-123456" for d in done) == 1
    assert (tmp_path / "out" / "ha-1733200000-123456.wav").is_file()
    assert len(list((tmp_path / "out").glob("ha-*.wav"))) == 2


def test_volume_from_home_assistant_applies_to_the_next_announcement_and_is_reported(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    running = InProcess(tmp_path, broker, {"mqtt.ha_discovery": True})
    try:
        producer.publish("edge/dev1/ha/volume/set", b"0.5")
        wait_until(lambda: any(m.payload == b"0.5" for m in everything.messages
                               if m.topic == "edge/dev1/ha/volume"), what="volume state")
        producer.publish("edge/dev1/ha/volume/set", b"loud")  # ignored, state repeated
        producer.publish("edge/dev1/announce", {"id": "v1", "text": "One."})
        everything.wait("edge/dev1/announce/status", lambda d: d["id"] == "v1" and d["state"] == "done")
    finally:
        running.stop()
    level = float(np.max(np.abs(read_wav(tmp_path / "out" / "v1.wav").samples)))
    assert abs(level - 0.05) < 0.002  # ToneSynth's 0.1 at half volume


def test_the_microphone_switch_closes_the_listener_and_opens_it_again(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    running = InProcess(tmp_path, broker, {"mqtt.ha_discovery": True})
    try:
        wait_until(lambda: running.daemon.listener is not None, what="listening")
        first = running.daemon.listener
        made = Listening.made
        producer.publish("edge/dev1/ha/mic_mute/set", b"ON")
        wait_until(lambda: running.daemon.listener is None, what="microphone closed")
        assert isinstance(first, Listening) and first.halted.is_set() and first.stopped.is_set()
        wait_until(lambda: any(m.payload == b"ON" for m in everything.messages
                               if m.topic == "edge/dev1/ha/mic_mute"), what="mute state")
        producer.publish("edge/dev1/ha/mic_mute/set", b"OFF")
        wait_until(lambda: running.daemon.listener is not None, what="microphone open again")
        assert Listening.made == made + 1
    finally:
        running.stop()


def test_hermes_say_for_our_site_is_spoken_once_and_answered_with_say_finished(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    running = InProcess(tmp_path, broker, {"hermes.enabled": True, "hermes.site_id": "kitchen",
                                           "wake.chime": False})
    try:
        say = {"text": "Dinner is ready.", "siteId": "kitchen", "id": "say-1", "sessionId": "sess-9"}
        producer.publish("hermes/tts/say", say)
        producer.publish("hermes/tts/say", say)  # redelivered: not spoken twice
        producer.publish("hermes/tts/say", {"text": "Not here.", "siteId": "garage", "id": "say-2"})
        finished = everything.wait("hermes/tts/sayFinished")
        metrics = running.daemon.announcements.metrics  # (the outbox may coalesce the duplicate status)
        wait_until(lambda: metrics.counter("announcements_duplicate") == 1, what="the redelivered say")
        running.daemon.announcements.last_spoke = float("-inf")  # past the echo guard after speaking
        running.daemon.turns.on_event(Woke(Detection("okay_nabu", "Okay Nabu", 0.8, 0.97), "conv-1"))
        hotword = everything.wait("hermes/hotword/okay_nabu/detected")
        heard = Heard(Transcript("turn on the lights", 1.0, 2.5), "conv-1", "Okay Nabu")
        running.daemon.turns.on_event(heard)
        running.daemon.turns.on_event(TurnEnded("conv-1", "heard", 3.0))
        captured = everything.wait("hermes/asr/textCaptured")
    finally:
        running.stop()
    assert finished == [{"id": "say-1", "siteId": "kitchen", "sessionId": "sess-9"}]
    assert [p.name for p in (tmp_path / "out").glob("*.wav")] == ["hermes:say-1.wav"]
    assert captured[0]["text"] == "turn on the lights" and captured[0]["siteId"] == "kitchen"
    assert captured[0]["seconds"] == 1.5
    assert captured[0]["sessionId"] == "conv-1" and captured[0]["wakewordId"] == "Okay Nabu"
    assert hotword[0]["modelId"] == "okay_nabu" and hotword[0]["siteId"] == "kitchen"
    assert hotword[0]["sessionId"] == "conv-1"


def test_hermes_captures_a_turn_once_with_its_whole_command_when_it_ends(
        tmp_path: Path, broker: Any, everything: Watcher) -> None:
    """A transcript published at a pause judged complete, then the whole command again (`continued`)
    after speech resumed: Rhasspy ends its session on the first `textCaptured`, so only the turn's
    last transcript goes out, when the turn ends."""
    running = InProcess(tmp_path, broker, {"hermes.enabled": True, "hermes.site_id": "kitchen",
                                           "wake.chime": False})
    turns = running.daemon.turns
    try:
        turns.on_event(Woke(Detection("okay_nabu", "Okay Nabu", 0.8, 0.97), "conv-1"))
        turns.on_event(Heard(Transcript("Dinner is ready.", 1.0, 2.0), "conv-1", "Okay Nabu", early=True))
        turns.on_event(Heard(Transcript("Dinner is ready. Please come to the table.", 1.0, 3.5), "conv-1",
                             "Okay Nabu", continued=True))
        everything.wait("edge/dev1/transcript", count=2)  # both went out on the device's own topic
        assert everything.find("hermes/asr/textCaptured") == []  # the turn is still open
        turns.on_event(TurnEnded("conv-1", "heard", 4.0))
        # A turn that timed out with nothing heard captures nothing; the next turn captures its own.
        turns.on_event(Woke(Detection("okay_nabu", "Okay Nabu", 5.8, 0.97), "conv-2"))
        turns.on_event(TurnEnded("conv-2", "timeout", 20.0))
        turns.on_event(Woke(Detection("okay_nabu", "Okay Nabu", 20.8, 0.97), "conv-3"))
        turns.on_event(Heard(Transcript("Stop.", 21.0, 21.4), "conv-3", "Okay Nabu"))
        turns.on_event(TurnEnded("conv-3", "heard", 22.0))
        # One client publishes them in order: anything conv-1 sent twice would come before conv-3's.
        captured = everything.wait("hermes/asr/textCaptured", count=2)
    finally:
        running.stop()
    assert [(c["sessionId"], c["text"]) for c in captured] == [
        ("conv-1", "Dinner is ready. Please come to the table."), ("conv-3", "Stop.")]
    assert captured[0]["seconds"] == 2.5 and captured[0]["wakewordId"] == "Okay Nabu"


def test_a_hermes_say_is_deduplicated_by_its_id_whatever_its_session(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    running = InProcess(tmp_path, broker, {"hermes.enabled": True, "hermes.site_id": "kitchen"})
    try:
        producer.publish("hermes/tts/say", {"text": "Once.", "siteId": "kitchen", "id": "s-1",
                                            "sessionId": "first"})
        producer.publish("hermes/tts/say", {"text": "Once.", "siteId": "kitchen", "id": "s-1",
                                            "sessionId": "second"})
        producer.publish("hermes/tts/say", {"text": "Next.", "siteId": "kitchen", "id": "s-2"})
        finished = everything.wait("hermes/tts/sayFinished", count=2)
        metrics = running.daemon.announcements.metrics
        wait_until(lambda: metrics.counter("announcements_duplicate") == 1, what="the same id again")
    finally:
        running.stop()
    assert finished == [{"id": "s-1", "siteId": "kitchen", "sessionId": "first"},
                        {"id": "s-2", "siteId": "kitchen", "sessionId": None}]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.wav")) == ["hermes:s-1.wav", "hermes:s-2.wav"]


@pytest.mark.parametrize("say_id", ["say-n\n", "room/kitchen 1"])
def test_a_hermes_id_that_cannot_name_a_file_is_spoken_once_and_answered_with_that_id(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer, say_id: str) -> None:
    running = InProcess(tmp_path, broker, {"hermes.enabled": True, "hermes.site_id": "kitchen"})
    try:
        say = {"text": "Odd id.", "siteId": "kitchen", "id": say_id, "sessionId": "sess-1"}
        producer.publish("hermes/tts/say", say)
        producer.publish("hermes/tts/say", say)  # redelivered: still one announcement
        finished = everything.wait("hermes/tts/sayFinished")
        done = everything.wait("edge/dev1/announce/status", lambda d: d["state"] == "done")
        metrics = running.daemon.announcements.metrics
        wait_until(lambda: metrics.counter("announcements_duplicate") == 1, what="the redelivered say")
    finally:
        running.stop()
    assert finished == [{"id": say_id, "siteId": "kitchen", "sessionId": "sess-1"}]
    assert done[0]["id"].startswith("hermes::h")
    assert len(list((tmp_path / "out").glob("*.wav"))) == 1


def test_the_volume_set_from_home_assistant_holds_after_a_restart(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    overrides = {"mqtt.ha_discovery": True, "daemon.state_dir": str(tmp_path / "daemon")}
    running = InProcess(tmp_path, broker, overrides)
    try:
        producer.publish("edge/dev1/ha/volume/set", b"0.5")
        wait_until(lambda: any(m.payload == b"0.5" for m in everything.messages
                               if m.topic == "edge/dev1/ha/volume"), what="volume state")
    finally:
        running.stop()
    late = Watcher(broker.url, topic="edge/dev1/ha/volume")
    try:
        running = InProcess(tmp_path, broker, overrides)
        try:
            wait_until(lambda: len(late.messages) >= 2, what="the retained volume and the restarted one")
            producer.publish("edge/dev1/announce", {"id": "v2", "text": "One."})
            everything.wait("edge/dev1/announce/status", lambda d: d["id"] == "v2" and d["state"] == "done")
        finally:
            running.stop()
    finally:
        late.close()
    assert {m.payload for m in late.messages} == {b"0.5"}
    level = float(np.max(np.abs(read_wav(tmp_path / "out" / "v2.wav").samples)))
    assert abs(level - 0.05) < 0.002  # ToneSynth's 0.1 at half volume


def test_an_unreadable_mute_file_keeps_the_microphone_closed_and_says_muted(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    state = tmp_path / "daemon"
    state.mkdir()
    (state / "controls.json").write_bytes(b'{"mic_muted": fa')  # torn, or written by someone else
    made = Listening.made
    running = InProcess(tmp_path, broker, {"mqtt.ha_discovery": True, "daemon.state_dir": str(state)})
    try:
        status = everything.wait("edge/dev1/status", lambda d: d["state"] == "online")[0]
        wait_until(lambda: any(m.payload == b"ON" for m in everything.messages
                               if m.topic == "edge/dev1/ha/mic_mute"), what="mute state ON")
        assert status["listen"]["state"] == "muted" and Listening.made == made
        producer.publish("edge/dev1/ha/mic_mute/set", b"OFF")  # the user's switch mends it
        wait_until(lambda: running.daemon.listener is not None, what="microphone open")
    finally:
        running.stop()
    assert (state / "controls.json").read_text().startswith('{"mic_muted": false')


def test_a_config_that_sets_the_volume_replaces_home_assistants_and_one_that_does_not_keeps_it(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    def level(ann_id: str) -> float:
        producer.publish("edge/dev1/announce", {"id": ann_id, "text": "One."})
        everything.wait("edge/dev1/announce/status", lambda d: d["id"] == ann_id and d["state"] == "done")
        return float(np.max(np.abs(read_wav(tmp_path / "out" / f"{ann_id}.wav").samples)))

    def applied(version: int) -> None:
        everything.wait("edge/dev1/config/status",
                        lambda d: d["version"] == version and d["state"] == "applied")

    overrides = {"mqtt.ha_discovery": True, "daemon.state_dir": str(tmp_path / "d")}
    running = InProcess(tmp_path, broker, overrides)
    try:
        producer.publish("edge/dev1/ha/volume/set", b"0.5")
        wait_until(lambda: running.daemon.volume() == 0.5, what="Home Assistant's volume")
        producer.publish("edge/dev1/config", signed(3, {"wake": {"chime": False}}))
        applied(3)
        assert abs(level("after-3") - 0.05) < 0.002  # a config about something else keeps it
        producer.publish("edge/dev1/config", signed(4, {"audio": {"volume": 0.8}}))
        applied(4)
        assert abs(level("after-4") - 0.08) < 0.002  # the config's word is the latest
        wait_until(lambda: [m.payload for m in everything.messages if m.topic == "edge/dev1/ha/volume"][-1]
                   == b"0.8", what="the slider's state following the config")
    finally:
        running.stop()
    assert '"volume": null' in (tmp_path / "d" / "controls.json").read_text()


def test_a_config_with_a_new_volume_keeps_the_wake_words_the_user_chose(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    overrides = {"daemon.state_dir": str(tmp_path / "d")}
    running = InProcess(tmp_path, broker, overrides)
    try:
        running.daemon.controls.set_wake_words(["hey_jarvis"])
        wait_until(lambda: running.daemon.settings.wake.models == ("hey_jarvis",),
                   what="the chosen wake word")
        producer.publish("edge/dev1/config", signed(3, {"audio": {"volume": 0.8}}))
        everything.wait("edge/dev1/config/status", lambda d: d["version"] == 3 and d["state"] == "applied")
        assert running.daemon.settings.audio.volume == 0.8  # the config's new volume
        assert running.daemon.settings.wake.models == ("hey_jarvis",)  # and still the user's wake word
    finally:
        running.stop()
