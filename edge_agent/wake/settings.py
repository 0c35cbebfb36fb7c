"""Wake word settings (`wake.*`): the models, thresholds, what a detection does during playback."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

WAKE_BUILTIN = ("okay_nabu", "hey_jarvis", "alexa", "hey_mycroft")
"""microWakeWord models bundled with pymicro-wakeword."""


@dataclass(frozen=True)
class WakeSettings:
    """Wake word: microWakeWord models (TensorFlow Lite) on the microphone's 16 kHz stream."""

    models: tuple[str, ...] = ("okay_nabu",)
    """Built-in names (okay_nabu, hey_jarvis, alexa, hey_mycroft) or the path of a microWakeWord
    model's `.json`, whose `model` key names its `.tflite` beside it."""
    probability_cutoff: dict[str, float] = field(default_factory=dict)
    """Per model name (the `.tflite`'s stem): fire above this probability instead of the default: the
    model's own, except `alexa`'s 0.85 (its own 0.9), chosen on recordings of real people."""
    sliding_window: dict[str, int] = field(default_factory=dict)
    """Per model name: average this many of its probabilities (one per 30 ms) instead of the model's
    own number (5 for the built-in ones). A longer window with a lower cutoff can keep detection with
    fewer false accepts, but wakes later (8: about 60 ms, see docs/benchmarks.md)."""
    refractory_s: float = 2.0
    """After a detection, ignore every model for this long (one utterance wakes once)."""
    during_playback: Literal["barge_in", "ignore"] = "barge_in"
    """A wake word while the device speaks: pause the announcement and start a turn, or ignore it."""
    chime: bool = True
    """Play a short chime when a turn starts (the user's cue to speak)."""

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("models: name at least one wake word model (or set listen.mode)")
        for name, cutoff in self.probability_cutoff.items():
            if not 0.0 < cutoff < 1.0:
                raise ValueError(f"probability_cutoff.{name}: {cutoff} is outside 0..1")
        for name, window in self.sliding_window.items():
            if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= 100:
                raise ValueError(f"sliding_window.{name}: {window!r} is not a whole number in 1..100")
        if not 0.0 <= self.refractory_s <= 60.0:
            raise ValueError(f"refractory_s: {self.refractory_s} is outside 0..60")
