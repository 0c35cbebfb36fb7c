"""Which part of the device an inbound MQTT message is for: one dispatcher for every topic.

The bridge hands each message it reads to `Dispatcher.on_message` (several read in one go to
`on_messages`). The device's own topics (`Topics.kind`) go to the announcer and to the fleet
config's handler; any other topic to the adapters riding on the bridge (Home Assistant, Hermes),
each of which says whether the topic is its own. The dispatcher knows them only as
`TopicAdapter`s and the announcer only as `Announcements`: the MQTT transport imports neither.

Messages read in one go are routed together: each run of announcements, whichever trigger
carried them (the announce topics, Home Assistant's notify, a Hermes say), goes to
`Announcements.submit_many`, so the journal stores the run with one write and one fsync (group
commit) before any of it is acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from edge_agent.mqtt.topics import Topics

log = logging.getLogger(__name__)

Request = bytes | Mapping[str, Any]
"""An announcement request: a message's payload as it came, or a document an adapter made of it."""


class Announcements(Protocol):
    """Where announcement requests go (`announce.pipeline.Announcer`): True once a request is stored."""

    def submit(self, request: Request, source: str = "") -> bool: ...

    def submit_many(self, requests: Sequence[tuple[Request, str]]) -> list[bool]: ...


class TopicAdapter(Protocol):
    """A trigger on the bridge with topics of its own (Home Assistant, Hermes)."""

    def subscriptions(self) -> tuple[str, ...]: ...

    def handle(self, topic: str, payload: bytes) -> bool | None:
        """Carry out one message; None if `topic` is not the adapter's. False: deliver it again."""

    def announcement(self, topic: str, payload: bytes) -> Request | Literal[True] | None:
        """The announcement request a message carries; True for one already answered; None for
        any other message."""


class Dispatcher:
    """Routes inbound messages by topic; each handler answers True once its message is safe to
    acknowledge (the bridge's `InboundHandler`)."""

    def __init__(self, topics: Callable[[], Topics], announcements: Announcements, *,
                 config: Callable[[bytes], bool], adapters: Sequence[TopicAdapter] = (),
                 connected: Sequence[Callable[[], None]] = ()) -> None:
        # `topics` is read per message: a reload that moves the device to another group changes them.
        self.topics = topics
        self.announcements = announcements
        self.config = config
        self.adapters = list(adapters)
        self.connected = list(connected)
        """Called in order on each connection (the status, Home Assistant's discovery, ...)."""

    def subscriptions(self) -> tuple[str, ...]:
        """Every topic a handler is waiting for: the device's own, then the adapters'."""
        return (*self.topics().subscriptions(), *(t for a in self.adapters for t in a.subscriptions()))

    def on_connect(self, session_present: bool) -> None:
        """The bridge connected (a new or a resumed session): tell whoever says something then."""
        for hook in self.connected:
            hook()

    def on_message(self, topic: str, payload: bytes, retained: bool) -> bool:
        """Carry out one message; True once it is safe to acknowledge."""
        kind = self.topics().kind(topic)
        if kind == "announce":
            return self.announcements.submit(payload, topic)
        if kind == "config":
            return self.config(payload)
        for adapter in self.adapters:
            handled = adapter.handle(topic, payload)
            if handled is not None:
                return handled
        log.debug("no handler for a message to %s (an old subscription's): acknowledged", topic)
        return True

    def announcement(self, topic: str, payload: bytes) -> Request | Literal[True] | None:
        """The announcement request a message carries (on the announce topics, or an adapter's);
        True for a trigger's message already answered; None for any other message."""
        if self.topics().kind(topic) == "announce":
            return payload
        for adapter in self.adapters:
            request = adapter.announcement(topic, payload)
            if request is not None:
                return request
        return None

    def on_messages(self, batch: Sequence[tuple[str, bytes, bool]]) -> list[bool]:
        """`on_message` for messages read in one go, in order: each run of announcements is
        journaled with one fsync (`Announcements.submit_many`); a trigger's message needing no
        announcement (another Hermes site's say) does not break a run. Stops after the first
        refusal (the bridge acknowledges in order, up to it)."""
        results: list[bool] = []
        run: list[tuple[Request, str]] = []
        run_at: list[int] = []
        """Where each of `run`'s results goes in `results`."""

        def submit_run() -> bool:
            if run:
                for at, ok in zip(run_at, self.announcements.submit_many(run), strict=True):
                    results[at] = ok
                run.clear()
                run_at.clear()
            return all(results)

        for topic, payload, retained in batch:
            request = self.announcement(topic, payload)
            if request is True:
                results.append(True)
            elif request is not None:
                run_at.append(len(results))
                results.append(True)  # until its run is submitted
                run.append((request, topic))
            else:
                if not submit_run():
                    break
                results.append(self.on_message(topic, payload, retained))
                if not results[-1]:
                    break
        else:
            submit_run()
        return results[:results.index(False) + 1] if False in results else results
