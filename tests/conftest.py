"""Shared fixtures: an isolated model cache and config per test, the real voice once per session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """Model cache reused across tests (and runs): real weights are fetched once."""
    env = os.environ.get("EDGE_SPEECH_TEST_CACHE")
    path = Path(env) if env else Path.home() / ".cache" / "edge-speech-tests" / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_cache: Path) -> Iterator[None]:
    """No test reads the developer's config or writes into their home directory."""
    monkeypatch.delenv("EDGE_AGENT_CONFIG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("EDGE_SPEECH_CACHE", str(shared_cache.parent))
    _unblock_signals()
    yield


def _unblock_signals() -> None:
    """Each test starts with no signal blocked in the suite's thread.

    A library that loads PortAudio (`sounddevice`, which pyroomacoustics imports too) blocks
    SIGPIPE in the importing thread, and every child a later test starts would inherit that: a
    writer the test expects to die of SIGPIPE would get EPIPE instead. The runtime guards its own
    children (`audio.command.default_signal_mask`); this keeps the tests' children honest too.
    """
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)


def run_cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `edge-agent` in a subprocess, as a user would."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "edge_agent", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, env=full_env, check=False)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Any]:
    """A private mosquitto on a free port, persistence saved on every change; killed afterwards."""
    from edge_agent.mqtt.localbroker import LocalBroker, find_mosquitto

    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed")
    with LocalBroker(tmp_path / "broker") as running:
        yield running


@pytest.fixture
def everything(broker: Any) -> Iterator[Any]:
    """Every message on the broker, from the start of the test."""
    from tests.mqtt_support import Watcher

    w = Watcher(broker.url, topic="#")
    yield w
    w.close()


@pytest.fixture
def producer(broker: Any) -> Iterator[Any]:
    """A client that publishes to the broker."""
    from tests.mqtt_support import Producer

    p = Producer(broker.url)
    yield p
    p.close()


class SmallDisk:
    """A real 2 MiB tmpfs: `fill()` takes every free byte, `free()` gives it back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        """Write until the filesystem says ENOSPC (the last page too, so nothing fits)."""
        import errno

        with self.filler.open("ab", buffering=0) as fh:
            for size in (65536, 4096, 512, 64, 1):
                while True:
                    try:
                        fh.write(b"\0" * size)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 2 MiB tmpfs mounted for this test (needs root; skipped with the reason otherwise)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


class FlakyWrites:
    """The `write` system call of a disk that can be full or write short: for `AppendFile(write=...)`.

    The same error paths the tmpfs tests reach, on any machine (no root needed).
    """

    def __init__(self) -> None:
        self.full = False
        self.short = False
        """Each call writes at most half of what it is given (at least one byte)."""
        self.fail_after = -1
        """Bytes still accepted before ENOSPC (-1: no limit): a record torn part-way."""
        self.calls = 0

    def __call__(self, fd: int, data: Any) -> int:
        import errno

        self.calls += 1
        if self.full or self.fail_after == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        chunk = bytes(data)
        if self.short:
            chunk = chunk[: max(1, len(chunk) // 2)]
        if self.fail_after > 0:
            chunk = chunk[: self.fail_after]
            self.fail_after -= len(chunk)
        return os.write(fd, chunk)
