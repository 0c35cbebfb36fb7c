"""Poison messages against the daemon on a real mosquitto: a payload a parser chokes on (an integer
of 4,400 digits, past Python's int conversion limit, or of 400, past a float) is rejected once, with
its reason, on every topic that takes announcements; it is never redelivered for ever, and the
announcement right after it is spoken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.daemon_support import MqttDaemon
from tests.mqtt_support import Producer, Watcher

HUGE = "9" * 4400
"""Past `sys.get_int_max_str_digits()`: `int()` raises ValueError."""
LONG = "9" * 400
"""An int Python holds, but `float()` overflows."""


def _raw(doc: str) -> bytes:
    return doc.encode()


def _delivered_once(running: MqttDaemon) -> None:
    counters = running.counters()
    assert counters["mqtt_connects"] == 1, counters  # never dropped the connection for a redelivery
    assert counters.get("mqtt_inbound_dropped", 0) == 0  # the adapters answered; the bridge had no work


@pytest.mark.parametrize("number", [HUGE, LONG], ids=["4400-digits", "400-digits"])
def test_a_poison_announcement_is_rejected_once_and_the_next_one_is_spoken(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer, number: str) -> None:
    running = MqttDaemon(tmp_path, broker, {})
    try:
        poison = f'{{"id": "poison-1", "text": "Hi.", "volume": {number}}}'
        producer.publish("edge/dev1/announce", _raw(poison))
        producer.publish("edge/dev1/announce", {"id": "after-1", "text": "Still here."})
        everything.wait("edge/dev1/announce/status", lambda d: d["id"] == "after-1" and d["state"] == "done")
        _delivered_once(running)
    finally:
        running.stop()
    assert everything.statuses("dev1", "poison-1") == ["rejected"]
    rejected = everything.find("edge/dev1/announce/status", lambda d: d["id"] == "poison-1")[0]
    assert rejected["error"] == "'volume' must be a number 0..1"
    assert (tmp_path / "out" / "after-1.wav").is_file()


def test_a_poison_notify_from_home_assistant_is_rejected_once_and_the_next_one_is_spoken(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    running = MqttDaemon(tmp_path, broker, {"mqtt.ha_discovery": True})
    try:
        poison = f'{{"id": "ha-poison", "text": "Hi.", "priority": {HUGE}}}'
        producer.publish("edge/dev1/ha/notify", _raw(poison))
        producer.publish("edge/dev1/ha/notify", _raw('{"id": "ha-truncated", "text": '))  # not spoken as text
        producer.publish("edge/dev1/ha/notify", _raw('{"id": "ha-after", "text": "The washer is done."}'))
        everything.wait("edge/dev1/announce/status", lambda d: d["id"] == "ha-after" and d["state"] == "done")
        _delivered_once(running)
    finally:
        running.stop()
    assert everything.statuses("dev1", "ha-poison") == ["rejected"]
    statuses = everything.find("edge/dev1/announce/status")
    assert [d["error"] for d in statuses if d["id"] == "ha-poison"] == ["'priority' must be an integer 0..9"]
    truncated = [d for d in statuses if d["id"] == "ha-truncated"]  # its id read by a tolerant look
    assert len(truncated) == 1 and truncated[0]["error"].startswith("invalid JSON")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.wav")) == ["ha-after.wav"]


def test_a_poison_say_on_the_shared_hermes_topic_is_answered_once_and_the_next_say_is_spoken(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer) -> None:
    running = MqttDaemon(tmp_path, broker, {"hermes.enabled": True, "hermes.site_id": "kitchen",
                                           "wake.chime": False})
    try:
        # Another site's say, and one for us; both carry the integer.
        producer.publish("hermes/tts/say", _raw(
            f'{{"text": "Hi.", "siteId": "garage", "id": "say-garage", "volume": {HUGE}}}'))
        producer.publish("hermes/tts/say", _raw(
            f'{{"text": "Hi.", "siteId": "kitchen", "id": "say-poison", "volume": {HUGE}}}'))
        producer.publish("hermes/tts/say", {"text": "Dinner.", "siteId": "kitchen", "id": "say-after"})
        finished = everything.wait("hermes/tts/sayFinished", count=2)
        _delivered_once(running)
    finally:
        running.stop()
    assert [d["id"] for d in finished] == ["say-poison", "say-after"]  # none for the garage's say
    rejected = everything.find("edge/dev1/announce/status", lambda d: d["id"] == "hermes:say-poison")
    assert [(d["state"], d["error"]) for d in rejected] == [("rejected", "'volume' must be a number 0..1")]
    assert [p.name for p in (tmp_path / "out").glob("*.wav")] == ["hermes:say-after.wav"]
