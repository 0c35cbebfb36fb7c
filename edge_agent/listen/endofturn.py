"""End of turn: whether a pause in the speech ends the turn (Smart Turn v3.2, `listen.end_of_turn`).

A pause is not the end of a turn: people pause mid-command ("Turn off the oven...
and start the dishwasher"). The VAD alone can only wait (`vad.hangover_ms`); the
end-of-turn model hears the last `WINDOW_S` seconds of the turn and says how likely
it is that the speaker has finished (intonation, a sentence that sounds done).

The model (`smart-turn`, BSD-2-Clause, from the `pipecat-ai` wheel) takes Whisper's
80-band log-mel features of exactly 8 s of 16 kHz audio, zero-padded on the left,
with the waveform normalised to zero mean and unit variance first: what
`transformers.WhisperFeatureExtractor(do_normalize=True)` computes, and what
`asr.features.log_mel_spectrogram` computes on the normalised window.

`EndOfTurn` runs the model on one worker thread so that the hearing loop can decode
with Whisper meanwhile, and bounds it: a call still running when the next pause is
judged (a model slower than real time under load) makes that pause skipped, never
queued, and a verdict that comes later than the caller can wait is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.asr.features import SAMPLE_RATE, Features, log_mel_spectrogram
from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError
from edge_agent.listen.settings import ListenSettings
from edge_agent.models.store import ModelStore
from edge_agent.runtime.sessions import make_session

log = logging.getLogger(__name__)

MODEL_ID = "smart-turn"
"""Catalog id of the end-of-turn model."""
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
WINDOW_S = 8
WINDOW = WINDOW_S * SAMPLE_RATE
"""Samples the model hears: the turn's last 8 s."""
N_MELS = 80
N_FRAMES = WINDOW // 160
_NORM_EPS = 1e-7
"""WhisperFeatureExtractor's variance floor for `do_normalize`."""


def turn_features(samples: Samples) -> Features:
    """The model's input [1, 80, 800]: the last 8 s of `samples`, zero-padded on the left."""
    audio = np.asarray(samples, dtype=np.float32)[-WINDOW:]
    window = np.zeros(WINDOW, dtype=np.float32)
    window[WINDOW - audio.size:] = audio
    # Normalised over the whole window, padding included, as the feature extractor the model
    # was trained with does; without it a quiet speaker's features sit far from the training data.
    normalised = (window - window.mean()) / np.sqrt(window.var() + _NORM_EPS)
    features: Features = log_mel_spectrogram(normalised, n_mels=N_MELS)[None, :, :]
    return features


class SmartTurn:
    """The Smart Turn v3 ONNX model: the probability that a turn is complete."""

    def __init__(self, session: Any) -> None:
        self._session = session

    @staticmethod
    def load(path: Path, threads: int = 1) -> SmartTurn:
        """Load and check the graph's input (`ModelError` when it is not Smart Turn v3)."""
        session = make_session(path, threads=threads, spin=False)
        inputs = session.get_inputs()
        if len(inputs) != 1 or inputs[0].name != "input_features" or list(inputs[0].shape[1:]) != [
                N_MELS, N_FRAMES]:
            found = [(i.name, i.shape) for i in inputs]
            raise ModelError(f"{path}: not a Smart Turn v3 model (inputs {found})")
        return SmartTurn(session)

    def probability(self, samples: Samples) -> float:
        """How likely the turn whose audio ends with `samples` (16 kHz) is complete."""
        out = self._session.run(None, {"input_features": turn_features(samples)})[0]
        return float(np.asarray(out).reshape(-1)[0])


@dataclass(frozen=True)
class Verdict:
    """What the model said of one pause."""

    complete: bool
    probability: float | None
    """None: not judged (the model was still busy with an earlier pause, or late)."""
    seconds: float
    """Wall time from the question to the verdict (or to giving up on it)."""


@dataclass
class EndOfTurnStats:
    """Counts since the hearing loop started."""

    asked: int = 0
    complete: int = 0
    incomplete: int = 0
    skipped: int = 0
    """Pauses not judged: the previous call was still running."""
    late: int = 0
    """Calls that did not answer within the time the caller could wait."""


class EndOfTurn:
    """The model on its own worker thread, one call at a time (see the module)."""

    def __init__(self, model: SmartTurn, threshold: float) -> None:
        self.model = model
        self.threshold = threshold
        self.stats = EndOfTurnStats()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="end-of-turn")
        self._running: Future[float] | None = None
        self._lock = threading.Lock()

    def ask(self, samples: Samples) -> Future[float] | None:
        """Start judging the turn whose audio ends with `samples`; None when the previous call is
        still running (the pause is skipped, never queued)."""
        with self._lock:
            if self._running is not None and not self._running.done():
                self.stats.skipped += 1
                return None
            self.stats.asked += 1
            audio = np.array(samples[-WINDOW:], dtype=np.float32)
            self._running = self._pool.submit(self.model.probability, audio)
            return self._running

    def verdict(self, future: Future[float] | None, started: float, timeout_s: float) -> Verdict:
        """The verdict of `ask`'s `future`, waiting at most `timeout_s` more (never raising)."""
        if future is None:
            return Verdict(False, None, 0.0)
        try:
            probability = future.result(timeout=max(0.0, timeout_s))
        except FutureTimeout:
            self.stats.late += 1
            return Verdict(False, None, time.perf_counter() - started)
        except Exception as exc:  # onnxruntime raises its own untyped errors; the VAD still ends the turn
            log.warning("end-of-turn model failed: %s", exc)
            return Verdict(False, None, time.perf_counter() - started)
        complete = probability >= self.threshold
        if complete:
            self.stats.complete += 1
        else:
            self.stats.incomplete += 1
        return Verdict(complete, probability, time.perf_counter() - started)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def load_end_of_turn(settings: ListenSettings, store: ModelStore) -> EndOfTurn | None:
    """The end-of-turn model as configured, or None (`end_of_turn: vad`, or the model missing or
    unusable: then one warning says so and turns end at the VAD's hangover)."""
    if settings.end_of_turn != "model":
        return None
    files = store.locate(MODEL_ID)
    if files is None:
        log.warning("listen.end_of_turn is model, but %s is not present or does not match its sha256: turns "
                    "end at the VAD's hangover (run `edge-agent models fetch %s`, 8.7 MB, or set "
                    "listen.end_of_turn: vad)", MODEL_ID, MODEL_ID)
        return None
    try:
        model = SmartTurn.load(files.path(MODEL_FILE))
    except ModelError as exc:
        log.warning("listen.end_of_turn is model, but its model cannot be used (%s): turns end at the "
                    "VAD's hangover", exc)
        return None
    return EndOfTurn(model, settings.turn_probability)


class TurnAudio:
    """The last `WINDOW_S` seconds of a turn's audio, kept as the blocks it came in."""

    def __init__(self) -> None:
        self._blocks: deque[Samples] = deque()
        self._size = 0

    def add(self, samples: Samples) -> None:
        self._blocks.append(samples)
        self._size += samples.size
        while self._blocks and self._size - self._blocks[0].size >= WINDOW:
            self._size -= self._blocks.popleft().size

    def last(self) -> Samples:
        """At most `WINDOW` samples, the newest last."""
        if not self._blocks:
            return np.zeros(0, dtype=np.float32)
        joined: Samples = np.concatenate(self._blocks)[-WINDOW:]
        return joined
