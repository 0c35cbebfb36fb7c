import json
import time

import pytest

from edge_agent.announce.message import SAFE_INTEGER, Rejected, parse_announcement, peek
from edge_agent.config import AnnouncementSettings

VOICES = {"en_US-joe-medium"}
SETTINGS = AnnouncementSettings(max_payload_bytes=4096, max_text_chars=100)


def parse(doc, settings=SETTINGS):
    payload = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return parse_announcement(payload, settings, VOICES, now=1000.0)


def test_a_full_announcement_is_parsed():
    ann = parse({"id": "door-1", "text": "Someone is at the door.", "voice": "en_US-joe-medium",
                 "priority": 7, "expires_at": 2000, "volume": 0.5, "chime": True, "future_field": 1})
    assert (ann.id, ann.priority, ann.expires_at, ann.volume, ann.chime) == ("door-1", 7, 2000.0, 0.5, True)
    assert ann.received_at == 1000.0
    assert not ann.expired(now=1999) and ann.expired(now=2000)


def test_defaults_apply_to_missing_optional_fields():
    ann = parse({"id": "a", "text": "Hi."}, AnnouncementSettings(default_priority=3))
    assert (ann.voice, ann.priority, ann.expires_at, ann.volume, ann.chime) == (None, 3, None, 1.0, False)


