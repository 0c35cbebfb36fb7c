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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from edge_agent.announce.audiofiles import AudioFiles
from edge_agent.announce.journal import INTERRUPTED, Journal, JournalError
from edge_agent.announce.message import (
    ID_PATTERN,
    Announcement,
    Rejected,
    check_announcement,
    check_audio,
    loads,
    parse_announcement,
    status,
)
from edge_agent.announce.playout import SinkOpener, Spoken, speak
from edge_agent.announce.queue import AnnouncementQueue, Item
from edge_agent.announce.settings import AnnouncementSettings
from edge_agent.audio.frames import Samples
from edge_agent.logs import Throttle
from edge_agent.metrics import Metrics
from edge_agent.tts.voice import Synthesizer

log = logging.getLogger(__name__)

JOURNAL_RETRY_S = (0.5, 10.0)
"""The speaker's wait before it tries again to record a start the journal refused: first, most."""

StatusObserver = Callable[[dict[str, Any]], None]
"""Gets each `announce/status` payload, on the thread that changed the state."""


@dataclass(frozen=True)
class Speaking:
    """Everything an announcement is checked and spoken with; replaced whole, never mutated."""

    settings: AnnouncementSettings
    synth: Synthesizer
    opener: SinkOpener
    voices: frozenset[str]
    """Voice ids an announcement may ask for."""


