"""Shared fixtures: an isolated model cache and config per test, the real voice once per session."""

from __future__ import annotations

import os
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
    yield


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
