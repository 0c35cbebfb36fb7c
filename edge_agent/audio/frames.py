"""The audio every stage shares: one sample type and one chunk type, for hearing and speaking alike."""

from __future__ import annotations

from dataclasses import dataclass

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
