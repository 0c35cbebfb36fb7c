"""The announcement message: its fields, its checks, and its status payloads.

`{id, text, voice?, priority? (0..9, default 5), expires_at? (unix s), volume? (0..1),
chime?}`. Every problem becomes a `Rejected` with a reason the producer can act
on; unknown keys are ignored so newer producers work with older devices. A JSON
payload (MQTT) goes through `parse_announcement`; a trigger that already holds a
decoded document (a Wyoming or Hermes adapter) calls `check_announcement`. Neither
can set `audio`: an audio announcement comes only from `Announcer.submit_audio`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]  # public, untyped in typeshed
from typing import Any

import numpy as np

from edge_agent.announce.settings import AnnouncementSettings
from edge_agent.audio.frames import Samples
from edge_agent.models.catalog import base_voice
from edge_agent.text.normalize import normalize

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}")
"""Ids name files (`--out-dir`), so they are plain: letters, digits and `._:@+=-`."""

FINAL_STATES = ("done", "expired", "failed")


class Rejected(Exception):
    """An announcement payload that will not be spoken, and why."""

    def __init__(self, reason: str, announcement_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.id = announcement_id


@dataclass(frozen=True)
class Announcement:
    """One accepted announcement."""

    id: str
    text: str
    voice: str | None = None
    priority: int = 5
    """0 low .. 9 urgent."""
    expires_at: float | None = None
    """Unix seconds after which it is not spoken any more."""
    volume: float = 1.0
    """0..1, on top of `audio.volume`."""
    chime: bool = False
    """Play a short attention chime first."""
    received_at: float = 0.0
    """Unix seconds when the device accepted it."""
    conversation_id: str | None = None
    """The answer to the conversation turn with this id: spoken next, ahead of queued ones."""
    expect_reply: bool = False
    """Open the microphone for one command (no wake word) once it has been spoken."""
    audio: str | None = None
    """Absolute path of the mono WAV to play instead of speaking `text` (then only a label, for
    logs and the self-hearing check), under `<journal directory>/audio/`. Set only in-process
    (`Announcer.submit_audio`): no payload can name a file."""

    @property
    def answer(self) -> bool:
        return self.conversation_id is not None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Announcement:
        return Announcement(**doc)


def parse_announcement(payload: bytes, settings: AnnouncementSettings, voices: Collection[str],
                       now: float | None = None) -> Announcement:
    """Check a JSON `payload` against the limits and the schema; raise `Rejected` with the reason."""
    if len(payload) > settings.max_payload_bytes:
        raise Rejected(f"payload is {len(payload)} bytes, the limit is {settings.max_payload_bytes}")
    return check_announcement(_decode(payload), settings, voices, now)


def check_announcement(doc: Mapping[str, Any], settings: AnnouncementSettings, voices: Collection[str],
                       now: float | None = None) -> Announcement:
    """Check a decoded announcement document against the schema and the limits."""
    raw_id = doc.get("id")
    if not isinstance(raw_id, str) or not raw_id:
        raise Rejected("missing 'id' (a non-empty string)")
    if not ID_PATTERN.fullmatch(raw_id):  # not match + $: "$" also matches before a final "\n"
        raise Rejected("'id' must be 1-128 characters of letters, digits and ._:@+=- "
                       "(starting with a letter or digit)")
    ann_id = raw_id

    def reject(reason: str) -> Rejected:
        return Rejected(reason, ann_id)

    text = doc.get("text")
    if not isinstance(text, str) or not text.strip():
        raise reject("missing 'text' (a non-empty string)")
    if len(text) > settings.max_text_chars:
        raise reject(f"'text' has {len(text)} characters, the limit is {settings.max_text_chars}")
    # What costs is what is spoken: one character can normalise into dozens (U+FDFA is 18).
    spoken = len(normalize(text))
    if spoken > settings.max_text_chars:
        raise reject(f"'text' is {spoken} characters once normalised (numbers, units and ligatures "
                     f"spelled out), the limit is {settings.max_text_chars}")
    voice = doc.get("voice")
    if voice is not None:
        if not isinstance(voice, str):
            raise reject("'voice' must be a string")
        if voice not in voices and base_voice(voice) not in voices:
            raise reject(f"unknown voice {voice!r} (known: {', '.join(sorted(voices))})")
    priority = doc.get("priority", settings.default_priority)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise reject("'priority' must be an integer 0..9")
    expires_at = doc.get("expires_at")
    if expires_at is not None and not _finite_number(expires_at):
        raise reject("'expires_at' must be a number (unix seconds)")
    volume = doc.get("volume", 1.0)
    if not _finite_number(volume) or not 0.0 <= volume <= 1.0:
        raise reject("'volume' must be a number 0..1")
    chime = doc.get("chime", False)
    if not isinstance(chime, bool):
        raise reject("'chime' must be true or false")
    conversation_id = doc.get("conversation_id")
    if conversation_id is not None and (not isinstance(conversation_id, str)
                                        or not ID_PATTERN.fullmatch(conversation_id)):
        raise reject("'conversation_id' must be 1-128 characters of letters, digits and ._:@+=-")
    expect_reply = doc.get("expect_reply", False)
    if not isinstance(expect_reply, bool):
        raise reject("'expect_reply' must be true or false")
    return Announcement(
        id=ann_id, text=text, voice=voice, priority=priority,
        expires_at=float(expires_at) if expires_at is not None else None,
        volume=float(volume), chime=chime, received_at=time.time() if now is None else now,
        conversation_id=conversation_id, expect_reply=expect_reply,
    )


MIN_AUDIO_RATE, MAX_AUDIO_RATE = 8000, 48000
"""Sample rates an audio announcement may have (telephone to studio)."""


def implausible_rate(sample_rate: object) -> str | None:
    """Why `sample_rate` cannot be an audio announcement's, or None when it can (a trigger that
    receives audio in parts checks this before it buffers any)."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) \
            or not MIN_AUDIO_RATE <= sample_rate <= MAX_AUDIO_RATE:
        return (f"sample rate {sample_rate!r} Hz is not plausible "
                f"(an integer {MIN_AUDIO_RATE}..{MAX_AUDIO_RATE})")
    return None


