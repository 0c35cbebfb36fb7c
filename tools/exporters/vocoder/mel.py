"""The log-mel spectrogram a HiFi-GAN generator was trained on, in numpy.

HiFi-GAN's recipe: reflect-pad the audio by `(n_fft - hop) / 2` on both sides, STFT
without centring (periodic Hann window of `win` samples), magnitude (not power),
Slaney mel filters over `fmin..fmax`, natural log floored at 1e-5. N samples give
N // hop frames, and the generator turns each frame back into `hop` samples.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from edge_agent.asr.features import mel_filters
from edge_agent.audio.frames import Samples
from exporters.vocoder.hifigan import MelSpec

Mels = npt.NDArray[np.float32]
"""A log-mel spectrogram, (n_mels, frames): what a vocoder takes."""

FLOOR = 1e-5
"""Smallest magnitude before the log (HiFi-GAN's `dynamic_range_compression` clip)."""


def log_mel(audio: Samples, spec: MelSpec) -> Mels:
    """`[n_mels, len(audio) // hop]` natural-log mel magnitudes of audio at `spec.sample_rate`."""
    pad = (spec.n_fft - spec.hop) // 2
    if audio.size <= pad:
        raise ValueError(f"{audio.size} samples: too short for a {spec.n_fft}-point analysis")
    padded = np.pad(audio.astype(np.float64), pad, mode="reflect")
    frames = 1 + (padded.size - spec.n_fft) // spec.hop
    index = np.arange(spec.n_fft)[None, :] + spec.hop * np.arange(frames)[:, None]
    n = np.arange(spec.win)
    window = np.zeros(spec.n_fft)
    offset = (spec.n_fft - spec.win) // 2  # a shorter window sits in the middle, as torch.stft puts it
    window[offset:offset + spec.win] = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / spec.win)
    spectrum = np.fft.rfft(padded[index] * window, axis=1)
    magnitude = np.sqrt(spectrum.real ** 2 + spectrum.imag ** 2 + 1e-9)
    filters = mel_filters(spec.n_mels, spec.sample_rate, spec.n_fft, spec.fmin, spec.fmax)
    mel = filters.astype(np.float64) @ magnitude.T
    out: Mels = np.log(np.maximum(mel, FLOOR)).astype(np.float32)
    return out


def mel_distance(a: Mels, b: Mels) -> float:
    """Mean absolute difference of two log-mel spectrograms over their common frames (nats)."""
    frames = min(a.shape[-1], b.shape[-1])
    return float(np.abs(a[..., :frames].astype(np.float64) - b[..., :frames]).mean())
