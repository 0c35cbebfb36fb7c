"""The announcement journal: accepted announcements and every id already seen, on disk.

One append-only file of JSON lines (`journalfile`: the records and what they replay to),
fsynced per write. Writes are shared (`groupcommit`): the `accept` records of a batch read in
one go (`accept_many`) go in one write, and records that threads make while a write is in its
fsync (the speaker's `start` and `finish`, a trigger's accepts) wait for it and go together in
the next one, one fsync for all; each caller returns only once its records are on disk.

An announcement is accepted (and its trigger's message, e.g. MQTT, acknowledged) only once its
`accept` record is wholly on disk, so a crash loses nothing that was acknowledged. A batch is
written and fsynced whole before any of it is accepted; a crash part way through it leaves
complete records of messages not yet acknowledged, which the broker delivers again and the
journal then answers as duplicates (spoken once, from the journal).
Ids are spoken at most once: speaking starts only once its `start` record is on
disk, and one that was speaking when the process died is reported `failed` at
the next start rather than spoken again. At start the file is compacted
(pending announcements plus finished ids, oldest ids forgotten beyond the
configured count and age) and rewritten atomically; a torn last line from a
crash is dropped.

When the disk is full (or failing), `accept` and `start` raise `JournalError`
and change nothing, so the trigger does not acknowledge and the speaker waits.
`requeue` and `finish` record what already happened: the in-memory state moves
on, and the file catches up by a compaction as soon as a write succeeds again.
A compaction writes the new file before it replaces the old one, so a failed one
leaves the journal as it was and still usable. `error` says what is wrong, and
`on_error` hears each change of it (None once writing works again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.announce.groupcommit import GroupCommit
from edge_agent.announce.journalfile import Entries, Entry, compacted, encode, forget_old, replay
from edge_agent.announce.message import FINAL_STATES, Announcement
from edge_agent.announce.settings import AnnouncementSettings
from edge_agent.atomic import AppendFile, atomic_write, remove_stale_temps
from edge_agent.faults import crash_point
from edge_agent.logs import Throttle

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted by a restart while speaking (ids are spoken at most once)"

COMPACT_RETRY_S = 5.0
"""After a failed compaction, the next one is not tried sooner than this."""

ErrorObserver = Callable[[str | None], None]


class JournalError(OSError):
    """The journal could not record something; nothing was changed."""


@dataclass(frozen=True)
class Recovered:
    """What `Journal.open` found."""

    pending: list[tuple[Announcement, int]]
    """Accepted, not yet spoken: (announcement, sentence to resume from)."""
    interrupted: list[str]
    """Ids that were speaking when the process died; now recorded as failed."""
    spent: dict[str, float] = field(default_factory=dict)
    """Id -> seconds of audio a pending announcement has already played (its budget's use)."""


class Journal:
    """Durable dedupe set plus pending announcements; thread-safe."""

    def __init__(self, directory: Path, settings: AnnouncementSettings,
                 clock: Callable[[], float] = time.time, *, on_error: ErrorObserver | None = None,
                 open_file: Callable[[Path], AppendFile] = AppendFile) -> None:
        self.directory = directory
        self.path = directory / "journal.jsonl"
        self.settings = settings
        self._clock = clock
        self._on_error = on_error
        self._open_file = open_file
        self._entries: Entries = OrderedDict()
        self._lock = threading.Lock()
        self._group = GroupCommit(self._lock, self._append, self._written)
        self._accepting = threading.Lock()
        """One `accept_many` at a time: an id is checked against what is on disk, then written."""
        self._file: AppendFile | None = None
        self._appended = 0
        self._behind = False
        """Some state change is in memory only (its record failed): the next compaction writes it."""
        self._compact_after = 0.0
        self._throttle = Throttle(10.0)
        self.error: str | None = None
        """Why the journal cannot be written now; None when it can."""
        self.write_errors = 0

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> Recovered:
        """Read the journal, settle interrupted announcements, compact, and start appending."""
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(self.directory)
            replay(self.path, self._entries)
            interrupted = []
            now = self._clock()
            for ann_id, entry in self._entries.items():
                if entry.state == "speaking":
                    entry.state, entry.ts, entry.announcement = "failed", now, None
                    entry.extra = {"error": INTERRUPTED}
                    interrupted.append(ann_id)
            self._behind = True
            if not self._compact():
                # A full disk at start: keep appending to the file as it is (its torn
                # tail cut off); the failed ids stay failed in memory until a compaction.
                self._file = self._open_file(self.path)
            queued = [e for e in self._entries.values() if e.state == "queued" and e.announcement is not None]
            pending = [(e.announcement, e.resume) for e in queued if e.announcement is not None]
            spent = {e.announcement.id: e.spent_s for e in queued if e.announcement is not None and e.spent_s}
            return Recovered(pending, interrupted, spent)

    def close(self) -> None:
        with self._lock:
            self._group.wait_idle()
            if self._file is not None:
                self._file.close()
                self._file = None

    # -- queries -------------------------------------------------------------------------

    def get(self, ann_id: str) -> Entry | None:
        with self._lock:
            return self._entries.get(ann_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # -- records -------------------------------------------------------------------------

    def accept(self, ann: Announcement) -> bool:
        """Record `ann` durably; False (and nothing written) if its id was seen before.

        Raises `JournalError` (nothing recorded) when the record cannot be written.
        """
        return self.accept_many([ann])[0]

    def accept_many(self, anns: list[Announcement]) -> list[bool]:
        """Record each of `anns` durably with one write and one fsync (group commit); per
        announcement, False if its id was seen before (or earlier in `anns`).

        Raises `JournalError` (nothing recorded, none accepted) when the write fails.
        """
        with self._accepting, self._lock:
            fresh: dict[str, Announcement] = {}
            for ann in anns:
                if ann.id not in self._entries:
                    fresh.setdefault(ann.id, ann)

            def apply(written: bool) -> None:
                if written:
                    for ann in fresh.values():
                        self._entries[ann.id] = Entry("queued", ann.received_at, ann)

            if fresh:
                self._commit([{"op": "accept", "a": a.to_json(), "ts": a.received_at}
                              for a in fresh.values()], apply)
                crash_point("journal:accepted")  # on disk, none of them acknowledged yet
            self._compact_if_due()
            return [fresh.get(ann.id) is ann for ann in anns]

    def start(self, ann_id: str) -> None:
        """Speaking begins; raises `JournalError` (nothing changed) if that cannot be recorded."""
        self._update(ann_id, {"op": "start", "id": ann_id}, "speaking", must_persist=True)

    def requeue(self, ann_id: str, resume: int, spent_s: float = 0.0) -> None:
        """Speaking stopped cleanly before sentence `resume`, `spent_s` seconds of audio in all;
        it waits again from there (a restart keeps both: the audio budget is not renewed)."""
        record = {"op": "requeue", "id": ann_id, "resume": resume, "spent_s": round(spent_s, 3)}
        self._update(ann_id, record, "queued", resume=resume, spent_s=spent_s)

    def finish(self, ann_id: str, state: str, **extra: Any) -> None:
        if state not in FINAL_STATES:
            raise ValueError(f"{state!r} is not a final state")
        info = {k: v for k, v in extra.items() if v is not None}
        self._update(ann_id, {"op": "finish", "id": ann_id, "state": state, **info}, state, extra=info)

    def retry(self) -> bool:
        """Try to bring the file up to date now (after a write error); True if it is."""
        with self._lock:
            self._group.wait_idle()
            if self._behind:
                self._compact_after = 0.0
                self._compact()
            return self.error is None

    def _update(self, ann_id: str, record: dict[str, Any], state: str, *, resume: int | None = None,
                spent_s: float | None = None, extra: dict[str, Any] | None = None,
                must_persist: bool = False) -> None:
        with self._lock:
            entry = self._entries.get(ann_id)
            if entry is None:
                raise KeyError(ann_id)
            now = self._clock()

            def apply(written: bool) -> None:
                if not written:
                    if must_persist:
                        return  # nothing changes; the caller raises
                    self._behind = True  # what happened is kept in memory; a compaction writes it
                entry.state, entry.ts = state, now
                if resume is not None:
                    entry.resume = resume
                if spent_s is not None:
                    entry.spent_s = spent_s
                if state in FINAL_STATES:
                    entry.announcement = None
                    entry.extra = extra or {}
                    self._entries.move_to_end(ann_id)

            try:
                self._commit([{**record, "ts": now}], apply)
            except JournalError:
                if must_persist:
                    raise
            self._compact_if_due()

    def _commit(self, records: list[dict[str, Any]], apply: Callable[[bool], None]) -> None:
        """Write `records` durably with whatever other threads write meanwhile (`groupcommit`);
        `apply(written)` runs under the lock once the write is done. Raises `JournalError` if it
        failed. Called with the lock."""
        # Encoded here: whatever that raises is this caller's alone.
        self._group.commit(encode(records), len(records), apply)

    # -- the group commit's state, as its tests watch it ----------------------------------------

    @property
    def _writing(self) -> bool:
        return self._group.writing

    @property
    def _waiting(self) -> list[Any]:
        return self._group.waiting

    # -- file ----------------------------------------------------------------------------

    def _append(self, data: bytes) -> None:
        """The group commit's write: no compaction swaps the file while it runs."""
        file = self._file
        if file is None:
            raise JournalError(5, "journal is not open")
        file.append(data)

    def _written(self, records: int, error: OSError | None) -> JournalError | None:
        """After a group commit's write: the error its callers raise (None: it held)."""
        if error is None:
            self._appended += records
            self._recovered()
            return None
        if isinstance(error, JournalError):
            return error
        self._failed(error)
        return JournalError(error.errno or 5, f"cannot write the journal: {error.strerror or error}")

    def _compact_if_due(self) -> None:
        """Compact when something is in memory only, or the file has grown; never during a write."""
        if (self._behind or self._appended > len(self._entries) + 1000) and not self._group.writing:
            self._compact()

    def _failed(self, exc: OSError) -> None:
        self.write_errors += 1
        message = f"cannot write {self.path}: {exc.strerror or exc}"
        if self._throttle.ready():
            skipped = self._throttle.take_suppressed()
            log.error("%s%s", message, f" ({skipped} more since the last line)" if skipped else "")
        if self.error != message:
            self.error = message
            self._tell(message)

    def _recovered(self) -> None:
        if self.error is None:
            return
        log.warning("journal writable again after %d failed writes", self.write_errors)
        self.error = None
        self._throttle.reset()
        self._compact_after = 0.0
        self._tell(None)

    def _tell(self, error: str | None) -> None:
        if self._on_error is not None:
            try:
                self._on_error(error)
            except Exception:
                log.exception("journal error observer failed")

    def _compact(self) -> bool:
        """Rewrite the file from memory: the new file first, then the swap. False if it failed
        (the old file stays open and usable; no new try for `COMPACT_RETRY_S`)."""
        if time.monotonic() < self._compact_after:
            return False
        forget_old(self._entries, self.settings, self._clock())
        try:
            atomic_write(self.path, compacted(self._entries))
            new = self._open_file(self.path)
        except OSError as exc:
            self._compact_after = time.monotonic() + COMPACT_RETRY_S
            self._failed(exc)
            return False
        if self._file is not None:
            self._file.close()
        self._file = new
        self._appended = 0
        self._behind = False
        self._recovered()
        return True