def check_audio(samples: Samples, sample_rate: int, *, ann_id: str, text: str, priority: int | None,
                conversation_id: str | None, chime: bool, settings: AnnouncementSettings,
                now: float | None = None) -> tuple[Announcement, Samples]:
    """Check audio a trigger hands over; the announcement (its `audio` not yet set) and the samples
    as a 1-D float32 array, or `Rejected` with the reason."""
    if not isinstance(ann_id, str) or not ID_PATTERN.fullmatch(ann_id):
        raise Rejected("'id' must be 1-128 characters of letters, digits and ._:@+=- "
                       "(starting with a letter or digit)")

    def reject(reason: str) -> Rejected:
        return Rejected(reason, ann_id)

    label = text.strip() if isinstance(text, str) else ""
    if len(label) > settings.max_text_chars:
        raise reject(f"'text' has {len(label)} characters, the limit is {settings.max_text_chars}")
    bad_rate = implausible_rate(sample_rate)
    if bad_rate is not None:
        raise reject(bad_rate)
    audio = np.asarray(samples, dtype=np.float32)
    if audio.ndim != 1:
        raise reject(f"audio must be mono (one dimension), not of shape {audio.shape}")
    if audio.size == 0:
        raise reject("the audio is empty")
    seconds = audio.size / sample_rate
    if seconds > settings.max_audio_s:
        raise reject(f"the audio is {seconds:.1f} s long, the limit is {settings.max_audio_s:g} s "
                     "(announcements.max_audio_s)")
    if not np.isfinite(audio).all():
        raise reject("the audio holds NaN or infinite samples")
    priority = settings.default_priority if priority is None else priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise reject("'priority' must be an integer 0..9")
    if conversation_id is not None and (not isinstance(conversation_id, str)
                                        or not ID_PATTERN.fullmatch(conversation_id)):
        raise reject("'conversation_id' must be 1-128 characters of letters, digits and ._:@+=-")
    ann = Announcement(id=ann_id, text=label or "(audio)", priority=priority, chime=bool(chime),
                       received_at=time.time() if now is None else now, conversation_id=conversation_id)
    return ann, audio


def loads(data: bytes | str, *, constants: bool = False) -> Any:
    """JSON from an untrusted producer, as the announcement checks want it.

    NaN and Infinity are refused (ValueError), unless `constants` (then they decode as
    floats, for the checks to reject the field that holds one). An integer literal longer than Python
    converts (4300 digits) decodes as a float (infinite), so the field holding it is
    rejected by its check with the announcement's id, instead of the whole payload
    failing to decode, or, where a caller forgot that `int()` raises ValueError here,
    the message failing for ever. Raises ValueError (UnicodeDecodeError and
    JSONDecodeError included) or RecursionError on what is not JSON.
    """
    return json.loads(data, parse_constant=None if constants else _no_constants, parse_int=_int_or_float)


