"""Announcements end to end: check, journal, queue, speak, report, whatever the trigger.

The API a trigger uses is small and knows nothing of MQTT:

- `Announcer.submit(request, source)` takes a JSON payload (MQTT today) or a decoded
  document (the Home Assistant and Hermes adapters). It returns only once
  an accepted announcement is in the journal, so a trigger that acknowledges its
  message after that loses nothing; False means "not stored, deliver it again".
  `submit_many` does the same for several read in one go, with one journal write
  and fsync for all of them (a flood is acknowledged at disk speed, not fsync rate).
- `Announcer.submit_audio(samples, sample_rate, ann_id=...)` takes audio an in-process
  trigger already has (a Wyoming `announce`); the same contract. Its WAV is stored
  under `<journal directory>/audio/` before the journal record that names it and
  removed once the announcement is final (`audiofiles`).
- `Announcer.observe(callback)` registers a callable that gets every status change
  (the `announce/status` payload of DESIGN.md):
  queued -> speaking -> done | expired | failed, or rejected at once.

A speaker thread takes the most urgent announcement and speaks it; a more urgent
arrival stops it at the next sentence boundary and it resumes afterwards.

What an announcement is spoken with (settings, synthesizer, sink opener, known
voices) is one immutable `Speaking` bundle. Invariant: the bundle is replaced
whole by `swap` (one reference assignment) and never mutated; `submit` reads it
once per request and the speaker thread once per announcement, after clearing
`idle`, and sets `idle` again only after its last use of it. So once `swap` has
returned and `idle` is set, nothing holds the old bundle's synthesizer any more
(`wait_idle`), and it may be closed.

The `Announcer` is the pipeline assembled: `admission` (check, dedupe, journal, queue),
`speaker` (the thread), `outcomes` (statuses and what a final state does), over the
`journal`, the `queue` and the audio announcements' files (`audiofiles`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edge_agent.announce.admission import Admission
from edge_agent.announce.audiofiles import AudioFiles
from edge_agent.announce.journal import INTERRUPTED, Journal
from edge_agent.announce.message import Announcement
from edge_agent.announce.outcomes import Outcomes, StatusObserver
from edge_agent.announce.queue import AnnouncementQueue
from edge_agent.announce.speaker import Speaker
from edge_agent.announce.speaking import Speaking
from edge_agent.audio.frames import Samples
from edge_agent.metrics import Metrics

__all__ = ["Announcer", "Speaking", "StatusObserver"]

log = logging.getLogger(__name__)


class Announcer:
    """The announcement pipeline of one device."""

    def __init__(self, speaking: Speaking, journal: Journal, *, metrics: Metrics | None = None) -> None:
        self.journal = journal
        self.audio_files = AudioFiles((journal.directory / "audio").absolute())
        self.queue = AnnouncementQueue()
        self.metrics = metrics or Metrics()
        self._speaking = speaking
        self._outcomes = Outcomes(journal, self.audio_files, self.metrics)
        self._admission = Admission(self.queue, self._outcomes, lambda: self._speaking)
        self._speaker = Speaker(self.queue, self._outcomes, lambda: self._speaking)
        self.busy = self._speaker.busy
        """Set while an announcement is being spoken (a listener can ignore its own voice)."""

    @property
    def current(self) -> Announcement | None:
        """The announcement being spoken (a listener can tell its own voice by its text)."""
        return self._speaker.current

    @property
    def last_spoke(self) -> float:
        """`time.monotonic()` when speech last ended."""
        return self._speaker.last_spoke

    @last_spoke.setter
    def last_spoke(self, at: float) -> None:
        self._speaker.last_spoke = at

    # -- conversation turns (any thread) -------------------------------------------------

    def hold(self) -> None:
        """Pause for a conversation turn: the announcement playing stops at its next sentence
        boundary and waits, queued, with everything else; only answers are spoken until `release`."""
        self.queue.hold(True)

    def release(self) -> None:
        """End a `hold`: the paused announcement resumes where it stopped."""
        self.queue.hold(False)

    @property
    def held(self) -> bool:
        return self.queue.held

    # -- what it speaks with (any thread) ---------------------------------------------

    @property
    def speaking(self) -> Speaking:
        return self._speaking

    def swap(self, speaking: Speaking) -> Speaking:
        """Speak the next announcement with `speaking`; returns the bundle it replaces.

        The announcement being spoken (if any) finishes with the old bundle: close a
        replaced synthesizer only after `wait_idle`.
        """
        old, self._speaking = self._speaking, speaking
        return old

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no announcement is being spoken; False after `timeout` seconds."""
        return self._speaker.idle.wait(timeout)

    def observe(self, observer: StatusObserver) -> Callable[[], None]:
        """Call `observer` with every status change from now on; returns a function that stops it."""
        return self._outcomes.observe(observer)

    # -- lifecycle -------------------------------------------------------------------

    def recover(self) -> None:
        """Open the journal; re-queue what was accepted and not spoken; report interrupted ones."""
        found = self.journal.open()
        for ann_id in found.interrupted:
            log.warning("announcement was speaking when the agent stopped; not repeated",
                        extra={"id": ann_id})
            self._outcomes.status(ann_id, "failed", error=INTERRUPTED)
        for ann, resume in found.pending:
            problem = self.audio_files.problem(ann.audio) if ann.audio is not None else None
            if problem is not None:
                self._outcomes.fail(ann, problem, drop_audio=False)
                continue
            self.queue.put(ann, resume, spent_s=found.spent.get(ann.id, 0.0))
            log.info("announcement recovered from the journal", extra={"id": ann.id, "resume": resume})
        # What a crash left between writing a file and its journal record, or between an
        # announcement's end and removing its file.
        with self._admission.lock:  # a file being stored now is not swept from under its announcement
            self.audio_files.sweep([item.announcement.audio for item in self.queue.items()
                                    if item.announcement.audio is not None])
        self.metrics.set("announcements_queued", len(self.queue))

    def start(self) -> None:
        self._speaker.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop at the next sentence boundary; what is left stays in the journal."""
        self._speaker.stop(timeout)
        self.journal.close()

    @property
    def running(self) -> bool:
        """The speaker thread is taking announcements."""
        return self._speaker.running

    # -- inbound (the trigger's thread) --------------------------------------------------

    def submit(self, request: bytes | Mapping[str, Any], source: str = "") -> bool:
        """Check, journal and queue one announcement (a JSON payload or a decoded document).

        True once the trigger may acknowledge it: it is in the journal, or it got a final
        answer (rejected, duplicate, expired). False: it could not be stored; deliver it again.
        `source` (a topic, a peer) is only logged.
        """
        return self.submit_many([(request, source)])[0]

    def submit_many(self, requests: Sequence[tuple[bytes | Mapping[str, Any], str]]) -> list[bool]:
        """`submit` for each (request, source) of a batch read in one go: the accepted ones are
        journaled with one write and one fsync (group commit), then each is queued and answered
        as `submit` would; the results are `submit`'s, in order. A journal that cannot be written
        stores none of the batch (all False)."""
        return self._admission.submit_many(requests)

    def submit_audio(self, samples: Samples, sample_rate: int, *, ann_id: str, text: str = "(audio)",
                     priority: int | None = None, conversation_id: str | None = None,
                     chime: bool = False, source: str = "") -> bool:
        """Check, store, journal and queue audio a trigger already has (mono float32 in -1..1).

        The contract of `submit`: True once it is journaled and queued or has had its final
        answer (rejected with a reason, duplicate id); False when it could not be stored (the
        WAV or the journal record failed to write), and then nothing of it is left on disk.
        `text` is only its label (logs, the self-hearing check); `source` is only logged.
        """
        return self._admission.submit_audio(samples, sample_rate, ann_id=ann_id, text=text, priority=priority,
                                            conversation_id=conversation_id, chime=chime, source=source)
