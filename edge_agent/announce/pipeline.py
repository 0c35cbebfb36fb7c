"""Announcements end to end: validate, journal, queue, speak, report.

`receive` runs on the MQTT thread and returns only once an accepted announcement
is in the journal (its message is acknowledged after that). A speaker thread
takes the most urgent announcement and speaks it; a more urgent arrival stops it
at the next sentence boundary and it resumes afterwards. Every state change is
published on `<device>/announce/status`:
queued -> speaking -> done | expired | failed, or rejected at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from edge_agent.config import AnnouncementSettings
from edge_agent.metrics import Metrics
from edge_agent.announce.message import Announcement, Rejected, parse_announcement, status
from edge_agent.announce.journal import INTERRUPTED, Journal
from edge_agent.announce.queue import AnnouncementQueue, Item
from edge_agent.announce.playout import SinkOpener, speak
from edge_agent.tts.voice import Synthesizer

log = logging.getLogger(__name__)

StatusSink = Callable[[dict[str, Any]], None]


class Announcements:
    """The announcement pipeline of one device."""

    def __init__(self, settings: AnnouncementSettings, journal: Journal, *,
                 publish: StatusSink, voices: Callable[[], Collection[str]],
                 synthesizer: Callable[[], Synthesizer], opener: Callable[[], SinkOpener],
                 metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.journal = journal
        self.queue = AnnouncementQueue()
        self.metrics = metrics or Metrics()
        self._publish = publish
        self._voices = voices
        self._synthesizer = synthesizer
        self._opener = opener
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy = threading.Event()
        """Set while an announcement is being spoken (a listener can ignore its own voice)."""
        self.last_spoke = float("-inf")
        """`time.monotonic()` when speech last ended."""

    # -- lifecycle -------------------------------------------------------------------

    def recover(self) -> None:
        """Open the journal; re-queue what was accepted and not spoken; report interrupted ones."""
        found = self.journal.open()
        for ann_id in found.interrupted:
            log.warning("announcement was speaking when the agent stopped; not repeated",
                        extra={"id": ann_id})
            self._status(ann_id, "failed", error=INTERRUPTED)
        for ann, resume in found.pending:
            self.queue.put(ann, resume)
            log.info("announcement recovered from the journal", extra={"id": ann.id, "resume": resume})
        self.metrics.set("announcements_queued", len(self.queue))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="speaker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop at the next sentence boundary; what is left stays in the journal."""
        self._stopping.set()
        self.queue.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        for item in self.queue.items():
            if item.sink is not None:  # a half-written file: the rest is spoken after a restart
                item.sink.abort()
        self.journal.close()

    @property
    def running(self) -> bool:
        """The speaker thread is taking announcements."""
        return self._thread is not None and self._thread.is_alive()

    def update(self, settings: AnnouncementSettings) -> None:
        self.settings = settings

    # -- inbound (MQTT thread) -------------------------------------------------------

    def receive(self, payload: bytes, topic: str = "") -> bool:
        """Handle one payload; True once it may be acknowledged to the broker."""
        self.metrics.inc("announcements_received")
        try:
            ann = parse_announcement(payload, self.settings, self._voices())
        except Rejected as exc:
            self.metrics.inc("announcements_rejected")
            log.warning("announcement rejected: %s", exc.reason, extra={"id": exc.id, "topic": topic})
            self._status(exc.id, "rejected", error=exc.reason)
            return True
        seen = self.journal.get(ann.id)
        if seen is not None:
            # Redelivery or a producer retrying: never spoken twice; tell it where things stand.
            self.metrics.inc("announcements_duplicate")
            log.info("duplicate announcement ignored (%s)", seen.state, extra={"id": ann.id})
            self._status(ann.id, seen.state, duplicate=True, **seen.extra)
            return True
        if len(self.queue) >= self.settings.queue_max:
            self.metrics.inc("announcements_rejected")
            reason = f"queue full ({self.settings.queue_max} waiting)"
            log.warning("announcement rejected: %s", reason, extra={"id": ann.id})
            self._status(ann.id, "rejected", error=reason)
            return True
        try:
            self.journal.accept(ann)
        except OSError as exc:
            # Not acknowledged: the broker keeps it and delivers it again after a reconnect.
            log.error("cannot journal announcement: %s", exc, extra={"id": ann.id})
            return False
        self.metrics.inc("announcements_accepted")
        if ann.expired():
            self._finish(ann, "expired")
            return True
        self.queue.put(ann)
        self.metrics.set("announcements_queued", len(self.queue))
        log.info("announcement queued (priority %d)", ann.priority, extra={"id": ann.id, "topic": topic})
        self._status(ann.id, "queued", priority=ann.priority)
        return True

    # -- speaker thread ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            item = self.queue.get(timeout=0.5)
            if item is None:
                continue
            if self._stopping.is_set():
                self.queue.put(item.announcement, item.resume, seq=item.seq)
                break
            try:
                self._speak(item)
            except Exception:  # the thread must survive anything one announcement does
                log.exception("speaker failed", extra={"id": item.announcement.id})

    def _speak(self, item: Item) -> None:
        ann = item.announcement
        if ann.expired():
            if item.sink is not None:
                item.sink.abort()
            self._finish(ann, "expired")
            return
        self.journal.start(ann.id)

        def started(engine: str) -> None:
            latency = time.time() - ann.received_at
            if item.resume == 0:
                self.metrics.observe("announce_first_audio_s", latency)
            log.info("speaking (%s engine, %.3f s after arrival)", engine, latency,
                     extra={"id": ann.id, "engine": engine, "resume": item.resume})
            self._status(ann.id, "speaking", engine=engine)

        def should_stop() -> bool:
            if self._stopping.is_set():
                return True
            top = self.queue.top_priority()
            return self.settings.interrupt and top is not None and top > ann.priority

        self.busy.set()
        try:
            result = speak(item, self._synthesizer(), self._opener(), should_stop=should_stop,
                           on_start=started)
        except Exception as exc:
            error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.metrics.inc("announcements_failed")
            log.error("announcement failed: %s", error, extra={"id": ann.id})
            self.journal.finish(ann.id, "failed", error=error)
            self._status(ann.id, "failed", error=error)
            return
        finally:
            self.last_spoke = time.monotonic()
            self.busy.clear()
        if result.complete:
            self.metrics.inc("announcements_spoken")
            log.info("announcement spoken (%.2f s of audio)", result.audio_s,
                     extra={"id": ann.id, "engine": result.engine, "event": "spoken"})
            self.journal.finish(ann.id, "done", engine=result.engine)
            self._status(ann.id, "done", engine=result.engine)
            return
        self.journal.requeue(ann.id, result.resume)
        self.queue.put(ann, result.resume, result.sink, seq=item.seq)
        why = "shutting down" if self._stopping.is_set() else "a more urgent announcement"
        log.info("stopped before sentence %d for %s; resumes later", result.resume, why,
                 extra={"id": ann.id})
        self._status(ann.id, "queued", priority=ann.priority, resume=result.resume)

    # -- helpers -------------------------------------------------------------------------

    def _finish(self, ann: Announcement, state: str) -> None:
        self.metrics.inc(f"announcements_{state}")
        log.info("announcement %s", state, extra={"id": ann.id})
        self.journal.finish(ann.id, state)
        self._status(ann.id, state)

    def _status(self, ann_id: str | None, state: str, **extra: Any) -> None:
        try:
            self._publish(status(ann_id, state, **extra))
        except Exception:
            log.exception("cannot publish announcement status", extra={"id": ann_id})
