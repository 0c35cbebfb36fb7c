"""The discovery document has what Home Assistant's MQTT integration documents for each platform."""

from __future__ import annotations

import datetime
import json

import jinja2

from edge_agent.announce.message import ID_PATTERN
from edge_agent.homeassistant.discovery import NOTIFY_TEMPLATE, HaTopics, discovery_payload

REQUIRED = {  # per platform, beyond `p` and `unique_id` (device-based discovery needs both)
    "notify": {"command_topic"},
    "sensor": {"state_topic"},
    "event": {"state_topic", "event_types"},
    "number": {"command_topic", "state_topic", "min", "max"},
    "switch": {"command_topic", "state_topic", "payload_on", "payload_off"},
}


def test_every_component_has_the_keys_its_platform_requires() -> None:
    doc = discovery_payload(HaTopics("homeassistant", "edge", "kitchen"))
    assert doc["dev"]["ids"] == ["edge_speech_kitchen"] and doc["o"]["name"] == "edge-speech"
    for key, comp in doc["cmps"].items():
        assert comp["unique_id"] == key
        assert REQUIRED[comp["p"]] <= set(comp), (key, REQUIRED[comp["p"]] - set(comp))
    unique = [c["unique_id"] for c in doc["cmps"].values()]
    assert len(unique) == len(set(unique))
    json.dumps(doc)  # the payload is JSON


def test_the_notify_template_renders_to_an_announcement_with_a_valid_id() -> None:
    env = jinja2.Environment()
    env.filters["tojson"] = json.dumps
    now = datetime.datetime(2026, 12, 3, 4, 5, 6, 789012, tzinfo=datetime.timezone.utc)
    rendered = env.from_string(NOTIFY_TEMPLATE).render(value='He said "hi" & left.', now=lambda: now)
    doc = json.loads(rendered)
    assert doc["text"] == 'He said "hi" & left.'
    assert ID_PATTERN.match(doc["id"]) and doc["id"].startswith("ha-")


def test_the_wake_event_template_gives_home_assistant_an_event_type() -> None:
    doc = discovery_payload(HaTopics("homeassistant", "edge", "kitchen"))
    wake = next(c for c in doc["cmps"].values() if c["p"] == "event")
    env = jinja2.Environment()
    env.filters["tojson"] = json.dumps
    rendered = env.from_string(wake["value_template"]).render(value_json={"wake_word": "Okay Nabu"})
    assert json.loads(rendered) == {"event_type": "detected", "wake_word": "Okay Nabu"}
    assert json.loads(rendered)["event_type"] in wake["event_types"]
