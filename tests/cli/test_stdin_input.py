"""`listen --input -` and `transcribe -` take raw PCM on standard input: what they take it for is
said, and a terminal or a WAV file there is refused before any model loads."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_agent.audio.wav import WavWriter
from tests.conftest import run_cli

VERBS = [["listen", "--input", "-"], ["transcribe", "-"]]


def run_with_stdin(args: list[str], stdin: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent", *args], stdin=stdin, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.parametrize("verb", VERBS)
def test_a_wav_file_on_stdin_is_refused_naming_the_fix(tmp_path: Path, verb: list[str]) -> None:
    wav = tmp_path / "command.wav"
    writer = WavWriter(wav, 16000)
    writer.write(np.zeros(1600, dtype=np.float32))
    writer.close()
    with wav.open("rb") as fh:
        result = run_with_stdin(verb, fh.fileno())
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "standard input holds a WAV file" in lines[0] and "16000 Hz" in lines[0]
    assert "give the file's path instead of '-'" in lines[0]


@pytest.mark.parametrize("verb", VERBS)
def test_a_terminal_on_stdin_is_refused_saying_what_to_pipe(verb: list[str]) -> None:
    controller, terminal = pty.openpty()
    try:
        result = run_with_stdin([*verb, "--rate", "22050"], terminal)
    finally:
        os.close(terminal)
        os.close(controller)
    assert result.returncode == 2
    assert "raw 16-bit little-endian PCM at 22050 Hz, 1 channel(s)" in result.stderr
    assert "which is a terminal: pipe audio in" in result.stderr


@pytest.mark.parametrize("verb", ["listen", "transcribe"])
def test_help_states_the_rate_raw_pcm_is_taken_at(verb: str) -> None:
    result = run_cli(verb, "--help")
    assert result.returncode == 0
    assert "default 16000" in " ".join(result.stdout.split())
