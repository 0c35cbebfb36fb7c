"""Where an announcement's changes of state go: a status to every observer and, once it is final,
its journal record, its count and the removal of its audio file.

The status payloads are `announce/status` of DESIGN.md (`message.status`): queued -> speaking ->
done | expired | failed, or rejected at once. Observers are called on the thread that changed
the state (a trigger's, the speaker's); one that raises is logged and the others still hear.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from edge_agent.announce.audiofiles import AudioFiles
from edge_agent.announce.journal import Journal
from edge_agent.announce.message import Announcement, status
from edge_agent.metrics import Metrics

# A child of the pipeline's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.announce.pipeline.outcomes")

StatusObserver = Callable[[dict[str, Any]], None]
"""Gets each `announce/status` payload, on the thread that changed the state."""


class Outcomes:
    """The statuses' observers, and the steps every final state takes; any thread."""

    def __init__(self, journal: Journal, audio_files: AudioFiles, metrics: Metrics) -> None:
        self.journal = journal
        self.audio_files = audio_files
        self.metrics = metrics
        self._observers: tuple[StatusObserver, ...] = ()
        self._observers_lock = threading.Lock()

    def observe(self, observer: StatusObserver) -> Callable[[], None]:
        """Call `observer` with every status change from now on; returns a function that stops it."""
        with self._observers_lock:
            self._observers = (*self._observers, observer)

        def forget() -> None:
            with self._observers_lock:
                self._observers = tuple(o for o in self._observers if o is not observer)

        return forget

    def status(self, ann_id: str | None, state: str, **extra: Any) -> None:
        """Tell every observer that `ann_id` is now in `state`."""
        doc = status(ann_id, state, **extra)
        for observer in self._observers:
            try:
                observer(doc)
            except Exception:
                log.exception("an announcement status observer failed", extra={"id": ann_id})

    def finish(self, ann: Announcement, state: str) -> None:
        """`ann` ended in `state` with nothing more to say (expired, say)."""
        self.metrics.inc(f"announcements_{state}")
        log.info("announcement %s", state, extra={"id": ann.id})
        self.journal.finish(ann.id, state)
        self.drop_audio(ann)
        self.status(ann.id, state)

    def fail(self, ann: Announcement, error: str, *, drop_audio: bool = True) -> None:
        """`ann` failed for `error`; its audio file is removed unless `drop_audio` is False (at
        recovery, where the file is the problem: the sweep that follows removes what is ours)."""
        self.metrics.inc("announcements_failed")
        log.error("announcement failed: %s", error, extra={"id": ann.id})
        self.journal.finish(ann.id, "failed", error=error)
        if drop_audio:
            self.drop_audio(ann)
        self.status(ann.id, "failed", error=error)

    def drop_audio(self, ann: Announcement) -> None:
        """An audio announcement's file, once nothing will play it (final, or never journaled)."""
        if ann.audio is not None:
            self.audio_files.remove(ann.audio)
