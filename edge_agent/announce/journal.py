"""The announcement journal: accepted announcements and every id already seen, on disk.

One append-only file of JSON lines, fsynced per record:

    {"op": "accept", "a": {...announcement...}, "ts": ...}   accepted, waiting
    {"op": "start", "id": ..., "ts": ...}                     speaking began
    {"op": "requeue", "id": ..., "resume": 2, "ts": ...}      stopped at a sentence boundary
    {"op": "finish", "id": ..., "state": "done", ...}         done / expired / failed
    {"op": "seen", "id": ..., "state": ..., "ts": ...}        a finished id (after compaction)

An announcement is accepted (and its trigger's message, e.g. MQTT, acknowledged) only once its
`accept` record is on disk, so a crash loses nothing that was acknowledged.
Ids are spoken at most once: one that was speaking when the process died is
reported `failed` at the next start rather than spoken again. At start the file
is compacted (pending announcements plus finished ids, oldest ids forgotten
beyond the configured count and age) and rewritten atomically; a torn last
line from a crash is dropped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.announce.message import FINAL_STATES, Announcement
from edge_agent.atomic import atomic_write, remove_stale_temps
from edge_agent.config import AnnouncementSettings

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted by a restart while speaking (ids are spoken at most once)"


@dataclass
class Entry:
    """What the journal knows about one id."""

    state: str
    """queued, speaking, done, expired or failed."""
    ts: float
    announcement: Announcement | None = None
    """Kept while the announcement is not finished."""
    resume: int = 0
    """First sentence still to speak."""
    extra: dict[str, Any] = field(default_factory=dict)
    """engine / error of a finished one."""


@dataclass(frozen=True)
class Recovered:
    """What `Journal.open` found."""

    pending: list[tuple[Announcement, int]]
    """Accepted, not yet spoken: (announcement, sentence to resume from)."""
    interrupted: list[str]
    """Ids that were speaking when the process died; now recorded as failed."""


class Journal:
    """Durable dedupe set plus pending announcements; thread-safe."""

    def __init__(self, directory: Path, settings: AnnouncementSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.path = directory / "journal.jsonl"
        self.settings = settings
        self._clock = clock
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._appended = 0

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> Recovered:
        """Read the journal, settle interrupted announcements, compact, and start appending."""
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(self.directory)
            self._replay()
            interrupted = []
            now = self._clock()
            for ann_id, entry in self._entries.items():
                if entry.state == "speaking":
                    entry.state, entry.ts, entry.announcement = "failed", now, None
                    entry.extra = {"error": INTERRUPTED}
                    interrupted.append(ann_id)
            self._compact()
            pending = [(e.announcement, e.resume) for e in self._entries.values()
                       if e.state == "queued" and e.announcement is not None]
            return Recovered(pending, interrupted)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -- queries -------------------------------------------------------------------------

    def get(self, ann_id: str) -> Entry | None:
        with self._lock:
            return self._entries.get(ann_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # -- records -------------------------------------------------------------------------

    def accept(self, ann: Announcement) -> bool:
        """Record `ann` durably; False (and nothing written) if its id was seen before."""
        with self._lock:
            if ann.id in self._entries:
                return False
            self._append({"op": "accept", "a": ann.to_json(), "ts": ann.received_at})
            self._entries[ann.id] = Entry("queued", ann.received_at, ann)
            return True

    def start(self, ann_id: str) -> None:
        self._update(ann_id, {"op": "start", "id": ann_id}, "speaking")

    def requeue(self, ann_id: str, resume: int) -> None:
        """Speaking stopped cleanly before sentence `resume`; it waits again from there."""
        self._update(ann_id, {"op": "requeue", "id": ann_id, "resume": resume}, "queued", resume=resume)

    def finish(self, ann_id: str, state: str, **extra: Any) -> None:
        if state not in FINAL_STATES:
            raise ValueError(f"{state!r} is not a final state")
        info = {k: v for k, v in extra.items() if v is not None}
        self._update(ann_id, {"op": "finish", "id": ann_id, "state": state, **info}, state, extra=info)

    def _update(self, ann_id: str, record: dict[str, Any], state: str, *, resume: int | None = None,
                extra: dict[str, Any] | None = None) -> None:
        with self._lock:
            entry = self._entries.get(ann_id)
            if entry is None:
                raise KeyError(ann_id)
            now = self._clock()
            self._append({**record, "ts": now})
            entry.state, entry.ts = state, now
            if resume is not None:
                entry.resume = resume
            if state in FINAL_STATES:
                entry.announcement = None
                entry.extra = extra or {}
                self._entries.move_to_end(ann_id)
            if self._appended > len(self._entries) + 1000:
                self._compact()

    # -- file ----------------------------------------------------------------------------

    def _append(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            raise RuntimeError("journal is not open")
        os.write(self._fd, json.dumps(record, separators=(",", ":")).encode() + b"\n")
        os.fsync(self._fd)
        self._appended += 1

    def _replay(self) -> None:
        self._entries.clear()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        lines = data.split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                self._apply(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                torn = number >= len(lines) - 1
                log.warning("journal %s line %d %s: %s", self.path, number,
                            "torn by a crash, dropped" if torn else "unreadable, skipped", exc)

    def _apply(self, rec: dict[str, Any]) -> None:
        op = rec["op"]
        ts = float(rec["ts"])
        if op == "accept":
            ann = Announcement.from_json(rec["a"])
            self._entries[ann.id] = Entry("queued", ts, ann)
        elif op == "seen":
            self._entries[rec["id"]] = Entry(rec["state"], ts, None, 0, rec.get("extra", {}))
        else:
            entry = self._entries[rec["id"]]
            entry.ts = ts
            if op == "start":
                entry.state = "speaking"
            elif op == "requeue":
                entry.state, entry.resume = "queued", int(rec["resume"])
            elif op == "finish":
                entry.state, entry.announcement = rec["state"], None
                entry.extra = {k: rec[k] for k in ("engine", "error") if k in rec}
                self._entries.move_to_end(rec["id"])
            else:
                raise ValueError(f"unknown op {op!r}")

    def _compact(self) -> None:
        self._forget_old()
        lines = []
        for ann_id, e in self._entries.items():
            if e.state in FINAL_STATES or e.announcement is None:
                rec: dict[str, Any] = {"op": "seen", "id": ann_id, "state": e.state, "ts": e.ts}
                if e.extra:
                    rec["extra"] = e.extra
                lines.append(rec)
            else:
                ann = e.announcement
                lines.append({"op": "accept", "a": ann.to_json(), "ts": ann.received_at})
                if e.resume:
                    lines.append({"op": "requeue", "id": ann_id, "resume": e.resume, "ts": e.ts})
        body = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in lines)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        atomic_write(self.path, body)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._appended = 0

    def _forget_old(self) -> None:
        limit_ts = self._clock() - self.settings.dedupe_max_age_days * 86400
        finished = [k for k, e in self._entries.items() if e.state in FINAL_STATES]
        excess = len(self._entries) - self.settings.dedupe_max_ids
        for ann_id in finished:  # oldest first: finishing moves an id to the end
            entry = self._entries[ann_id]
            if excess > 0 or entry.ts < limit_ts:
                del self._entries[ann_id]
                excess -= 1
