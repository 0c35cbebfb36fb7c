"""Prepared model files in use: a process holds a shared lock on each prepared directory it loads
from, for as long as it may still read there, and a directory is only removed by whoever gets the
lock exclusively, so no process removes files another is using.

Readers may come back long after loading: a voice makes its pooled front session on first need,
from the same files. The lock is an `flock` on `<directory>/.in-use` (written with the directory,
before it is renamed into place); the kernel drops it when the process ends, so a crash leaves
nothing stale. A remover holds the exclusive lock only while it renames the directory out of the
way, so a reader waits at most that long, and a reader that got its lock checks the directory is
still the one it opened (it may have been removed and made again meanwhile).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
from pathlib import Path

LOCK_NAME = ".in-use"


class Held(OSError):
    """A prepared directory needs replacing, but another process is using it."""


class InUse:
    """A shared lock on one prepared directory, held until `release` (or the process ends)."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def mark(directory: Path) -> None:
    """Give a directory being prepared (not yet in place) its lock file."""
    (directory / LOCK_NAME).touch()


def hold(directory: Path) -> InUse | None:
    """Hold `directory` for reading; None if it is not there (never made, or removed meanwhile)."""
    lock = directory / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a remover renames the directory away
        if not _same_file(fd, lock):
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    return InUse(directory, fd)


def remove_unheld(directory: Path) -> bool:
    """Remove `directory` unless a process holds it; True if it is gone (or was never there)."""
    lock = directory / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        if not directory.exists():
            return True
        fd = None  # made before locks (or half removed): nobody can hold it
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            if not _same_file(fd, lock):
                return True  # someone else removed it first (what is there now is not ours to judge)
        # Out of the way while the lock is ours: a reader arriving now finds nothing, not a
        # directory emptying under it.
        doomed = directory.with_name(f".removing-{directory.name}-{secrets.token_hex(4)}")
        os.replace(directory, doomed)
    finally:
        if fd is not None:
            os.close(fd)
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
