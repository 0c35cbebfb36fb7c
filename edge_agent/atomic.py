"""Durable file replacement: temp file, fsync, rename, fsync the directory.

After a crash at any point a reader sees either the old file or the new one,
complete, never a mix (a leftover temp file is ignored and removed later).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edge_agent.faults import crash_point


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, step: str = "") -> None:
    """Replace `path` with `data` durably; `step` names the crash points for fault tests."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if step:
            crash_point(f"{step}:temp-written")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if step:
        crash_point(f"{step}:renamed")
    fsync_dir(path.parent)


def remove_stale_temps(directory: Path) -> int:
    """Delete temp files a crash left behind in `directory`; returns how many."""
    count = 0
    for tmp in directory.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
        count += 1
    return count
