"""What Home Assistant's entities send the device, carried out; and the discovery it needs to send them.

Runs on the MQTT thread (the daemon hands it the messages of `HaTopics.inbound`).
A notify message becomes an announcement through the trigger-neutral `Announcer`
(journaled, deduplicated by id, spoken once); volume and microphone mute go to
the device's `controls.Controls`, and their new state is published back, retained.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from edge_agent.announce.message import loads
from edge_agent.announce.pipeline import Announcer
from edge_agent.homeassistant.discovery import HaTopics, discovery_payload
from edge_agent.mqtt.outbox import Message

log = logging.getLogger(__name__)


class Controls(Protocol):
    """The device settings Home Assistant may change."""

    def volume(self) -> float: ...

    def set_volume(self, volume: float) -> None: ...

    def mic_muted(self) -> bool: ...

    def set_mic_muted(self, muted: bool) -> None: ...


class HomeAssistantAdapter:
    """Discovery out, entity commands in."""

    def __init__(self, topics: HaTopics, announcer: Announcer, controls: Controls,
                 publish: Callable[[Message], None]) -> None:
        self.topics = topics
        self.announcer = announcer
        self.controls = controls
        self.publish = publish

    def subscriptions(self) -> tuple[str, ...]:
        return self.topics.inbound()

    def announce(self) -> None:
        """Publish discovery and the entities' states (at connect, and when Home Assistant restarts)."""
        t = self.topics
        self.publish(Message.json(t.discovery, discovery_payload(t), qos=1, retain=True))
        self.publish_states()

    def announcement(self, topic: str, payload: bytes) -> bytes | dict[str, Any] | None:
        """The announcement request a notify message carries, for the caller to submit (with
        others read with it: one journal write for all); None for any other topic."""
        return notify_request(payload) if topic == self.topics.notify else None

    def handle(self, topic: str, payload: bytes) -> bool | None:
        """Carry out one message; None if `topic` is not Home Assistant's. False: deliver it again."""
        t = self.topics
        if topic == t.birth:
            if payload.strip() == b"online":
                log.info("Home Assistant is online: sending discovery again")
                self.announce()
            return True
        if topic == t.notify:
            return self.announcer.submit(notify_request(payload), topic)
        if topic == t.volume_set:
            volume = _volume(payload)
            if volume is None:
                log.warning("volume from Home Assistant ignored: %r is not a number 0..1", payload[:40])
            else:
                self.controls.set_volume(volume)
            self.publish_states()
            return True
        if topic == t.mic_mute_set:
            word = payload.strip().upper()
            if word in (b"ON", b"OFF"):
                self.controls.set_mic_muted(word == b"ON")
            else:
                log.warning("microphone switch from Home Assistant ignored: %r is not ON or OFF",
                            payload[:40])
            self.publish_states()
            return True
        return None

    def publish_states(self) -> None:
        """The volume and the microphone switch as they are now (retained)."""
        t = self.topics
        self.publish(Message(t.volume, f"{self.controls.volume():g}".encode(), qos=1, retain=True,
                             coalesce=True))
        self.publish(Message(t.mic_mute, b"ON" if self.controls.mic_muted() else b"OFF", qos=1, retain=True,
                             coalesce=True))


def notify_request(payload: bytes) -> bytes | dict[str, Any]:
    """A notify message as an announcement request.

    Our discovery's template sends JSON with the id Home Assistant gave the message;
    that goes to the announcement checks as it is, and so does anything that starts
    like a JSON object but does not decode: the checks reject it with the reason,
    rather than it being spoken as text. Anything else is the message text itself (an
    entity configured without the template), given an id here: such a message,
    redelivered, cannot be told from a new one.
    """
    try:
        doc = loads(payload)
    except (ValueError, RecursionError):  # ValueError: not UTF-8, not JSON, NaN
        doc = None
    if isinstance(doc, dict) or payload.lstrip().startswith(b"{"):
        return payload
    text = payload.decode("utf-8", "replace").strip()
    return {"id": f"ha-{uuid.uuid4().hex}", "text": text}


def _volume(payload: bytes) -> float | None:
    try:
        value = float(payload.strip())
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None
