"""The audio `listen --input` and `transcribe FILE` name: one opener for both verbs."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sources import WavFileSource
from edge_agent.commands.inputs import add_raw_pcm_arguments, open_named
from edge_agent.errors import UsageError
from tests.speech_fixtures import write_wav


def test_raw_pcm_is_taken_for_16_khz_mono_unless_told():
    parser = argparse.ArgumentParser()
    add_raw_pcm_arguments(parser)
    assert vars(parser.parse_args([])) == {"rate": 16000, "channels": 1}
    assert vars(parser.parse_args(["--rate", "48000", "--channels", "2"])) == {"rate": 48000, "channels": 2}


def test_a_directory_is_refused_as_a_usage_error(tmp_path: Path):
    with pytest.raises(UsageError, match="is a directory"):
        open_named(str(tmp_path), 16000, 1)


def test_a_file_is_averaged_unless_opened_as_the_configured_input(tmp_path: Path):
    path = write_wav(tmp_path / "board.wav", np.zeros((1600, 2), dtype=np.float32), channels=2)
    plain = open_named(str(path), 16000, 1)
    configured = open_named(str(path), 16000, 1, AudioSettings(mic_geometry="respeaker_2mic"))
    try:
        assert isinstance(plain, WavFileSource) and plain.mixer is None
        assert isinstance(configured, WavFileSource) and configured.mixer is not None
    finally:
        plain.close()
        configured.close()
