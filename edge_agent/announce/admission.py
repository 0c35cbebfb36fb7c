"""Admission: what a trigger submits is checked, deduplicated, journaled and queued, or answered.

The contract a trigger relies on: `submit_many` (and `submit_audio`) returns only once an
accepted announcement is in the journal, so a trigger that acknowledges its message after that
loses nothing; False means "not stored, deliver it again". A batch read in one go is journaled
with one write and fsync (group commit). Everything else gets its final answer at once, as a
status: rejected (with the reason), or the state of an id seen before (a duplicate, never spoken
twice). An audio announcement's WAV is stored before the journal record that names it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from edge_agent.announce.journal import JournalError
from edge_agent.announce.message import (
    ID_PATTERN,
    Announcement,
    Rejected,
    check_announcement,
    check_audio,
    loads,
    parse_announcement,
)
from edge_agent.announce.outcomes import Outcomes
from edge_agent.announce.queue import AnnouncementQueue
from edge_agent.announce.settings import AnnouncementSettings
from edge_agent.announce.speaking import CurrentSpeaking, Speaking
from edge_agent.audio.frames import Samples
from edge_agent.logs import Throttle

# A child of the pipeline's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.announce.pipeline.admission")

Request = bytes | Mapping[str, Any]
"""A JSON payload (MQTT) or a decoded document (the Home Assistant and Hermes adapters)."""


class Admission:
    """The inbound side of the pipeline, on the triggers' threads."""

    def __init__(self, queue: AnnouncementQueue, outcomes: Outcomes, speaking: CurrentSpeaking) -> None:
        self.queue = queue
        self.outcomes = outcomes
        self.journal = outcomes.journal
        self.audio_files = outcomes.audio_files
        self.metrics = outcomes.metrics
        self.speaking = speaking
        self.lock = threading.Lock()
        """One acceptance at a time: an audio file is written only for an id not seen yet."""
        self._reject_log = Throttle(1.0)
        self._crash_log = Throttle(60.0)

    def submit_many(self, requests: Sequence[tuple[Request, str]]) -> list[bool]:
        """Check, journal and queue each (request, source): see `pipeline.Announcer.submit_many`."""
        speaking = self.speaking()
        results = [True] * len(requests)
        checked: list[tuple[int, Announcement, str]] = []
        for index, (request, source) in enumerate(requests):
            ann = self._check(request, speaking, source)
            if ann is not None:
                checked.append((index, ann, source))
        stored = self._accept(checked, speaking.settings)
        for (index, _, _), ok in zip(checked, stored, strict=True):
            results[index] = ok
        return results

    def submit_audio(self, samples: Samples, sample_rate: int, *, ann_id: str, text: str,
                     priority: int | None, conversation_id: str | None, chime: bool, source: str) -> bool:
        """Check, store, journal and queue audio: see `pipeline.Announcer.submit_audio`."""
        self.metrics.inc("announcements_received")
        settings = self.speaking().settings
        try:
            ann, audio = check_audio(samples, sample_rate, ann_id=ann_id, text=text, priority=priority,
                                     conversation_id=conversation_id, chime=chime, settings=settings)
        except Rejected as exc:
            self._reject(exc.id, exc.reason, source)
            return True
        return self._accept([(0, ann, source)], settings, (audio, sample_rate))[0]

    def _check(self, request: Request, speaking: Speaking, source: str) -> Announcement | None:
        """The announcement `request` asks for; None once it has been rejected (its status sent)."""
        self.metrics.inc("announcements_received")
        try:
            if isinstance(request, bytes):
                return parse_announcement(request, speaking.settings, speaking.voices)
            return check_announcement(request, speaking.settings, speaking.voices)
        except Rejected as exc:
            self._reject(exc.id, exc.reason, source)
        except Exception as exc:  # the checks are pure: whatever they raise is the payload's doing
            if self._crash_log.ready():  # a traceback is worth having once, not once per message
                log.exception("announcement checks failed on a payload", extra={"topic": source})
            self._reject(_id_of(request), f"payload could not be checked ({type(exc).__name__})", source)
        return None

    def _reject(self, ann_id: str | None, reason: str, source: str = "") -> None:
        """A final `rejected` status; the log says so once a second at most (a flood of bad or
        surplus messages is one line a second, the rest counted in it; each status says why)."""
        self.metrics.inc("announcements_rejected")
        if self._reject_log.ready():
            skipped = self._reject_log.take_suppressed()
            more = f" ({skipped} more rejected since the last line)" if skipped else ""
            log.warning("announcement rejected: %s%s", reason, more, extra={"id": ann_id, "topic": source})
        else:
            log.debug("announcement rejected: %s", reason, extra={"id": ann_id, "topic": source})
        self.outcomes.status(ann_id, "rejected", error=reason)

    def _accept(self, checked: list[tuple[int, Announcement, str]], settings: AnnouncementSettings,
                audio: tuple[Samples, int] | None = None) -> list[bool]:
        """Journal and queue checked announcements (with `audio`: the one announcement it is);
        per announcement, whether its trigger may acknowledge it."""
        results = [True] * len(checked)
        fresh: list[int] = []
        """Positions in `checked` to journal, in order."""
        again: list[int] = []
        """Positions whose id comes earlier in the batch: a duplicate once that one is stored."""
        with self.lock:
            batch_ids: set[str] = set()
            for k, (_, ann, source) in enumerate(checked):
                if ann.id in batch_ids:
                    again.append(k)
                elif self._duplicate(ann):
                    pass
                elif len(self.queue) + len(fresh) >= settings.queue_max:
                    self._reject(ann.id, f"queue full ({settings.queue_max} waiting)", source)
                else:
                    fresh.append(k)
                    batch_ids.add(ann.id)
            if audio is not None and fresh:
                (k,) = fresh
                index, ann, source = checked[k]
                try:
                    # On disk before the journal names it; `save` leaves nothing when it fails.
                    stored_at = self.audio_files.save(ann.id, *audio)
                    checked[k] = (index, replace(ann, audio=str(stored_at)), source)
                except OSError as exc:
                    self.metrics.inc("announcements_unjournaled")
                    log.warning("audio announcement not stored (%s); left for the trigger to retry",
                                exc.strerror or exc, extra={"id": ann.id, "topic": source})
                    return [False]
            try:
                if fresh:
                    self.journal.accept_many([checked[k][1] for k in fresh])
            except JournalError:
                # Not acknowledged: the trigger delivers them again (the MQTT broker after a
                # reconnect). Nothing is lost and nothing is rejected that could still be spoken;
                # the journal logs the condition (rate-limited) and the device status carries it.
                for k in fresh:
                    self.outcomes.drop_audio(checked[k][1])
                    results[k] = False
                for k in again:
                    results[k] = False
                self.metrics.inc("announcements_unjournaled", len(fresh) + len(again))
                log.debug("%d announcements not journaled; left for redelivery", len(fresh) + len(again))
                return results
        for k in fresh:
            _, ann, source = checked[k]
            self._queue(ann, source)
        for k in again:
            self._duplicate(checked[k][1])
        return results

    def _duplicate(self, ann: Announcement) -> bool:
        """A redelivery or a producer retrying: never spoken twice; it is told where things stand."""
        seen = self.journal.get(ann.id)
        if seen is None:
            return False
        self.metrics.inc("announcements_duplicate")
        log.info("duplicate announcement ignored (%s)", seen.state, extra={"id": ann.id})
        self.outcomes.status(ann.id, seen.state, duplicate=True, **seen.extra)
        return True

    def _queue(self, ann: Announcement, source: str) -> None:
        """An announcement now in the journal: queued (or expired already)."""
        self.metrics.inc("announcements_accepted")
        if ann.expired():
            self.outcomes.finish(ann, "expired")
            return
        self.queue.put(ann)
        self.metrics.set("announcements_queued", len(self.queue))
        log.info("announcement queued (priority %d)", ann.priority, extra={"id": ann.id, "topic": source})
        self.outcomes.status(ann.id, "queued", priority=ann.priority)


def _id_of(request: Request) -> str | None:
    """The id of a request the checks could not finish, if it has a usable one."""
    try:
        doc = loads(request) if isinstance(request, bytes) else request
    except (ValueError, RecursionError):
        return None
    ann_id = doc.get("id") if isinstance(doc, Mapping) else None
    return ann_id if isinstance(ann_id, str) and ID_PATTERN.fullmatch(ann_id) else None
