"""The peers' environment (`bench tts`, `bench wyoming`): found where it was built, else built there."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import peers


def _ctx(cache: Path) -> Any:
    return SimpleNamespace(settings=SimpleNamespace(models=SimpleNamespace(cache_dir=cache)))


def test_an_existing_environment_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("built again"))
    args = argparse.Namespace(peers_venv=tmp_path / "venv")
    assert peers.peers_python(_ctx(tmp_path / "models"), args) == python


def test_a_missing_environment_is_built_beside_the_model_cache_with_the_pinned_peers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **k: ran.append(argv))
    python = peers.peers_python(_ctx(tmp_path / "models"), argparse.Namespace(peers_venv=None))
    venv = tmp_path / "bench-peers" / "venv"
    assert python == venv / "bin" / "python"
    assert ran == [[sys.executable, "-m", "venv", str(venv)],
                   [str(python), "-m", "pip", "install", "-q", *peers.PEERS]]
