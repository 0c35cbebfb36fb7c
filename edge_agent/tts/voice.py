"""What every voice offers: sentences in, audio chunks out."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

Samples = npt.NDArray[np.float32]
"""Mono float32 audio in -1..1."""


@dataclass(frozen=True)
class AudioChunk:
    """A piece of synthesized speech."""

    samples: Samples
    sample_rate: int
    """Hertz"""
    sentence: int
    """Index of the sentence this chunk belongs to."""
    last: bool
    """True on the final chunk of its sentence."""
    engine: str = "local"
    """Which engine made it: `local` or `remote`."""


class Voice(Protocol):
    """A loaded voice."""

    id: str
    sample_rate: int

    def sentences(self, text: str) -> list[str]:
        """Normalise `text` and split it the way this voice synthesizes it."""
        ...

    def synthesize_sentence(self, sentence: str) -> Iterator[Samples]:
        """Audio for one sentence, possibly in several chunks."""
        ...

    def close(self) -> None:
        """Release the model."""
        ...


class Synthesizer(Protocol):
    """Text in, a stream of chunks out, whichever engine does the work."""

    def stream(self, text: str, voice: str | None = None) -> Iterator[AudioChunk]:
        """Chunks of `text` spoken by `voice` (None: the configured default)."""
        ...


def synthesize(voice: Voice, text: str, silence_s: float = 0.0) -> Iterator[AudioChunk]:
    """Stream `text` sentence by sentence; `silence_s` of silence closes each sentence."""
    gap = np.zeros(round(silence_s * voice.sample_rate), dtype=np.float32)
    for index, sentence in enumerate(voice.sentences(text)):
        pending: Samples | None = None
        for samples in voice.synthesize_sentence(sentence):
            if pending is not None:
                yield AudioChunk(pending, voice.sample_rate, index, last=False)
            pending = samples
        tail = gap if pending is None else np.concatenate([pending, gap])
        yield AudioChunk(tail, voice.sample_rate, index, last=True)
