"""Durable files: replacement (temp file, fsync, rename, fsync the directory) and appending.

After a crash at any point a reader sees either the old file or the new one,
complete, never a mix (a leftover temp file is ignored and removed later).
An `AppendFile` holds only whole records: a write that fails part-way (a full
disk, a short write) is cut off again before the error reaches the caller.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
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


class AppendFile:
    """An append-only file of whole, fsynced records.

    `append` returns only once every byte of the record is written and fsynced; on
    any failure (ENOSPC, EIO, a write that keeps coming back short) the file is
    truncated back to its last whole record and the `OSError` is raised, so the
    next record never lands on a torn one. `write` and `fsync` are the system calls
    (tests pass failing ones to reach the error paths without filling a disk).
    """

    def __init__(self, path: Path, *, write: Callable[[int, memoryview], int] = os.write,
                 fsync: Callable[[int], None] = os.fsync) -> None:
        self.path = path
        self._write = write
        self._fsync = fsync
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.size = os.fstat(self._fd).st_size
        """Bytes of whole records; anything past it is a failed append being cut off."""
        self._torn = False

    def append(self, record: bytes) -> None:
        """Write `record` wholly and durably, or raise `OSError` leaving the file as it was."""
        if self._torn:
            self._cut()  # a previous failure could not cut its bytes off: try again first
        view = memoryview(record)
        try:
            while view:
                written = self._write(self._fd, view)
                if written <= 0:
                    raise OSError(28, "no progress writing (disk full?)")
                view = view[written:]
            self._fsync(self._fd)
        except OSError:
            self._torn = True
            with contextlib.suppress(OSError):  # still torn: the next append cuts first
                self._cut()
            raise
        self.size += len(record)

    def _cut(self) -> None:
        # Shrinking a file needs no free space, so this works on a full disk.
        os.ftruncate(self._fd, self.size)
        self._fsync(self._fd)
        self._torn = False

    def close(self) -> None:
        os.close(self._fd)
