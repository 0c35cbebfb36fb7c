"""What the device heard, on its MQTT topics: `wake` and `transcript` (a `HearObserver`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from edge_agent.listen.hearing import Heard, Woke
from edge_agent.listen.turn import HearObserver, RemoteHeard
from edge_agent.mqtt.outbox import Message
from edge_agent.mqtt.topics import Topics


class HearPublisher(HearObserver):
    """Publishes wake words and transcripts (QoS 1) through `publish`; `topics()` is read at each
    message (a reload that changes the device's group replaces them)."""

    def __init__(self, publish: Callable[[Message], None], topics: Callable[[], Topics]) -> None:
        self._publish = publish
        self._topics = topics

    def woke(self, event: Woke) -> None:
        doc = {"wake_word": event.detection.wake_word, "conversation_id": event.conversation_id,
               "ts": round(time.time(), 3)}
        self._publish(Message.json(self._topics().wake, doc, qos=1))

    def heard(self, event: Heard) -> None:
        transcript = event.transcript
        doc: dict[str, Any] = {"text": transcript.text, "start": round(float(transcript.start), 3),
                               "end": round(float(transcript.end), 3), "ts": round(time.time(), 3)}
        if event.conversation_id is not None:
            doc["conversation_id"] = event.conversation_id
        if event.wake_word is not None:
            doc["wake_word"] = event.wake_word
        if event.continued:
            doc["continued"] = True  # the rest of the turn whose first transcript went out already
        self._publish(Message.json(self._topics().transcript, doc, qos=1))

    def remote_heard(self, event: RemoteHeard) -> None:
        """Home Assistant's transcript: stream times are its own, so there are none."""
        doc = {"text": event.text, "conversation_id": event.conversation_id, "wake_word": event.wake_word,
               "source": "home-assistant", "ts": round(time.time(), 3)}
        self._publish(Message.json(self._topics().transcript, doc, qos=1))
