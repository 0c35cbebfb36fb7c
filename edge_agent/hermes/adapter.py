"""Hermes for one site: say -> announcement -> sayFinished; wake words and transcripts published.

Topics and payloads follow Rhasspy's Hermes reference:

| topic | direction | payload |
|---|---|---|
| `hermes/tts/say` | in | `{text, siteId, id?, sessionId?, lang?, volume?}`; only our `siteId` is spoken |
| `hermes/tts/sayFinished` | out | `{id, siteId, sessionId}` once it has been spoken (or could not be) |
| `hermes/hotword/<wakewordId>/detected` | out | `{modelId, modelVersion, modelType, siteId, ...}` |
| `hermes/asr/textCaptured` | out | `{text, likelihood, seconds, siteId, sessionId, wakewordId}` |

A say is an announcement like any other (journaled, deduplicated, queued by
priority) through the trigger-neutral `Announcer`. Its announcement id carries the
Hermes id and session id (`hermes:<id>:<session>`), so `sayFinished` can be
answered from the announcement's final status alone, after a restart too.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

from edge_agent.announce.message import FINAL_STATES, loads
from edge_agent.announce.pipeline import Announcer
from edge_agent.mqtt.bridge import Message

log = logging.getLogger(__name__)

SAY = "hermes/tts/say"
SAY_FINISHED = "hermes/tts/sayFinished"
TEXT_CAPTURED = "hermes/asr/textCaptured"
PREFIX = "hermes:"
_PART = re.compile(r"^[A-Za-z0-9._@+=-]{1,56}$")
"""An id or session id that fits in an announcement id as it is (uuids do)."""


class HermesAdapter:
    """Hermes on the daemon's broker for `site_id`."""

    def __init__(self, site_id: str, announcer: Announcer, publish: Callable[[Message], None]) -> None:
        self.site_id = site_id
        self.announcer = announcer
        self.publish = publish

    def subscriptions(self) -> tuple[str, ...]:
        return (SAY,)

    def handle(self, topic: str, payload: bytes) -> bool | None:
        """Carry out one message; None if `topic` is not ours. False: deliver it again."""
        if topic != SAY:
            return None
        try:
            # `loads` decodes a too-long integer instead of raising: such a say is still
            # told apart by siteId and, if ours, rejected with sayFinished like any bad say.
            doc = loads(payload)
        except (ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON, NaN
            log.warning("hermes say ignored: not JSON (%s)", str(exc)[:200] or type(exc).__name__)
            return True
        if not isinstance(doc, dict) or doc.get("siteId", "default") != self.site_id:
            return True  # another site's say
        request: dict[str, Any] = {"id": announcement_id(doc.get("id"), doc.get("sessionId")),
                                   "text": doc.get("text")}
        if "volume" in doc:
            request["volume"] = doc["volume"]
        return self.announcer.submit(request, topic)

    def on_status(self, status: dict[str, Any]) -> None:
        """Announcement status observer: a say's final state is answered with `sayFinished`."""
        ann_id = status.get("id")
        if not isinstance(ann_id, str) or not ann_id.startswith(PREFIX) or status.get("duplicate"):
            return
        if status.get("state") not in (*FINAL_STATES, "rejected"):
            return
        say_id, session = parse_announcement_id(ann_id)
        self.publish(Message.json(SAY_FINISHED, {"id": say_id, "siteId": self.site_id, "sessionId": session}))

    def wake_detected(self, model: str, session_id: str | None = None) -> None:
        self.publish(Message.json(f"hermes/hotword/{_level(model)}/detected", {
            "modelId": model, "modelVersion": "", "modelType": "universal", "currentSensitivity": 1.0,
            "siteId": self.site_id, "sessionId": session_id}))

    def text_captured(self, text: str, seconds: float, *, likelihood: float = 1.0,
                      wake_word: str | None = None, session_id: str | None = None) -> None:
        self.publish(Message.json(TEXT_CAPTURED, {
            "text": text, "likelihood": round(likelihood, 3), "seconds": round(seconds, 3),
            "siteId": self.site_id, "sessionId": session_id, "wakewordId": wake_word}))


def announcement_id(say_id: object, session: object) -> str:
    """`hermes:<id>:<session>`, with a nonce after them when the say has no usable id (a new
    announcement each time: nothing to deduplicate it by)."""
    parts = []
    for value in (say_id, session):
        if isinstance(value, str) and _PART.match(value):
            parts.append(value)
        else:
            if value not in (None, ""):
                log.warning("hermes id %r cannot name an announcement; sayFinished will not carry it",
                            value)
            parts.append("")
    nonce = "" if parts[0] else f":{uuid.uuid4().hex}"
    return f"{PREFIX}{parts[0]}:{parts[1]}{nonce}"


def parse_announcement_id(ann_id: str) -> tuple[str | None, str | None]:
    """The Hermes id and session id back from an announcement id."""
    say_id, session, *_ = (ann_id[len(PREFIX):] + "::").split(":")
    return say_id or None, session or None


def _level(name: str) -> str:
    """A wake word id usable as one topic level."""
    return re.sub(r"[/+#\x00]", "_", name) or "default"
