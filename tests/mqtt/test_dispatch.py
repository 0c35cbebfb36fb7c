"""The dispatcher routes each inbound topic to the part it is for, and a batch's announcements,
whichever trigger carried them, to one journal write."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pytest

from edge_agent.mqtt.dispatch import Dispatcher, Request
from edge_agent.mqtt.topics import Topics


class Announcements:
    """Stores what it is handed; refuses the payloads in `refuse` (a full disk)."""

    def __init__(self, refuse: tuple[bytes, ...] = ()) -> None:
        self.refuse = refuse
        self.stored: list[tuple[Request, str]] = []
        self.writes = 0

    def submit(self, request: Request, source: str = "") -> bool:
        return self.submit_many([(request, source)])[0]

    def submit_many(self, requests: Sequence[tuple[Request, str]]) -> list[bool]:
        self.writes += 1
        results = [request not in self.refuse for request, _ in requests]
        self.stored += [r for r, ok in zip(requests, results, strict=True) if ok]
        return results


class Notify:
    """An adapter with one topic whose messages are announcements, and one it carries out itself."""

    def __init__(self) -> None:
        self.handled: list[bytes] = []

    def subscriptions(self) -> tuple[str, ...]:
        return ("ha/notify", "ha/volume/set")

    def handle(self, topic: str, payload: bytes) -> bool | None:
        if topic == "ha/volume/set":
            self.handled.append(payload)
            return True
        return None

    def announcement(self, topic: str, payload: bytes) -> Mapping[str, Any] | Literal[True] | None:
        if topic != "ha/notify":
            return None
        return True if payload == b"answered" else {"text": payload.decode()}


def dispatcher(announcements: Announcements, configs: list[bytes], adapter: Notify) -> Dispatcher:
    topics = Topics("edge", "dev1", "kitchen")
    return Dispatcher(lambda: topics, announcements, config=lambda p: configs.append(p) is None,
                      adapters=[adapter])


def test_each_topic_reaches_its_handler_and_an_unknown_one_is_acknowledged_and_reported(caplog) -> None:
    announcements, configs, adapter = Announcements(), [], Notify()
    dispatch = dispatcher(announcements, configs, adapter)
    assert dispatch.subscriptions()[-2:] == ("ha/notify", "ha/volume/set")
    assert "edge/dev1/announce" in dispatch.subscriptions()
    assert dispatch.on_message("edge/group/kitchen/announce", b'{"text": "Hi."}', False)
    assert dispatch.on_message("edge/dev1/config", b"signed", True)
    assert dispatch.on_message("ha/volume/set", b"0.5", False)
    with caplog.at_level(logging.DEBUG, logger="edge_agent.mqtt.dispatch"):
        assert dispatch.on_message("old/topic", b"x", False)  # an old subscription's: not redelivered
    assert announcements.stored == [(b'{"text": "Hi."}', "edge/group/kitchen/announce")]
    assert configs == [b"signed"] and adapter.handled == [b"0.5"]
    assert "no handler for a message to old/topic" in caplog.text


def test_a_batch_journals_each_run_of_announcements_once_across_triggers() -> None:
    announcements, configs, adapter = Announcements(), [], Notify()
    dispatch = dispatcher(announcements, configs, adapter)
    batch = [("edge/dev1/announce", b"one", False), ("ha/notify", b"two", False),
             ("ha/notify", b"answered", False),  # needs no announcement: the run goes on
             ("edge/dev1/config", b"cfg", True), ("edge/dev1/announce", b"three", False)]
    assert dispatch.on_messages(batch) == [True] * 5
    assert announcements.writes == 2  # one write before the config, one after it
    assert [r for r, _ in announcements.stored] == [b"one", {"text": "two"}, b"three"]
    assert configs == [b"cfg"]


def test_a_batch_stops_after_the_first_refusal() -> None:
    announcements, configs, adapter = Announcements(refuse=(b"full",)), [], Notify()
    dispatch = dispatcher(announcements, configs, adapter)
    batch = [("edge/dev1/announce", b"ok", False), ("edge/dev1/announce", b"full", False),
             ("edge/dev1/announce", b"later", False), ("edge/dev1/config", b"cfg", True)]
    assert dispatch.on_messages(batch) == [True, False]  # the rest comes again
    assert configs == []


@pytest.mark.parametrize("session_present", [True, False])
def test_a_connection_calls_each_hook_in_order(session_present: bool) -> None:
    calls: list[str] = []
    dispatch = Dispatcher(lambda: Topics("edge", "dev1", "g"), Announcements(), config=lambda p: True,
                          connected=[lambda: calls.append("status"), lambda: calls.append("discovery")])
    dispatch.on_connect(session_present)
    assert calls == ["status", "discovery"]