def _decode(payload: bytes) -> dict[str, Any]:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected(f"payload is not UTF-8 ({exc.reason} at byte {exc.start})",
                       _readable_id(payload)) from None
    try:
        doc = loads(text)
    except json.JSONDecodeError as exc:
        raise Rejected(f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                       _readable_id(text)) from None
    except RecursionError:
        raise Rejected("invalid JSON: nested too deeply", _readable_id(text)) from None
    except ValueError as exc:  # NaN or Infinity
        raise Rejected(f"invalid JSON: {exc}", _readable_id(text)) from None
    if not isinstance(doc, dict):
        raise Rejected(f"payload must be a JSON object, not {type(doc).__name__}")
    return doc


def _readable_id(data: bytes | str) -> str | None:
    """The id of a payload the strict parse refused, where a tolerant look finds a valid one: so
    the producer hears why (its payload is already within `max_payload_bytes`)."""
    ann_id = peek(data, ("id",)).get("id")
    return ann_id if isinstance(ann_id, str) and ID_PATTERN.fullmatch(ann_id) else None


SAFE_INTEGER = 2**53 - 1
"""Largest integer every JSON reader holds exactly (JavaScript's Number.MAX_SAFE_INTEGER)."""

_STRUCTURE = re.compile(r'["\[\]{}]')
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
"""The rest of a string after its opening quote, up to and with its closing one."""
_SCALAR_END = re.compile(r"[,}\]\s]|\Z")
_SAFE_DIGITS = re.compile(r"-?(?:0|[1-9][0-9]{0,15})")


def peek(data: bytes | str, names: Collection[str]) -> dict[str, str | int]:
    """A tolerant second look at a payload the strict parse refused (NaN, nested too deeply,
    an unterminated value further on): the members of its top-level object named in `names`
    whose values are a string or an integer within +-`SAFE_INTEGER`. One pass, no recursion,
    so its cost is linear in the payload whatever it holds; callers bound the payload first.
    It stops at the first thing it cannot read, keeping what it found before."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    found: dict[str, str | int] = {}
    end = len(text)
    i = _skip_space(text, 0)
    if i >= end or text[i] != "{":
        return found
    i += 1
    try:
        while True:
            i = _skip_space(text, i)
            if i >= end or text[i] != '"':
                return found
            key, i = scanstring(text, i + 1)
            i = _skip_space(text, i)
            if i >= end or text[i] != ":":
                return found
            i = _skip_space(text, i + 1)
            value: str | int | None = None
            if i < end and text[i] == '"':
                value, i = scanstring(text, i + 1)
            elif i < end and text[i] in "{[":
                i = _skip_nested(text, i)
            else:
                token = text[i:_SCALAR_END.search(text, i).start()]  # type: ignore[union-attr]
                i += len(token)
                if _SAFE_DIGITS.fullmatch(token) and abs(int(token)) <= SAFE_INTEGER:
                    value = int(token)
            if key in names:  # the last of a repeated key, as json.loads keeps it
                if value is None:
                    found.pop(key, None)
                else:
                    found[key] = value
            i = _skip_space(text, i)
            if i >= end or text[i] != ",":
                return found
            i += 1
    except ValueError:  # a key or string value that does not decode
        return found


def _skip_space(text: str, start: int) -> int:
    while start < len(text) and text[start] in " \t\n\r":
        start += 1
    return start


def _skip_nested(text: str, start: int) -> int:
    """The index after the array or object opening at `start` (the end of `text` if it never closes).

    Each character is looked at once: a string is skipped from its opening quote to its closing
    one, and one that never closes ends the look (trying again from every quote inside it made a
    64 KiB payload of escaped quotes take tens of seconds)."""
    depth = 0
    i = start
    while (found := _STRUCTURE.search(text, i)) is not None:
        token = found.group()
        if token == '"':
            rest = _STRING_REST.match(text, found.end())
            if rest is None:
                return len(text)
            i = rest.end()
            continue
        i = found.end()
        depth += 1 if token in ("[", "{") else -1
        if depth == 0:
            return i
    return len(text)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _int_or_float(digits: str) -> int | float:
    try:
        return int(digits)
    except ValueError:  # past sys.get_int_max_str_digits(): no field takes such a number anyway
        return float(digits)


def _finite_number(value: Any) -> bool:
    """An int or float that is finite as a float (a 400-digit integer is not: float() overflows)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def status(ann_id: str | None, state: str, *, engine: str | None = None, error: str | None = None,
           **extra: Any) -> dict[str, Any]:
    """An `announce/status` payload."""
    doc: dict[str, Any] = {"id": ann_id, "state": state}
    if engine is not None:
        doc["engine"] = engine
    if error is not None:
        doc["error"] = error
    doc.update(extra)
    doc["ts"] = round(time.time(), 3)
    return doc
