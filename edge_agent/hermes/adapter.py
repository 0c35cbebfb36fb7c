"""Hermes for one site: say -> announcement -> sayFinished; wake words and transcripts published.

Topics and payloads follow Rhasspy's Hermes reference:

| topic | direction | payload |
|---|---|---|
| `hermes/tts/say` | in | `{text, siteId, id?, sessionId?, lang?, volume?}`; only our `siteId` is spoken |
| `hermes/tts/sayFinished` | out | `{id, siteId, sessionId}` once it has been spoken (or could not be) |
| `hermes/error/tts` | out | `{error, context, siteId, sessionId}`: a say of ours refused unsubmitted |
| `hermes/hotword/<wakewordId>/detected` | out | `{modelId, modelVersion, modelType, siteId, ...}` |
| `hermes/asr/textCaptured` | out | `{text, likelihood, seconds, siteId, sessionId, wakewordId}`, one a turn |

A say is an announcement like any other (journaled, deduplicated, queued by
priority) through the trigger-neutral `Announcer`, deduplicated by its Hermes `id`
alone: `id` names the request (Rhasspy matches `sayFinished` to it), `sessionId`
only the dialogue it belongs to, so the same `id` again is a redelivery, whatever
its session. The announcement id is `hermes:<id>` for an id that can name a file;
any other string id is hashed (`hermes::h<sha256>`: still one announcement per id),
and a say without an id gets a fresh one (`hermes::n<uuid>`). `sayFinished` echoes
the say's own `id` and `sessionId`, remembered from submission to the final status;
after a restart a plain id comes back out of the announcement id (the session, held
only in memory, is then null).

Every say for this site is answered, and only with strict JSON: an id is echoed as it
came only when it is a string or a safe integer (`echoable`; an integer id is
`hermes:<digits>`); a say with any other id, or one that does not decode but that a
tolerant look (`peek`) finds is ours, is refused with `hermes/error/tts` and a
`sayFinished` whose id is null where it cannot be carried back.

One `textCaptured` per turn, with the whole command, when the turn ends. The end-of-turn model
publishes a turn's transcript at the first pause it judges complete, and speech that resumes before
the VAD's hangover sends the whole command again (`Heard.continued`). Rhasspy's dialogue manager acts
on a session's first `textCaptured` and ends the session, so a second one would lose the second
sentence, or run a command twice. The turn's transcript is held until its `TurnEnded` and its last
one goes out: Hermes hears the command when the VAD-only end would have published it, never sooner
(the model's gain is for the device's own topics and the streams to Home Assistant). A transcript
outside a turn (`listen.mode: always`) and a remote side's go out at once.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

from edge_agent.announce.message import FINAL_STATES, SAFE_INTEGER, loads, peek
from edge_agent.announce.pipeline import Announcer
from edge_agent.listen.hearing import Heard, TurnEnded, Woke
from edge_agent.listen.turn import HearObserver, RemoteHeard
from edge_agent.mqtt.outbox import Message

log = logging.getLogger(__name__)

SAY = "hermes/tts/say"
SAY_FINISHED = "hermes/tts/sayFinished"
TTS_ERROR = "hermes/error/tts"
TEXT_CAPTURED = "hermes/asr/textCaptured"
PREFIX = "hermes:"
_PLAIN_ID = re.compile(r"[A-Za-z0-9._@+=-]{1,120}")
"""A Hermes id that fits in an announcement id as it is (uuids do); always `fullmatch`ed:
`match` with `$` would let a final newline through ("$" matches before it)."""
PENDING_MAX = 4096
"""Says remembered between submission and `sayFinished` (the queue holds 1000 by default)."""


class HermesAdapter(HearObserver):
    """Hermes on the daemon's broker for `site_id`; told what the device hears as a `HearObserver`."""

    def __init__(self, site_id: str, announcer: Announcer, publish: Callable[[Message], None]) -> None:
        self.site_id = site_id
        self.announcer = announcer
        self.publish = publish
        self._pending: OrderedDict[str, tuple[object, object]] = OrderedDict()
        """Announcement id -> the say's own (id, sessionId), for its `sayFinished`."""
        self._pending_lock = threading.Lock()  # the MQTT thread adds, the speaker thread takes
        self._turn_heard: Heard | None = None
        """The open turn's latest transcript, published when the turn ends (the listener thread's)."""

    def subscriptions(self) -> tuple[str, ...]:
        return (SAY,)

    def handle(self, topic: str, payload: bytes) -> bool | None:
        """Carry out one message; None if `topic` is not ours. False: deliver it again."""
        request = self.announcement(topic, payload)
        return request if request is None or request is True else self.announcer.submit(request, topic)

    def announcement(self, topic: str, payload: bytes) -> dict[str, Any] | Literal[True] | None:
        """The announcement request a say for this site carries, for the caller to submit (with
        others read with it: one journal write for all); True for a say that needs none (another
        site's, or one already answered here); None if `topic` is not ours."""
        if topic != SAY:
            return None
        request = self._say_request(payload)
        return True if request is None else request

    def _say_request(self, payload: bytes) -> dict[str, Any] | None:
        """The announcement request of a say for this site; None for another site's say, or one
        already answered here (a say that is not JSON, or whose id cannot be echoed)."""
        try:
            # A too-long integer, NaN and Infinity decode (as floats): such a say is still
            # told apart by siteId and, if ours, the field holding one is rejected by its
            # check, with the say's id in sayFinished.
            doc = loads(payload, constants=True)
        except (ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON
            self._unreadable(payload, "not UTF-8" if isinstance(exc, UnicodeDecodeError)
                             else "not JSON" if isinstance(exc, ValueError) else "nested too deeply")
            return None
        if not isinstance(doc, dict) or doc.get("siteId", "default") != self.site_id:
            return None  # another site's say
        say_id, session = doc.get("id"), _session(doc.get("sessionId"))
        if not echoable(say_id):
            self._refuse(None, session, f"'id' must be a string or an integer within "
                                        f"+-{SAFE_INTEGER} (2^53 - 1), so that sayFinished can "
                                        "carry it back; not spoken")
            return None
        ann_id = announcement_id(say_id)
        self._remember(ann_id, say_id, session)
        request: dict[str, Any] = {"id": ann_id, "text": doc.get("text")}
        if "volume" in doc:
            request["volume"] = doc["volume"]  # NaN or Infinity included: the checks reject it
        return request

    def _unreadable(self, payload: bytes, why: str) -> None:
        """A say that does not decode: answered if a tolerant look finds it is for this site."""
        limit = self.announcer.speaking.settings.max_payload_bytes
        if len(payload) > limit:  # the look is bounded by what a say may cost
            log.warning("hermes say ignored: %s, and %d bytes (over %d)", why, len(payload), limit)
            return
        fields = peek(payload, ("siteId", "id", "sessionId"))
        if fields.get("siteId", "default") != self.site_id:
            log.warning("hermes say ignored: %s, and not for this site", why)
            return
        self._refuse(fields.get("id"), _session(fields.get("sessionId")), f"the say is {why}; not spoken")

    def _refuse(self, say_id: object, session: str | None, reason: str) -> None:
        """A say for this site that is not spoken: `hermes/error/tts` says why, `sayFinished` ends it."""
        say_id = say_id if echoable(say_id) else None
        log.warning("hermes say %r refused: %s", say_id, reason)
        self.publish(Message.json(TTS_ERROR, {"error": reason, "context": say_id, "siteId": self.site_id,
                                              "sessionId": session}))
        self.publish(Message.json(SAY_FINISHED, {"id": say_id, "siteId": self.site_id, "sessionId": session}))

    def on_status(self, status: dict[str, Any]) -> None:
        """Announcement status observer: a say's final state is answered with `sayFinished`."""
        ann_id = status.get("id")
        if not isinstance(ann_id, str) or not ann_id.startswith(PREFIX):
            return
        if status.get("state") not in (*FINAL_STATES, "rejected"):
            return
        with self._pending_lock:
            pending = self._pending.pop(ann_id, None)
        if status.get("duplicate"):
            return  # answered when the first of them finished
        say_id, session = pending if pending is not None else (parse_announcement_id(ann_id), None)
        self.publish(Message.json(SAY_FINISHED, {"id": say_id, "siteId": self.site_id, "sessionId": session}))

    def _remember(self, ann_id: str, say_id: object, session: object) -> None:
        with self._pending_lock:
            if ann_id in self._pending:
                return  # a redelivery: the first say's session is the one answered
            self._pending[ann_id] = (say_id, session)
            while len(self._pending) > PENDING_MAX:
                self._pending.popitem(last=False)

    def woke(self, event: Woke) -> None:
        self.wake_detected(event.detection.model, session_id=event.conversation_id)

    def heard(self, event: Heard) -> None:
        if event.conversation_id is None:
            self._capture(event)  # listen.mode always: no turn, nothing can replace it
        else:
            self._turn_heard = event  # a later one of the turn (continued) replaces it

    def turn_ended(self, event: TurnEnded) -> None:
        heard, self._turn_heard = self._turn_heard, None
        if heard is not None and heard.conversation_id == event.conversation_id:
            self._capture(heard)

    def _capture(self, event: Heard) -> None:
        transcript = event.transcript
        self.text_captured(transcript.text, float(transcript.end - transcript.start),
                           wake_word=event.wake_word, session_id=event.conversation_id)

    def remote_heard(self, event: RemoteHeard) -> None:
        self.text_captured(event.text, 0.0, wake_word=event.wake_word, session_id=event.conversation_id)

    def wake_detected(self, model: str, session_id: str | None = None) -> None:
        self.publish(Message.json(f"hermes/hotword/{_level(model)}/detected", {
            "modelId": model, "modelVersion": "", "modelType": "universal", "currentSensitivity": 1.0,
            "siteId": self.site_id, "sessionId": session_id}))

    def text_captured(self, text: str, seconds: float, *, likelihood: float = 1.0,
                      wake_word: str | None = None, session_id: str | None = None) -> None:
        self.publish(Message.json(TEXT_CAPTURED, {
            "text": text, "likelihood": round(likelihood, 3), "seconds": round(seconds, 3),
            "siteId": self.site_id, "sessionId": session_id, "wakewordId": wake_word}))


def echoable(say_id: object) -> bool:
    """An id `sayFinished` can carry back as it came: absent, a string, or an integer every JSON
    reader holds exactly. Anything else (a float, an object, an integer of 4,400 digits, which
    decodes as infinite) would come back changed or not as JSON at all."""
    if say_id is None or isinstance(say_id, str):
        return True
    return isinstance(say_id, int) and not isinstance(say_id, bool) and abs(say_id) <= SAFE_INTEGER


def announcement_id(say_id: object) -> str:
    """The announcement id of a say: `hermes:<id>` (an integer id as its digits), `hermes::h<hash
    of id>` for a string id that cannot name a file, or `hermes::n<nonce>` without one (a new
    announcement each time)."""
    if isinstance(say_id, int) and not isinstance(say_id, bool) and abs(say_id) <= SAFE_INTEGER:
        say_id = str(say_id)
    if isinstance(say_id, str) and _PLAIN_ID.fullmatch(say_id):
        return f"{PREFIX}{say_id}"
    if isinstance(say_id, str) and say_id:
        digest = hashlib.sha256(say_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"{PREFIX}:h{digest}"
    return f"{PREFIX}:n{uuid.uuid4().hex}"


def parse_announcement_id(ann_id: str) -> str | None:
    """The Hermes id back from an announcement id, where it is there as it was sent
    (`hermes:<id>`, and the older `hermes:<id>:<session>`)."""
    return ann_id[len(PREFIX):].split(":", maxsplit=1)[0] or None


def _session(session: object) -> str | None:
    """A say's sessionId as `sayFinished` may echo it: Hermes session ids are strings."""
    return session if isinstance(session, str) else None


def _level(name: str) -> str:
    """A wake word id usable as one topic level."""
    return re.sub(r"[/+#\x00]", "_", name) or "default"
