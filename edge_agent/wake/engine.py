"""The wake word engine: 16 kHz mono audio in, detections (model, phrase, stream time) out.

One microWakeWord front end (40 mel features per 10 ms) feeds every configured
model; a model runs once per `stride` feature steps (30 ms for the built-in ones), its
`Trigger` averages the probabilities over its sliding window and fires when the mean
rises above its cutoff: a model re-arms only once its mean has fallen back below the
cutoff, and after any detection all models are quiet for `refractory_s`, so a phrase
wakes once however long its probability stays high. The window is ours, not
pymicro-wakeword's: its `process_streaming_prob` answers 0.0 on the feature steps
between two inferences, which read as "fell below the cutoff" and re-armed every model
every 30 ms. The engine knows
no trigger: the hearing loop, a Wyoming `detect` service or a benchmark feed it
the same way, and it does no I/O of its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError
from edge_agent.wake.models import WakeModelSpec, check_all, check_tflite, library_path
from edge_agent.wake.settings import WakeSettings

SAMPLE_RATE = 16000
STEP = 160
"""Samples per front-end step (10 ms)."""


@dataclass(frozen=True)
class Detection:
    """A wake word heard."""

    model: str
    """Model name (`okay_nabu`)."""
    wake_word: str
    """The phrase (`Okay Nabu`)."""
    time: float
    """Seconds of stream time at the end of the audio that decided it."""
    probability: float
    """The windowed probability that crossed the cutoff."""

    def to_json(self) -> dict[str, object]:
        return {"wake_word": self.wake_word, "model": self.model, "time": round(self.time, 3),
                "probability": round(self.probability, 3)}


@dataclass
class WakeStats:
    """Counts since the engine was made or reset."""

    audio_s: float = 0.0
    detections: int = 0
    suppressed: int = 0
    """Rises above a cutoff inside a refractory period."""
    peak: dict[str, float] = field(default_factory=dict)
    """Highest windowed probability per model."""


class Trigger:
    """One model's decision: the mean of its last `window` probabilities, firing on the rise over
    `cutoff` (a pure state machine; the engine adds the refractory period across models)."""

    def __init__(self, cutoff: float, window: int) -> None:
        self.cutoff = cutoff
        self._window: deque[float] = deque(maxlen=window)
        self._above = False

    def push(self, probability: float) -> tuple[float, bool]:
        """The windowed mean after one inference's probability, and whether it just rose over the cutoff
        (the mean is 0 until the window is full, as microWakeWord's own is)."""
        self._window.append(probability)
        mean = sum(self._window) / len(self._window) if len(self._window) == self._window.maxlen else 0.0
        rising = mean > self.cutoff and not self._above
        self._above = mean > self.cutoff
        return mean, rising

    def reset(self) -> None:
        self._window.clear()
        self._above = False


Listener = Callable[[str, float, float], None]
"""Called with (model name, stream seconds, raw probability) after every inference (benchmarks)."""


class WakeEngine:
    """Feed blocks of any length with `feed` (float) or `feed_pcm` (s16le); get the detections in them."""

    def __init__(self, specs: Sequence[WakeModelSpec], refractory_s: float = 2.0,
                 listener: Listener | None = None) -> None:
        from pymicro_wakeword import MicroWakeWord, MicroWakeWordFeatures

        if not specs:
            raise ModelError("no wake word model configured")
        lib = library_path()
        self.specs = tuple(specs)
        self.refractory = round(refractory_s * SAMPLE_RATE)
        # A window of one: the model answers each inference's own probability; `Trigger` averages.
        self._models = [
            MicroWakeWord(spec.name, wake_word=spec.wake_word, tflite_model=spec.tflite_path,
                          probability_cutoff=spec.probability_cutoff, sliding_window_size=1,
                          trained_languages=[], libtensorflowlite_c_path=lib)
            for spec in specs
        ]
        self._triggers = [Trigger(spec.probability_cutoff, spec.sliding_window_size) for spec in specs]
        self._listener = listener
        self._frontend = MicroWakeWordFeatures()
        self._pending = b""
        self._pos = 0
        self._features = 0
        self._quiet_until = 0
        self.stats = WakeStats()

    @classmethod
    def load(cls, settings: WakeSettings) -> WakeEngine:
        """The configured models, each checked (custom ones in a child process first)."""
        specs = check_all(settings)
        for spec in specs:
            if not spec.builtin:
                check_tflite(spec.tflite_path)
        return cls(specs, settings.refractory_s)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.specs)

    @property
    def position(self) -> float:
        """Seconds of audio processed so far."""
        return self._pos / SAMPLE_RATE

    def feed(self, samples: Samples) -> list[Detection]:
        """Process 16 kHz mono float samples (-1..1)."""
        pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype("<i2")
        return self.feed_pcm(pcm.tobytes())

    def feed_pcm(self, pcm: bytes) -> list[Detection]:
        """Process 16 kHz mono signed 16-bit little-endian PCM."""
        data = self._pending + pcm if self._pending else pcm
        step_bytes = STEP * 2
        usable = len(data) - len(data) % step_bytes
        self._pending = data[usable:]
        found: list[Detection] = []
        for offset in range(0, usable, step_bytes):
            detection = self._step(data[offset:offset + step_bytes])
            if detection is not None:
                found.append(detection)
        return found

    def _step(self, chunk: bytes) -> Detection | None:
        self._pos += STEP
        self.stats.audio_s += STEP / SAMPLE_RATE
        fired: Detection | None = None
        for features in self._frontend.process_streaming(chunk):
            self._features += 1
            for spec, model, trigger in zip(self.specs, self._models, self._triggers, strict=True):
                raw = model.process_streaming_prob(features)
                # Between inferences the model only buffers features (and answers 0.0).
                if raw is None or self._features % model.stride:
                    continue
                if self._listener is not None:
                    self._listener(spec.name, self._pos / SAMPLE_RATE, raw)
                prob, rising = trigger.push(raw)
                if prob > self.stats.peak.get(spec.name, 0.0):
                    self.stats.peak[spec.name] = prob
                if not rising:
                    continue
                if self._pos < self._quiet_until or fired is not None:
                    self.stats.suppressed += 1
                    continue
                fired = Detection(spec.name, spec.wake_word, self._pos / SAMPLE_RATE, prob)
        if fired is not None:
            self._quiet_until = self._pos + self.refractory
            self.stats.detections += 1
        return fired

    def reset(self) -> None:
        """Forget all audio (a new stream); the models' streaming state is rebuilt."""
        self._frontend.reset()
        for model in self._models:
            model.reset()
        for trigger in self._triggers:
            trigger.reset()
        self._pending = b""
        self._pos = 0
        self._features = 0
        self._quiet_until = 0
        self.stats = WakeStats()

    def close(self) -> None:
        for model in self._models:
            model.close()
