"""What the device says about itself on MQTT: its status, each announcement's status, the fleet
config's report and the metrics.

The status (`<device>/status`, retained) is the one place a person looks to see what a device
is doing: online or offline (the will), its version and config version, what waits to be said,
a journal that cannot be written, and what the microphone, the satellite and the music do
(`parts`, which the daemon fills as it starts them). Everything goes out through `publish`, the
bridge's outbox, from whichever thread has something to say.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from edge_agent import __version__
from edge_agent.announce.pipeline import Announcer
from edge_agent.fleet.manager import Report
from edge_agent.metrics import Metrics
from edge_agent.mqtt.bridge import Bridge
from edge_agent.mqtt.outbox import KEEP, KEEP_LEAST, KEEP_MOST, Message
from edge_agent.mqtt.topics import Topics

Part = Callable[[], Any]
"""A section of the online status, read as the status is made; None leaves it out."""


class DeviceStatus:
    """Makes and publishes the device's status, announcement statuses, config reports and metrics."""

    def __init__(self, publish: Callable[[Message], None], topics: Callable[[], Topics],
                 metrics: Metrics, config_version: Callable[[], int]) -> None:
        # `topics` is read per message: a reload that moves the device to another group changes them.
        self.publish = publish
        self.topics = topics
        self.metrics = metrics
        self.config_version = config_version
        self.started = time.monotonic()
        self.announcements: Announcer | None = None
        """Set once built: its queue and journal are on the status (the journal reports before)."""
        self.bridge: Bridge | None = None
        """Set once made (MQTT may be off): the heartbeat waits for its connection, the metrics count
        its outbox."""
        self.parts: dict[str, Part] = {}
        """Further sections of the online status, in order (`listen`, `satellite`, `music`)."""

    def message(self, state: str) -> Message:
        """The status as `state` ("online", "offline") says it, retained."""
        doc: dict[str, Any] = {"state": state, "version": __version__,
                               "config_version": self.config_version(), "ts": round(time.time(), 3)}
        if state == "online":
            doc["uptime_s"] = round(time.monotonic() - self.started, 1)
            if self.announcements is not None:
                doc["queued"] = len(self.announcements.queue)
                error = self.announcements.journal.error
                if error is not None:
                    doc["journal_error"] = error  # announcements wait in the broker until it clears
            for name, part in self.parts.items():
                value = part()
                if value is not None:
                    doc[name] = value
        return Message.json(self.topics().status, doc, qos=1, retain=True, coalesce=True)

    def online(self) -> None:
        """Publish the status as it is now."""
        self.publish(self.message("online"))

    def journal_error(self, error: str | None) -> None:
        """The journal stopped (or started again) being writable: say so on the device status."""
        if self.announcements is not None:
            self.online()

    def announce_status(self, doc: dict[str, Any]) -> None:
        """An announcement's status (`Announcer.observe`)."""
        # One waiting status per id (the newest). An id's first status (queued, rejected, a
        # duplicate's answer) and its final one are never pushed out by another id's: only
        # `speaking` and a resumed `queued` say nothing the producer cannot do without.
        later = doc["state"] == "speaking" or (doc["state"] == "queued" and "resume" in doc)
        ann_id = doc.get("id")
        self.publish(Message.json(self.topics().announce_status, doc, qos=1,
                                  key=ann_id if isinstance(ann_id, str) else None,
                                  rank=KEEP if later else KEEP_MOST))

    def config_status(self, report: Report) -> None:
        """What became of a fleet config (retained), and the status with its version."""
        self.publish(Message.json(self.topics().config_status, report.to_json(), qos=1, retain=True))
        self.online()

    def publish_metrics(self) -> None:
        """The counters and histograms, with the queues' sizes now."""
        metrics, outbox = self.metrics, self.bridge.outbox if self.bridge is not None else None
        metrics.set("uptime_s", round(time.monotonic() - self.started, 1))
        if self.announcements is not None:
            metrics.set("announcements_queued", len(self.announcements.queue))
            metrics.set("journal_write_errors", self.announcements.journal.write_errors)
        if outbox is not None:
            metrics.set("mqtt_outbound_queued", len(outbox))
            metrics.set("mqtt_outbound_dropped", outbox.dropped)
            metrics.set("mqtt_outbound_dropped_final", outbox.dropped_final)
            metrics.set("mqtt_outbound_replaced", outbox.replaced)
            metrics.set("mqtt_outbound_expired", outbox.expired)
            metrics.set("mqtt_outbound_bytes", outbox.bytes)
        doc = {"ts": round(time.time(), 3), **metrics.snapshot()}
        self.publish(Message.json(self.topics().metrics, doc, qos=0, coalesce=True, rank=KEEP_LEAST))

    async def heartbeat(self, period_s: Callable[[], float]) -> None:
        """The status every `period_s()` while the bridge is connected (runs until cancelled)."""
        while True:
            await asyncio.sleep(period_s())
            if self.bridge is not None and self.bridge.connected:
                self.online()

    async def metrics_every(self, period_s: Callable[[], float]) -> None:
        """The metrics every `period_s()` (runs until cancelled)."""
        while True:
            await asyncio.sleep(period_s())
            self.publish_metrics()
