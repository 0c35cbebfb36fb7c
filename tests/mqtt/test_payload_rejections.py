"""Payloads a strict JSON parser refuses, on the topics that take announcements, against the daemon
on a real mosquitto: every say for this site gets its `sayFinished` (with its id, or null where the
id cannot be carried back), a rejection names the producer's id whenever a tolerant look can read
it, and nothing the device publishes is anything but strict JSON (no NaN, no Infinity)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_support import MqttDaemon
from tests.mqtt_support import Producer, Watcher

HUGE = "9" * 4400
"""Past `sys.get_int_max_str_digits()`: `int()` raises ValueError, json decodes it as infinite."""
DEEP = "[" * 20_000 + "]" * 20_000
"""Past the JSON decoder's recursion limit: RecursionError."""


def _strict(payload: bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in a published payload")
    return json.loads(payload, parse_constant=refuse)


PUBLISHED = ("hermes/tts/sayFinished", "hermes/error/tts", "edge/dev1/announce/status", "edge/dev1/status")
"""Topics the device publishes on (the producer's own say and announce topics left out)."""


def _all_published_strict_json(everything: Watcher) -> None:
    """Every message the device published parses as strict JSON (`Infinity` is not JSON)."""
    published = [m for m in everything.messages if m.topic in PUBLISHED]
    assert published
    for message in published:
        _strict(message.payload)


@pytest.fixture
def kitchen(tmp_path: Path, broker: Any) -> Iterator[MqttDaemon]:
    running = MqttDaemon(tmp_path, broker, {"hermes.enabled": True, "hermes.site_id": "kitchen",
                                           "wake.chime": False})
    yield running
    running.stop()


def test_a_say_with_a_nan_volume_gets_its_say_finished_and_a_rejection_naming_the_field(
        kitchen: MqttDaemon, everything: Watcher, producer: Producer) -> None:
    producer.publish("hermes/tts/say", b'{"text": "Hi.", "siteId": "garage", "id": "g-nan", "volume": NaN}')
    producer.publish("hermes/tts/say", b'{"text": "Hi.", "siteId": "kitchen", "id": "k-nan", '
                                       b'"sessionId": "s-1", "volume": NaN}')
    producer.publish("hermes/tts/say", b'{"text": "Hi.", "siteId": "kitchen", "id": "k-inf", '
                                       b'"volume": -Infinity}')
    producer.publish("hermes/tts/say", {"text": "Dinner.", "siteId": "kitchen", "id": "k-after"})
    finished = everything.wait("hermes/tts/sayFinished", count=3)
    assert [(d["id"], d["sessionId"]) for d in finished] == [("k-nan", "s-1"), ("k-inf", None),
                                                               ("k-after", None)]
    for say in ("k-nan", "k-inf"):
        (rejected,) = everything.find("edge/dev1/announce/status", lambda d, s=say: d["id"] == f"hermes:{s}")
        assert (rejected["state"], rejected["error"]) == ("rejected", "'volume' must be a number 0..1")
    assert not everything.find("edge/dev1/announce/status", lambda d: "g-nan" in str(d["id"]))
    _all_published_strict_json(everything)


def test_a_say_whose_id_cannot_be_carried_back_is_refused_with_a_reason_never_echoed_as_infinity(
        kitchen: MqttDaemon, everything: Watcher, producer: Producer, tmp_path: Path) -> None:
    producer.publish("hermes/tts/say", f'{{"text": "Hi.", "siteId": "kitchen", "id": {HUGE}, '
                                       f'"sessionId": "s-huge"}}'.encode())
    producer.publish("hermes/tts/say", b'{"text": "Hi.", "siteId": "kitchen", "id": 1.5, '
                                       b'"sessionId": "s-float"}')
    producer.publish("hermes/tts/say", {"text": "Dinner.", "siteId": "kitchen", "id": 9007199254740991})
    finished = everything.wait("hermes/tts/sayFinished", count=3)
    assert [(d["id"], d["sessionId"]) for d in finished] == [
        (None, "s-huge"), (None, "s-float"), (9007199254740991, None)]  # a safe integer comes back as sent
    errors = everything.wait("hermes/error/tts", count=2)
    assert [(e["sessionId"], e["siteId"]) for e in errors] == [("s-huge", "kitchen"), ("s-float", "kitchen")]
    assert all("'id' must be a string or an integer within" in e["error"] for e in errors)
    everything.wait("edge/dev1/announce/status", lambda d: d["id"] == "hermes:9007199254740991"
                    and d["state"] == "done")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.wav")) == ["hermes:9007199254740991.wav"]
    _all_published_strict_json(everything)


def test_a_say_nested_too_deeply_is_answered_with_the_id_a_tolerant_look_reads(
        kitchen: MqttDaemon, everything: Watcher, producer: Producer) -> None:
    producer.publish("hermes/tts/say", f'{{"text": {DEEP}, "siteId": "garage", "id": "g-deep"}}'.encode())
    producer.publish("hermes/tts/say", f'{{"siteId": "kitchen", "text": {DEEP}, "id": "k-deep", '
                                       f'"sessionId": "s-deep"}}'.encode())
    producer.publish("hermes/tts/say", b'\xff\xfe{"siteId": "kitchen", "id": "k-binary"}')  # no object
    producer.publish("hermes/tts/say", b'{"siteId": "kitchen", "id": "k-latin1", "text": "caf\xe9"}')
    producer.publish("hermes/tts/say", {"text": "Dinner.", "siteId": "kitchen", "id": "k-after"})
    finished = everything.wait("hermes/tts/sayFinished", count=3)
    assert [(d["id"], d["sessionId"]) for d in finished] == [("k-deep", "s-deep"), ("k-latin1", None),
                                                               ("k-after", None)]
    errors = everything.find("hermes/error/tts")
    assert [(e["context"], e["error"]) for e in errors] == [
        ("k-deep", "the say is nested too deeply; not spoken"),
        ("k-latin1", "the say is not UTF-8; not spoken")]


@pytest.mark.parametrize(("payload", "reason"), [
    (b'{"id": "a-nan", "text": "Hi.", "volume": NaN}', "invalid JSON: NaN is not allowed"),
    (b'{"id": "a-inf", "text": "Hi.", "expires_at": Infinity}', "invalid JSON: Infinity is not allowed"),
    (f'{{"text": {DEEP}, "id": "a-deep"}}'.encode(), "invalid JSON: nested too deeply"),
    (f'{{"id": "a-deep2", "text": "Hi.", "x": {{"y": {DEEP}}}}}'.encode(), "invalid JSON: nested too deeply"),
], ids=["nan", "infinity", "nested", "nested-after-the-id"])
def test_an_announcement_a_strict_parser_refuses_is_rejected_with_the_producers_id(
        tmp_path: Path, broker: Any, everything: Watcher, producer: Producer, payload: bytes,
        reason: str) -> None:
    ann_id = _strict_id(payload)
    running = MqttDaemon(tmp_path, broker, {})
    try:
        producer.publish("edge/dev1/announce", payload)
        (rejected,) = everything.wait("edge/dev1/announce/status", lambda d: d["id"] == ann_id)
    finally:
        running.stop()
    assert (rejected["state"], rejected["error"]) == ("rejected", reason)


def _strict_id(payload: bytes) -> str:
    start = payload.index(b'"id": "') + 7
    return payload[start:payload.index(b'"', start)].decode()
