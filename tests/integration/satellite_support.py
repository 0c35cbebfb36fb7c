"""What the daemon tests that play Home Assistant share: a real-time microphone pipe, the clips
and constants of a turn, and how a played answer is heard."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clips import load_16k, piper_clip
from edge_agent.asr.whisper import Padding
from edge_agent.audio.resample import resample
from edge_agent.audio.sources import PcmStreamSource
from edge_agent.audio.wav import read_wav, to_pcm16
from edge_agent.config import AsrSettings
from tests.speech_fixtures import silence
from tests.waiting import TIMEOUT

WAKE_COMMAND = "Okay Nabu, turn on the kitchen lights."
ANSWER = "The kitchen lights are on."
NOTICE = "Dinner is ready."
RATE = 16000
BLOCK_S = 0.03
ANSWER_WAIT_S = 2 * TIMEOUT
"""`listen.answer_wait_s` in the tests of a run that ends without an answer: twice the longest wait
for a status, so an announcement spoken at all was not released by it."""


class Microphone:
    """A pipe the daemon's hearing loop reads as its microphone: `say` writes audio into it,
    and between phrases a real-time stream of silence keeps the loop's blocks coming."""

    def __init__(self) -> None:
        read_fd, self._write_fd = os.pipe()
        self.source = PcmStreamSource(os.fdopen(read_fd, "rb", buffering=0), block_s=BLOCK_S, name="test-mic")
        self._said: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-mic", daemon=True)
        self._thread.start()

    def say(self, audio: np.ndarray) -> None:
        with self._lock:
            self._said.append(audio)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        os.close(self._write_fd)

    def _run(self) -> None:
        quiet = to_pcm16(silence(BLOCK_S))
        while not self._stop.is_set():
            with self._lock:
                said, self._said = self._said, []
            try:
                for audio in said:
                    os.write(self._write_fd, to_pcm16(audio))
                os.write(self._write_fd, quiet)
            except OSError:
                return  # the daemon closed its end
            self._stop.wait(BLOCK_S)  # pacing, as a sound card would


def spoken(whisper: Any, path: Path) -> str:
    text: str = whisper.recognize(load_16k(path), Padding.from_settings(AsrSettings())).text
    return text.lower()


def clip_22k(text: str, clip_cache: Path, piper_voice: Any) -> np.ndarray:
    wav = read_wav(piper_clip(text, clip_cache, piper_voice))
    return resample(wav.samples, wav.sample_rate, 22050)