@pytest.mark.parametrize(("payload", "reason"), [
    (b"{not json", "invalid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"id": "a", "text": "x", "volume": NaN}', "invalid JSON"),
    ({"text": "hello"}, "missing 'id'"),
    ({"id": "", "text": "hello"}, "missing 'id'"),
    ({"id": "../etc/passwd", "text": "hello"}, "'id' must be"),
    ({"id": "a\n", "text": "hello"}, "'id' must be"),  # it would name the file "a\n.wav"
    ({"id": "a"}, "missing 'text'"),
    ({"id": "a", "text": "   "}, "missing 'text'"),
    ({"id": "a", "text": "x" * 101}, "101 characters, the limit is 100"),
    ({"id": "a", "text": "\ufdfa" * 10}, "180 characters once normalised"),  # 10 written, 180 spoken
    ({"id": "a", "text": "x", "voice": "robot"}, "unknown voice 'robot'"),
    ({"id": "a", "text": "x", "priority": 10}, "'priority' must be an integer 0..9"),
    ({"id": "a", "text": "x", "priority": True}, "'priority'"),
    ({"id": "a", "text": "x", "expires_at": "tomorrow"}, "'expires_at'"),
    ({"id": "a", "text": "x", "volume": 1.5}, "'volume'"),
    ({"id": "a", "text": "x", "chime": "yes"}, "'chime'"),
    ({"id": "a", "text": "x", "conversation_id": "c\n"}, "'conversation_id' must be"),
    ({"id": "a", "text": "x", "conversation_id": "c d"}, "'conversation_id' must be"),  # was a prefix match
])
def test_bad_payloads_are_rejected_with_a_reason(payload, reason):
    with pytest.raises(Rejected) as info:
        parse(payload)
    assert reason in info.value.reason


def test_deeply_nested_json_within_the_limit_is_rejected_not_a_crash():
    payload = b"[" * 2000 + b"]" * 2000
    with pytest.raises(Rejected):
        parse_announcement(payload, AnnouncementSettings(max_payload_bytes=8192), VOICES)


def test_oversized_payload_is_rejected_before_parsing():
    payload = b'{"id": "big", "text": "' + b"a" * 5000 + b'"}'
    with pytest.raises(Rejected, match=r"payload is 5\d\d\d bytes, the limit is 4096") as info:
        parse(payload)
    assert info.value.id is None  # never parsed, so no id to report


def test_rejections_after_the_id_carry_the_id():
    with pytest.raises(Rejected) as info:
        parse({"id": "kitchen-7", "text": ""})
    assert info.value.id == "kitchen-7"


def test_a_payload_cannot_name_an_audio_file():
    ann = parse({"id": "a", "text": "Hi.", "audio": "/etc/passwd"})
    assert ann.audio is None and ann.text == "Hi."


@pytest.mark.parametrize(("field", "number", "reason"), [
    ("volume", "9" * 4400, "'volume' must be a number 0..1"),  # past Python's int conversion limit
    ("volume", "9" * 400, "'volume' must be a number 0..1"),  # an int, but float() overflows
    ("expires_at", "-" + "9" * 400, "'expires_at' must be a number"),
    ("priority", "9" * 4400, "'priority' must be an integer 0..9"),
])
def test_a_number_too_long_for_python_is_rejected_by_its_field_with_the_id(field, number, reason):
    payload = f'{{"id": "poison-1", "text": "Hi.", "{field}": {number}}}'.encode()
    with pytest.raises(Rejected, match=reason) as caught:
        parse(payload, AnnouncementSettings(max_payload_bytes=8192))
    assert caught.value.id == "poison-1"


def test_loads_refuses_constants_and_decodes_an_over_long_integer_as_infinite():
    from edge_agent.announce.message import loads

    assert loads('{"a": 12, "b": ' + "9" * 4400 + "}") == {"a": 12, "b": float("inf")}
    with pytest.raises(ValueError, match="NaN is not allowed"):
        loads(b'{"a": NaN}')


DEEP = "[" * 20_000 + "]" * 20_000


@pytest.mark.parametrize(("payload", "found"), [
    ('{"id": "a1", "volume": NaN, "text": "x"}', {"id": "a1"}),
    ('{"text": ' + DEEP + ', "id": "deep", "siteId": "kitchen"}', {"id": "deep", "siteId": "kitchen"}),
    ('{"id": ' + "9" * 4400 + ', "siteId": "s"}', {"siteId": "s"}),
    (f'{{"id": {SAFE_INTEGER}}}', {"id": SAFE_INTEGER}),
    (f'{{"id": {SAFE_INTEGER + 1}}}', {}),
    ('{"x": "a\\"}[{", "id": -12, "y": {"z": "}]"}, "siteId": "q"}', {"id": -12, "siteId": "q"}),
    ('{"id": "first", "id": 1.5}', {}),  # the last of a repeated key counts, as json.loads has it
    ('{"id": "ok", "text": "unterminated', {"id": "ok"}),
    ('{"text": [[[', {}),
    ('["id", "x"]', {}),
    ('', {}),
], ids=["nan", "deep", "huge-int", "safe-int", "unsafe-int", "brackets-in-strings", "repeated", "torn",
        "unclosed", "array", "empty"])
def test_a_tolerant_look_reads_top_level_ids_a_strict_parse_refuses(payload: str, found: dict) -> None:
    assert peek(payload, ("id", "siteId")) == found


def test_the_tolerant_look_costs_a_pass_over_the_payload_not_its_nesting() -> None:
    # 128 KB of nesting that never closes: one pass, no recursion.
    assert peek('{"text": ' + "[{" * 64_000 + ', "id": "x"}', ("id",)) == {}


def test_a_string_that_never_closes_is_looked_at_once_not_from_every_quote_in_it() -> None:
    # Seen: 64 KiB of escaped quotes after an unclosed string took ~40 s (a rescan from each quote).
    payload = '{"id": "x", "a": ["' + '\\"' * 32_000
    start = time.monotonic()
    assert peek(payload, ("id",)) == {"id": "x"}
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(("payload", "reason"), [
    (b'{"id": "n-1", "text": "Hi.", "volume": NaN}', "invalid JSON: NaN is not allowed"),
    (b'{"id": "n-2", "text": "Hi.", "priority": -Infinity}', "invalid JSON: -Infinity is not allowed"),
    (('{"text": ' + DEEP + ', "id": "n-3"}').encode(), "invalid JSON: nested too deeply"),
    (b'{"id": "n-4", "text": "Hi.", "volume": 1,}', "invalid JSON: Expecting property name"),
    (b'{"id": "n-5", "text": "\xff\xfe"}', "payload is not UTF-8"),
])
def test_a_payload_a_strict_parse_refuses_is_rejected_with_the_id_it_names(payload: bytes,
                                                                           reason: str) -> None:
    with pytest.raises(Rejected) as info:
        parse_announcement(payload, AnnouncementSettings(), VOICES)
    assert reason in info.value.reason
    assert info.value.id == payload.split(b'"id": "')[1].split(b'"')[0].decode()


def test_a_refused_payload_whose_id_is_not_valid_is_rejected_without_one() -> None:
    with pytest.raises(Rejected) as info:
        parse_announcement(b'{"id": "has space", "volume": NaN}', AnnouncementSettings(), VOICES)
    assert info.value.id is None
