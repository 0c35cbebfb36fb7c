"""The speaker thread: the most urgent announcement spoken, one at a time, to its end or a stop.

Each announcement's `start` is journaled before it is spoken (a disk that refuses it delays
speaking instead of risking a repeat after a crash). A more urgent arrival (with
`announcements.interrupt`), a conversation turn's hold (for all but its answers) or shutting
down stops it at the next sentence boundary; it waits again from there, its audio budget as used.

It reads the `Speaking` bundle once per announcement, after clearing `idle`, and sets `idle`
again only after its last use of it: once a new bundle is in place and `idle` is set, nothing
holds the old one's synthesizer (`pipeline.Announcer.swap`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from edge_agent.announce.journal import JournalError
from edge_agent.announce.message import Announcement
from edge_agent.announce.outcomes import Outcomes
from edge_agent.announce.playout import Spoken, speak
from edge_agent.announce.queue import AnnouncementQueue, Item
from edge_agent.announce.speaking import CurrentSpeaking

# A child of the pipeline's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.announce.pipeline.speaker")

JOURNAL_RETRY_S = (0.5, 10.0)
"""The speaker's wait before it tries again to record a start the journal refused: first, most."""


class Speaker:
    """Started and stopped with the pipeline; `busy`, `current` and `last_spoke` from any thread."""

    def __init__(self, queue: AnnouncementQueue, outcomes: Outcomes, speaking: CurrentSpeaking) -> None:
        self.queue = queue
        self.outcomes = outcomes
        self.journal = outcomes.journal
        self.metrics = outcomes.metrics
        self.speaking = speaking
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy = threading.Event()
        """Set while an announcement is being spoken (a listener can ignore its own voice)."""
        self.idle = threading.Event()
        """The opposite of `busy`, to wait on; see the module."""
        self.idle.set()
        self.last_spoke = float("-inf")
        """`time.monotonic()` when speech last ended."""
        self.current: Announcement | None = None
        """The announcement being spoken (a listener can tell its own voice by its text)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="speaker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop at the next sentence boundary; what is left stays queued (and in the journal)."""
        self._stopping.set()
        self.queue.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        for item in self.queue.items():
            if item.sink is not None:  # a half-written file: the rest is spoken after a restart
                item.sink.abort()

    @property
    def running(self) -> bool:
        """The thread is taking announcements."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        retry_s = JOURNAL_RETRY_S[0]
        while not self._stopping.is_set():
            item = self.queue.get(timeout=0.5)
            if item is None:
                continue
            if self._stopping.is_set():
                self.queue.put(item.announcement, item.resume, item.sink, seq=item.seq, spent_s=item.spent_s)
                break
            try:
                self._speak(item)
                retry_s = JOURNAL_RETRY_S[0]
            except JournalError:
                # Speaking unrecorded could repeat it after a crash: wait for the disk instead.
                # The item keeps its place; the journal has logged why (rate-limited).
                self.queue.put(item.announcement, item.resume, item.sink, seq=item.seq, spent_s=item.spent_s)
                self._stopping.wait(retry_s)
                retry_s = min(retry_s * 2, JOURNAL_RETRY_S[1])
                self.journal.retry()
            except Exception:  # the thread must survive anything one announcement does
                log.exception("speaker failed", extra={"id": item.announcement.id})

    def _speak(self, item: Item) -> None:
        ann = item.announcement
        if ann.expired():
            if item.sink is not None:
                item.sink.abort()
            self.outcomes.finish(ann, "expired")
            return
        self.journal.start(ann.id)  # JournalError: not spoken now, see _run

        def started(engine: str) -> None:
            latency = time.time() - ann.received_at
            if item.resume == 0:
                self.metrics.observe("announce_first_audio_s", latency)
            log.info("speaking (%s engine, %.3f s after arrival)", engine, latency,
                     extra={"id": ann.id, "engine": engine, "resume": item.resume})
            self.outcomes.status(ann.id, "speaking", engine=engine)

        self.idle.clear()  # before reading the bundle: see the module
        self.busy.set()
        speaking = self.speaking()

        def should_stop() -> bool:
            if self._stopping.is_set() or (self.queue.held and not ann.answer):
                return True
            top = self.queue.top_priority()
            return speaking.settings.interrupt and top is not None and top > ann.priority

        self.current = ann
        try:
            result = speak(item, speaking.synth, speaking.opener, should_stop=should_stop,
                           on_start=started, budget_s=speaking.settings.max_audio_s - item.spent_s)
        except Exception as exc:
            self.outcomes.fail(ann, str(exc).strip().splitlines()[0] if str(exc).strip()
                               else type(exc).__name__)
            return
        finally:
            self.current = None
            self.last_spoke = time.monotonic()
            self.busy.clear()
            self.idle.set()
        if result.complete:
            self._done(ann, result, speaking.settings.max_audio_s)
        else:
            self._requeue(item, result)

    def _done(self, ann: Announcement, result: Spoken, max_audio_s: float) -> None:
        """Spoken to its end (or its audio budget's)."""
        self.metrics.inc("announcements_spoken")
        log.info("announcement spoken (%.2f s of audio)", result.audio_s,
                 extra={"id": ann.id, "engine": result.engine, "event": "spoken"})
        cut: dict[str, Any] = {}
        if result.truncated:
            self.metrics.inc("announcements_truncated")
            cut = {"truncated": True, "error": f"cut after {max_audio_s:g} s of audio "
                   "(announcements.max_audio_s)"}
            log.warning("announcement truncated: %s", cut["error"], extra={"id": ann.id})
        outcome = _played(result, cut)
        if not outcome["played"]:
            self.metrics.inc("announcements_discarded")
            log.info("announcement not played: %s", result.discarded, extra={"id": ann.id})
        self.journal.finish(ann.id, "done", engine=result.engine, **outcome)
        self.outcomes.drop_audio(ann)
        self.outcomes.status(ann.id, "done", engine=result.engine, **outcome, **_turn(ann))

    def _requeue(self, item: Item, result: Spoken) -> None:
        """Stopped at a sentence boundary: it waits again from there, its audio budget as used."""
        ann = item.announcement
        spent_s = item.spent_s + result.audio_s
        self.journal.requeue(ann.id, result.resume, spent_s)
        self.queue.put(ann, result.resume, result.sink, seq=item.seq, spent_s=spent_s)
        why = ("shutting down" if self._stopping.is_set()
               else "a conversation turn" if self.queue.held else "a more urgent announcement")
        log.info("stopped before sentence %d for %s; resumes later", result.resume, why,
                 extra={"id": ann.id})
        self.outcomes.status(ann.id, "queued", priority=ann.priority, resume=result.resume)


def _played(result: Spoken, cut: dict[str, Any]) -> dict[str, Any]:
    """A `done` status's account of its audio: `played: false` (why, in `error`) when it was
    discarded, so that a consumer never takes silence for success; `truncated` as cut."""
    if result.discarded is None:
        return {**cut, "played": True}
    why = f"not played: {result.discarded}"
    return {**cut, "played": False, "error": f"{why}; {cut['error']}" if "error" in cut else why}


def _turn(ann: Announcement) -> dict[str, Any]:
    """What a `done` status tells the listener about a conversation turn."""
    turn: dict[str, Any] = {"conversation_id": ann.conversation_id} if ann.answer else {}
    if ann.expect_reply:
        turn["expect_reply"] = True
    return turn
