"""A user's audio command (`arecord`, `parecord`, `pw-record`; `aplay`, `paplay`, `pw-play`) as a process.

The command line is split like a shell would (`shlex`) but no shell runs it: a user who
wants pipes or redirections writes `sh -c '...'` and says so. The process gets its own
session, so stopping it stops what it started too (`sh -c` children hold the pipe open
otherwise). Its stderr is drained on a thread (a full stderr pipe would stall it) and
logged at debug; the last lines are kept for the error that says why it stopped.

It starts with no signal blocked (`arecord` must die of SIGPIPE when its reader goes), and
every command still running when the agent exits is stopped (`stop_all`, also at exit): a
command in its own session would otherwise outlive the agent.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import IO

from edge_agent.errors import AudioError

log = logging.getLogger(__name__)

STOP_WAIT_S = 2.0
"""How long a stopped command has to exit after SIGTERM before it is killed."""
STDERR_LINES = 5
"""Lines of stderr kept to explain an exit."""
STDERR_LINE_CHARS = 300


_running: set[AudioProcess] = set()
"""Every command started and not yet stopped, for `stop_all`."""
_running_lock = threading.Lock()


@contextlib.contextmanager
def default_signal_mask() -> Iterator[None]:
    """No signal blocked in the calling thread while a child starts, which inherits the mask.

    `subprocess`'s `restore_signals` resets dispositions, not the mask, and libraries block
    signals in whatever thread calls them (PortAudio blocks SIGPIPE in the thread that imports
    `sounddevice`; threads started from that thread inherit it). Setting the mask around
    `Popen` in the parent holds wherever it came from and needs no `preexec_fn` (unsafe
    with threads). Unblocking for a moment is harmless here: Python ignores SIGPIPE, and any
    other pending signal only sets the flag its Python handler runs from.
    """
    blocked = signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class CommandNotStarted(AudioError):
    """The command could not be run at all (no such program, not executable)."""


def split_command(command: str, name: str) -> list[str]:
    """`command` as an argument list; `AudioError` naming the setting when it cannot be one."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise AudioError(f"{name}: cannot split {command!r} ({exc})") from None
    if not argv:
        raise AudioError(f"{name}: the command is empty")
    return argv


class AudioProcess:
    """One run of an audio command, reading from it (`reads`) or writing to it."""

    def __init__(self, argv: list[str], name: str, *, reads: bool) -> None:
        self.argv = argv
        self.name = name
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._stopped = False
        self._stop_lock = threading.Lock()
        try:
            with default_signal_mask():
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL if reads else subprocess.PIPE,
                    stdout=subprocess.PIPE if reads else subprocess.DEVNULL, stderr=subprocess.PIPE,
                    start_new_session=True, bufsize=0)
        except OSError as exc:  # not found, not executable
            raise CommandNotStarted(f"{name}: cannot start {argv[0]!r} ({exc.strerror or exc})") from None
        with _running_lock:
            _running.add(self)
        log.info("%s started (pid %d): %s", name, self.proc.pid, shlex.join(argv))
        assert self.proc.stderr is not None
        self._drain = threading.Thread(target=self._drain_stderr, args=(self.proc.stderr,),
                                       name="audio-command-stderr", daemon=True)
        self._drain.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout_fd(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()

    @property
    def stdin(self) -> IO[bytes]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    def _drain_stderr(self, stderr: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):  # closed under us by `stop`
            for raw in iter(lambda: stderr.readline(4096), b""):
                line = raw.decode("utf-8", "replace").rstrip()[:STDERR_LINE_CHARS]
                if line:
                    self._stderr_tail.append(line)
                    log.debug("%s: %s", self.name, line, extra={"pid": self.proc.pid})

    def stderr_tail(self) -> str:
        """The last lines it wrote to stderr, joined (waits briefly for the drain to catch up)."""
        if self.proc.poll() is not None:
            self._drain.join(0.5)
        return " | ".join(self._stderr_tail)

    def wait(self, timeout: float) -> int | None:
        """Its exit code, or None if it is still running after `timeout` s."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def interrupt(self) -> None:
        """SIGTERM to it and everything it started, from any thread, without waiting (the thread
        that owns it reaps it with `stop`)."""
        if not self._stopped and self.proc.returncode is None:
            self._signal(signal.SIGTERM)

    def stop(self) -> int:
        """Stop it and everything it started (SIGTERM, then SIGKILL); its exit code. Any thread
        may call it, more than once: the first call stops it, later ones wait for that."""
        with self._stop_lock:
            if not self._stopped:  # once: its group id may name someone else's processes later
                self._stop()
                self._stopped = True
                with _running_lock:
                    _running.discard(self)
            return self.proc.returncode

    def _stop(self) -> None:
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            if self.wait(STOP_WAIT_S) is None:
                log.warning("%s did not exit %.0f s after SIGTERM: killing it", self.name, STOP_WAIT_S)
                self._signal(signal.SIGKILL)
                self.proc.wait()
        # The leader is gone; what it started may not be (a child that ignores SIGTERM, or one
        # of a leader that had exited by itself): nothing of the group outlives it.
        self._signal(signal.SIGKILL)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._drain.join(0.5)

    def describe_exit(self, code: int) -> str:
        """"exited with code 1: <stderr>" (or "killed by SIGTERM")."""
        if code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        tail = self.stderr_tail()
        return f"{self.name} {how}" + (f": {tail}" if tail else "")

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def stop_all() -> None:
    """Stop every audio command still running: the agent's shutdown (and its exit, whatever
    ended it), so that no player or recorder in its own session is left behind."""
    with _running_lock:
        running = list(_running)
    for proc in running:
        log.info("%s stopped at shutdown (pid %d)", proc.name, proc.pid)
        proc.stop()


atexit.register(stop_all)