class Announcer:
    """The announcement pipeline of one device."""

    def __init__(self, speaking: Speaking, journal: Journal, *, metrics: Metrics | None = None) -> None:
        self.journal = journal
        self.audio_files = AudioFiles((journal.directory / "audio").absolute())
        self._accept_lock = threading.Lock()
        """One acceptance at a time: an audio file is written only for an id not seen yet."""
        self.queue = AnnouncementQueue()
        self.metrics = metrics or Metrics()
        self._speaking = speaking
        self._observers: tuple[StatusObserver, ...] = ()
        self._observers_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy = threading.Event()
        """Set while an announcement is being spoken (a listener can ignore its own voice)."""
        self._idle = threading.Event()
        """The opposite of `busy`, for `wait_idle`; see the module's invariant."""
        self._idle.set()
        self._reject_log = Throttle(1.0)
        self._crash_log = Throttle(60.0)
        self.last_spoke = float("-inf")
        """`time.monotonic()` when speech last ended."""
        self.current: Announcement | None = None
        """The announcement being spoken (a listener can tell its own voice by its text)."""

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
        return self._idle.wait(timeout)

    def observe(self, observer: StatusObserver) -> Callable[[], None]:
        """Call `observer` with every status change from now on; returns a function that stops it."""
        with self._observers_lock:
            self._observers = (*self._observers, observer)

        def forget() -> None:
            with self._observers_lock:
                self._observers = tuple(o for o in self._observers if o is not observer)

        return forget

    # -- lifecycle -------------------------------------------------------------------

    def recover(self) -> None:
        """Open the journal; re-queue what was accepted and not spoken; report interrupted ones."""
        found = self.journal.open()
        for ann_id in found.interrupted:
            log.warning("announcement was speaking when the agent stopped; not repeated",
                        extra={"id": ann_id})
            self._status(ann_id, "failed", error=INTERRUPTED)
        for ann, resume in found.pending:
            problem = self.audio_files.problem(ann.audio) if ann.audio is not None else None
            if problem is not None:
                self.metrics.inc("announcements_failed")
                log.error("announcement failed: %s", problem, extra={"id": ann.id})
                self.journal.finish(ann.id, "failed", error=problem)
                self._status(ann.id, "failed", error=problem)
                continue
            self.queue.put(ann, resume, spent_s=found.spent.get(ann.id, 0.0))
            log.info("announcement recovered from the journal", extra={"id": ann.id, "resume": resume})
        # What a crash left between writing a file and its journal record, or between an
        # announcement's end and removing its file.
        with self._accept_lock:  # a file being stored now is not swept from under its announcement
            self.audio_files.sweep([item.announcement.audio for item in self.queue.items()
                                    if item.announcement.audio is not None])
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
        speaking = self._speaking
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

    def _check(self, request: bytes | Mapping[str, Any], speaking: Speaking,
               source: str) -> Announcement | None:
        """The announcement `request` asks for; None once it has been rejected (its status sent)."""
        self.metrics.inc("announcements_received")
        try:
            if isinstance(request, bytes):
                return parse_announcement(request, speaking.settings, speaking.voices)
            return check_announcement(request, speaking.settings, speaking.voices)
        except Rejected as exc:
            self._rejected(exc, source)
        except Exception as exc:  # the checks are pure: whatever they raise is the payload's doing
            if self._crash_log.ready():  # a traceback is worth having once, not once per message
                log.exception("announcement checks failed on a payload", extra={"topic": source})
            self._reject(_id_of(request), f"payload could not be checked ({type(exc).__name__})", source)
        return None

    def submit_audio(self, samples: Samples, sample_rate: int, *, ann_id: str, text: str = "(audio)",
                     priority: int | None = None, conversation_id: str | None = None,
                     chime: bool = False, source: str = "") -> bool:
        """Check, store, journal and queue audio a trigger already has (mono float32 in -1..1).

        The contract of `submit`: True once it is journaled and queued or has had its final
        answer (rejected with a reason, duplicate id); False when it could not be stored (the
        WAV or the journal record failed to write), and then nothing of it is left on disk.
        `text` is only its label (logs, the self-hearing check); `source` is only logged.
        """
        self.metrics.inc("announcements_received")
        settings = self._speaking.settings
        try:
            ann, audio = check_audio(samples, sample_rate, ann_id=ann_id, text=text, priority=priority,
                                     conversation_id=conversation_id, chime=chime, settings=settings)
        except Rejected as exc:
            self._rejected(exc, source)
            return True
        return self._accept([(0, ann, source)], settings, (audio, sample_rate))[0]

    def _rejected(self, exc: Rejected, source: str) -> None:
        self._reject(exc.id, exc.reason, source)

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
        self._status(ann_id, "rejected", error=reason)

    def _accept(self, checked: list[tuple[int, Announcement, str]], settings: AnnouncementSettings,
                audio: tuple[Samples, int] | None = None) -> list[bool]:
        """Journal and queue checked announcements (with `audio`: the one announcement it is);
        per announcement, whether its trigger may acknowledge it."""
        results = [True] * len(checked)
        fresh: list[int] = []
        """Positions in `checked` to journal, in order."""
        again: list[int] = []
        """Positions whose id comes earlier in the batch: a duplicate once that one is stored."""
        with self._accept_lock:
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
                    self._drop_audio(checked[k][1])
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
        self._status(ann.id, seen.state, duplicate=True, **seen.extra)
        return True

    def _queue(self, ann: Announcement, source: str) -> None:
        """An announcement now in the journal: queued (or expired already)."""
        self.metrics.inc("announcements_accepted")
        if ann.expired():
            self._finish(ann, "expired")
            return
        self.queue.put(ann)
        self.metrics.set("announcements_queued", len(self.queue))
        log.info("announcement queued (priority %d)", ann.priority, extra={"id": ann.id, "topic": source})
        self._status(ann.id, "queued", priority=ann.priority)

    # -- speaker thread ----------------------------------------------------------------

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
            self._finish(ann, "expired")
            return
        self.journal.start(ann.id)  # JournalError: not spoken now, see _run

        def started(engine: str) -> None:
            latency = time.time() - ann.received_at
            if item.resume == 0:
                self.metrics.observe("announce_first_audio_s", latency)
            log.info("speaking (%s engine, %.3f s after arrival)", engine, latency,
                     extra={"id": ann.id, "engine": engine, "resume": item.resume})
            self._status(ann.id, "speaking", engine=engine)

        self._idle.clear()  # before reading the bundle: see the module's invariant
        self.busy.set()
        speaking = self._speaking

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
            error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.metrics.inc("announcements_failed")
            log.error("announcement failed: %s", error, extra={"id": ann.id})
            self.journal.finish(ann.id, "failed", error=error)
            self._drop_audio(ann)
            self._status(ann.id, "failed", error=error)
            return
        finally:
            self.current = None
            self.last_spoke = time.monotonic()
            self.busy.clear()
            self._idle.set()
        if result.complete:
            self.metrics.inc("announcements_spoken")
            log.info("announcement spoken (%.2f s of audio)", result.audio_s,
                     extra={"id": ann.id, "engine": result.engine, "event": "spoken"})
            cut: dict[str, Any] = {}
            if result.truncated:
                self.metrics.inc("announcements_truncated")
                cut = {"truncated": True, "error": f"cut after {speaking.settings.max_audio_s:g} s of audio "
                       "(announcements.max_audio_s)"}
                log.warning("announcement truncated: %s", cut["error"], extra={"id": ann.id})
            outcome = _played(result, cut)
            if not outcome["played"]:
                self.metrics.inc("announcements_discarded")
                log.info("announcement not played: %s", result.discarded, extra={"id": ann.id})
            self.journal.finish(ann.id, "done", engine=result.engine, **outcome)
            self._drop_audio(ann)
            self._status(ann.id, "done", engine=result.engine, **outcome, **_turn(ann))
            return
        self._requeue(item, result)

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
        self._status(ann.id, "queued", priority=ann.priority, resume=result.resume)

    # -- helpers -------------------------------------------------------------------------

    def _finish(self, ann: Announcement, state: str) -> None:
        self.metrics.inc(f"announcements_{state}")
        log.info("announcement %s", state, extra={"id": ann.id})
        self.journal.finish(ann.id, state)
        self._drop_audio(ann)
        self._status(ann.id, state)

    def _drop_audio(self, ann: Announcement) -> None:
        """An audio announcement's file, once nothing will play it (final, or never journaled)."""
        if ann.audio is not None:
            self.audio_files.remove(ann.audio)

    def _status(self, ann_id: str | None, state: str, **extra: Any) -> None:
        doc = status(ann_id, state, **extra)
        for observer in self._observers:
            try:
                observer(doc)
            except Exception:
                log.exception("an announcement status observer failed", extra={"id": ann_id})


def _id_of(request: bytes | Mapping[str, Any]) -> str | None:
    """The id of a request the checks could not finish, if it has a usable one."""
    try:
        doc = loads(request) if isinstance(request, bytes) else request
    except (ValueError, RecursionError):
        return None
    ann_id = doc.get("id") if isinstance(doc, Mapping) else None
    return ann_id if isinstance(ann_id, str) and ID_PATTERN.fullmatch(ann_id) else None


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
