"""A private mosquitto on a free loopback port, for tests and `edge-agent bench mqtt`.

Persistence is on and saved after every change (`autosave_interval 1` with
`autosave_on_changes true`). Mosquitto's default saves every 1800 s and at a
clean shutdown only, so a SIGKILLed broker would forget every queued message
and session; with this setting what it loses is at most the last change before
the kill (it acknowledges a PUBLISH before the save that follows it). Producers
that must not lose an announcement republish its id until they see a status:
the device's dedupe makes that safe.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from edge_agent.errors import UsageError

CANDIDATES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


def find_mosquitto() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    return next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalBroker:
    """mosquitto in `workdir`, with its config, persistence file and log there."""

    def __init__(self, workdir: Path, *, persistence: bool = True, extra: str = "",
                 listener_options: str = "", allow_anonymous: bool = True,
                 executable: str | None = None) -> None:
        """`listener_options` follow the listener line (TLS files); `extra` ends the file."""
        exe = executable or find_mosquitto()
        if exe is None:
            raise UsageError("mosquitto is not installed (apt install mosquitto)")
        self.executable = exe
        self.workdir = workdir
        self.persistence = persistence
        self.extra = extra
        self.listener_options = listener_options
        self.allow_anonymous = allow_anonymous
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "mosquitto.log"

    @property
    def db_path(self) -> Path:
        return self.workdir / "mosquitto.db"

    def _config(self) -> Path:
        lines = [
            f"listener {self.port} 127.0.0.1",
            *([self.listener_options] if self.listener_options else []),
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}",
            f"log_dest file {self.log_path}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
            "max_queued_messages 10000",
        ]
        if self.persistence:
            lines += [
                "persistence true",
                f"persistence_location {self.workdir}/",
                "persistence_file mosquitto.db",
                "autosave_interval 1",
                "autosave_on_changes true",
            ]
        if os.geteuid() == 0:
            lines.append(f"user {getpass.getuser()}")  # otherwise it drops to `mosquitto`
        if self.extra:
            lines.append(self.extra)
        path = self.workdir / "mosquitto.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout: float = 20.0) -> LocalBroker:
        """Start on the previous port (a restart) or a new free one; wait until it accepts."""
        reuse = self.port != 0
        for _ in range(1 if reuse else 5):
            if not reuse:
                self.port = free_port()
            conf = self._config()
            self.proc = subprocess.Popen([self.executable, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
            if self._wait_ready(timeout):
                return self
            self._reap()
        raise RuntimeError(f"mosquitto did not start; see {self.log_path}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def wait_saved(self, since_ns: int, timeout: float = 30.0) -> bool:
        """Wait until the database on disk was written after `since_ns` (`time.time_ns()`):
        what happened before that survives a SIGKILL."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.db_path.stat().st_mtime_ns > since_ns:
                    return True
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        return False

    def save(self, timeout: float = 30.0) -> None:
        """Make mosquitto write its database now (SIGUSR1) and wait until it has."""
        if self.proc is None:
            raise RuntimeError("broker is not running")
        since = time.time_ns()
        self.proc.send_signal(signal.SIGUSR1)
        if not self.wait_saved(since, timeout):
            raise RuntimeError(f"mosquitto did not save within {timeout:g} s")

    def kill(self) -> None:
        """SIGKILL: no final save, exactly like a power cut of the broker."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        """SIGTERM: mosquitto saves its database and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self._reap()

    def restart(self) -> LocalBroker:
        self.kill()
        return self.start()

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()
