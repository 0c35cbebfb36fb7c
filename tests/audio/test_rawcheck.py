"""Judging raw s16 PCM: audio, a stream a byte out of step, or noise (real speech, real noise)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from benchmarks.clips import load_16k
from edge_agent.audio.rawcheck import PcmCheck
from edge_agent.audio.wav import encode_pcm
from tests.speech_fixtures import noise, silence


def verdicts(pcm: bytes, channels: int = 1) -> set[str | None]:
    check = PcmCheck(16000 * 2 * channels, 2, channels)
    return {check.push(pcm[at:at + 960]) for at in range(0, len(pcm), 960)} - {None}


@pytest.fixture(scope="module")
def speech(espeak_clips: list[Any]) -> np.ndarray:
    said = np.concatenate([load_16k(clip.path) for clip in espeak_clips[:4]])
    return said / np.max(np.abs(said)) * 0.7


def test_speech_silence_and_a_rooms_hiss_are_audio(speech: np.ndarray) -> None:
    room = np.concatenate([silence(1.0), noise(2.0, 0.01), speech, noise(2.0, 0.05)])
    assert verdicts(encode_pcm(room, 2)) == {"ok"}
    assert verdicts(encode_pcm(room, 2, 2), channels=2) == {"ok"}


def test_speech_a_byte_out_of_step_is_found_out(speech: np.ndarray) -> None:
    found = verdicts(b"\x01" + encode_pcm(speech, 2))
    assert "out of step" in found and "noise" not in found
    quiet_room = b"\x01" + encode_pcm(noise(3.0, 0.0005), 2)  # its noisy low bytes: loud noise
    assert verdicts(quiet_room) == {"out of step"}


def test_random_bytes_are_noise_either_way() -> None:
    assert verdicts(os.urandom(96000)) == {"noise"}
    assert verdicts(b"\x01" + os.urandom(96000)) == {"noise"}


def test_other_widths_are_not_judged() -> None:
    check = PcmCheck(16000 * 3, 3, 1)
    assert check.push(os.urandom(96000)) is None
