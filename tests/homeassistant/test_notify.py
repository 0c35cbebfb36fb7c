"""What a notify message from Home Assistant becomes before the announcement checks."""

from __future__ import annotations

import json

from edge_agent.homeassistant.adapter import notify_request


def test_our_templates_json_goes_to_the_checks_as_it_is() -> None:
    payload = json.dumps({"id": "ha-1", "text": "Dinner."}).encode()
    assert notify_request(payload) == payload


def test_plain_text_becomes_an_announcement_with_an_id_of_its_own() -> None:
    request = notify_request(b"  The washer is done.\n")
    assert isinstance(request, dict) and request["text"] == "The washer is done."
    assert request["id"].startswith("ha-")


def test_json_that_does_not_decode_goes_to_the_checks_to_be_rejected_not_spoken() -> None:
    truncated = b'{"id": "ha-2", "text": '
    huge = b'{"id": "ha-3", "text": "x", "volume": ' + b"9" * 4400 + b"}"
    assert notify_request(truncated) == truncated
    assert notify_request(huge) == huge


def test_nesting_too_deep_for_the_decoder_is_text_not_an_exception() -> None:
    request = notify_request(b"[" * 100000)
    assert isinstance(request, dict) and request["text"] == "[" * 100000
