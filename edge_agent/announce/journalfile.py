"""The journal's file format: its records, the state they replay to, and the compacted file.

One JSON object a line, each with its `op` and a timestamp `ts`:

    {"op": "accept", "a": {...announcement...}, "ts": ...}   accepted, waiting
    {"op": "start", "id": ..., "ts": ...}                     speaking began
    {"op": "requeue", "id": ..., "resume": 2, "spent_s": 4.2, "ts": ...}
                                                              stopped at a sentence boundary
                                                              after spent_s of audio
    {"op": "finish", "id": ..., "state": "done", ...}         done / expired / failed
    {"op": "seen", "id": ..., "state": ..., "ts": ...}        a finished id (after compaction)

Replaying the lines in order gives one `Entry` per id, oldest first (finishing moves an id to the
end, so the ids to forget first lead). A compacted file holds the same state in as few lines:
pending announcements with their resume points, and finished ids. Pure functions over the
entries: the journal (`journal.Journal`) owns the file, the lock and the writes.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.announce.message import FINAL_STATES, Announcement
from edge_agent.announce.settings import AnnouncementSettings

# A child of the journal's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.announce.journal.file")


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
    spent_s: float = 0.0
    """Audio already played, counted against `announcements.max_audio_s`."""
    extra: dict[str, Any] = field(default_factory=dict)
    """engine / error of a finished one."""


Entries = OrderedDict[str, Entry]
"""Id -> entry, in the order the journal's ids are forgotten (oldest first)."""


def encode(records: list[dict[str, Any]]) -> bytes:
    """`records` as the file's lines."""
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)


def replay(path: Path, entries: Entries) -> None:
    """Fill `entries` from the file at `path` (none there: empty). A line a crash tore is cut off
    the file and dropped; any other line that cannot be read is skipped, with a warning."""
    entries.clear()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        # A record torn by a crash: cut it off (that needs no free space), so nothing
        # appended later can land on the same line even if compaction cannot run.
        os.truncate(path, data.rfind(b"\n") + 1)
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            apply(entries, json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            torn = number >= len(lines) - 1
            log.warning("journal %s line %d %s: %s", path, number,
                        "torn by a crash, dropped" if torn else "unreadable, skipped", exc)


def apply(entries: Entries, rec: dict[str, Any]) -> None:
    """One record's change to `entries`; `ValueError`, `KeyError` or `TypeError` if it is not one."""
    op = rec["op"]
    ts = float(rec["ts"])
    if op == "accept":
        ann = Announcement.from_json(rec["a"])
        entries[ann.id] = Entry("queued", ts, ann)
    elif op == "seen":
        entries[rec["id"]] = Entry(rec["state"], ts, None, extra=rec.get("extra", {}))
    else:
        entry = entries[rec["id"]]
        entry.ts = ts
        if op == "start":
            entry.state = "speaking"
        elif op == "requeue":
            entry.state, entry.resume = "queued", int(rec["resume"])
            entry.spent_s = float(rec.get("spent_s", 0.0))  # absent in older journals
        elif op == "finish":
            entry.state, entry.announcement = rec["state"], None
            entry.extra = {k: rec[k] for k in ("engine", "error", "truncated", "played") if k in rec}
            entries.move_to_end(rec["id"])
        else:
            raise ValueError(f"unknown op {op!r}")


def compacted(entries: Entries) -> bytes:
    """The shortest file that replays to `entries`."""
    lines = []
    for ann_id, e in entries.items():
        if e.state in FINAL_STATES or e.announcement is None:
            rec: dict[str, Any] = {"op": "seen", "id": ann_id, "state": e.state, "ts": e.ts}
            if e.extra:
                rec["extra"] = e.extra
            lines.append(rec)
        else:
            ann = e.announcement
            lines.append({"op": "accept", "a": ann.to_json(), "ts": ann.received_at})
            if e.resume or e.spent_s:
                lines.append({"op": "requeue", "id": ann_id, "resume": e.resume,
                              "spent_s": round(e.spent_s, 3), "ts": e.ts})
    return encode(lines)


def forget_old(entries: Entries, settings: AnnouncementSettings, now: float) -> None:
    """Drop finished ids beyond `dedupe_max_ids` and older than `dedupe_max_age_days`, oldest first."""
    limit_ts = now - settings.dedupe_max_age_days * 86400
    finished = [k for k, e in entries.items() if e.state in FINAL_STATES]
    excess = len(entries) - settings.dedupe_max_ids
    for ann_id in finished:  # oldest first: finishing moves an id to the end
        entry = entries[ann_id]
        if excess > 0 or entry.ts < limit_ts:
            del entries[ann_id]
            excess -= 1
