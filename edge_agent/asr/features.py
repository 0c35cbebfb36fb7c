"""Whisper's log-mel spectrogram in numpy, equal to openai-whisper's `log_mel_spectrogram`.

Whisper reads 16 kHz audio as an 80- (or 128-) band log-mel spectrogram: a 400-point
STFT (25 ms periodic Hann window, 10 ms hop, reflect-padded by 200 samples at both
ends), power spectrum, Slaney-style mel filters, log10 floored 8 decades below the
loudest bin, then scaled by `(x + 4) / 4`. The last STFT frame is dropped, so N
samples give N // 160 frames.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt

from edge_agent.audio.frames import Samples

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_S = 30
N_SAMPLES = CHUNK_S * SAMPLE_RATE
"""Samples in Whisper's 30 s window."""
N_FRAMES = N_SAMPLES // HOP_LENGTH
"""Mel frames in Whisper's 30 s window (3000)."""
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH

Features = npt.NDArray[np.float32]
"""A float32 feature tensor: mel filters, a log-mel spectrogram, encoder states."""
Float64 = npt.NDArray[np.float64]


def _hz_to_mel(freq: Float64) -> Float64:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above (librosa's default)."""
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    mels = freq / f_sp
    above = freq >= min_log_hz
    mels[above] = min_log_mel + np.log(freq[above] / min_log_hz) / logstep
    return mels


def _mel_to_hz(mels: Float64) -> Float64:
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    freqs = mels * f_sp
    above = mels >= min_log_mel
    freqs[above] = min_log_hz * np.exp(logstep * (mels[above] - min_log_mel))
    return freqs


@lru_cache(maxsize=4)
def mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, fmin: float = 0.0,
                fmax: float | None = None) -> Features:
    """Triangular mel filters [n_mels, n_fft // 2 + 1] over fmin..fmax (default Nyquist), Slaney norm."""
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = np.array([fmin, sample_rate / 2 if fmax is None else fmax])
    mel_min, mel_max = _hz_to_mel(edges.copy())
    mel_points = _mel_to_hz(np.linspace(mel_min, mel_max, n_mels + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2:] - mel_points[:-2]))[:, None]
    return weights.astype(np.float32)


@lru_cache(maxsize=1)
def _window() -> Float64:
    """Periodic Hann window (torch.hann_window's default), as used by Whisper."""
    n = np.arange(N_FFT)
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / N_FFT)


def log_mel_spectrogram(audio: Samples, n_mels: int = 80, padding: int = 0) -> Features:
    """Log-mel features [n_mels, (len(audio) + padding) // 160] of 16 kHz mono audio.

    `padding` zero samples are appended first, as Whisper does before slicing its
    30 s windows; the floor 8 decades below the maximum is taken over the whole result.
    """
    signal = np.asarray(audio, dtype=np.float32)
    if signal.ndim != 1:
        raise ValueError(f"expected mono audio, got shape {signal.shape}")
    n_frames = (signal.size + max(0, padding)) // HOP_LENGTH
    if n_frames == 0:
        return np.zeros((n_mels, 0), dtype=np.float32)
    half = N_FFT // 2
    if signal.size + max(0, padding) <= half:
        raise ValueError(f"need more than {half} samples for reflect padding, got {signal.size + padding}")
    live = min(n_frames, _live_frames(signal.size))
    if live < n_frames:
        # A frame whose window holds only padding has zero power, so its log-mel is the
        # floor log10(1e-10) = -10 before clamping: only the frames that see audio need an STFT.
        tail = (live - 1) * HOP_LENGTH + half + 1 - signal.size
        signal = np.concatenate([signal, np.zeros(max(tail, half + 1), dtype=np.float32)])
        log_spec = np.full((n_mels, n_frames), -10.0, dtype=np.float32)
        log_spec[:, :live] = _log10_mel(np.pad(signal, (half, 0), mode="reflect"), live, n_mels)
    else:
        if padding > 0:
            signal = np.concatenate([signal, np.zeros(padding, dtype=np.float32)])
        log_spec = _log10_mel(np.pad(signal, (half, half), mode="reflect"), n_frames, n_mels)
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    out: Features = ((log_spec + 4.0) / 4.0).astype(np.float32)
    return out


def _live_frames(n_audio: int) -> int:
    """Frames whose 400-sample window (centred on frame * 160) overlaps `n_audio` samples."""
    return -(-(n_audio + N_FFT // 2) // HOP_LENGTH)


def _log10_mel(padded: Features, n_frames: int, n_mels: int) -> Features:
    """log10 mel power of the first `n_frames` STFT frames of an already reflect-padded signal."""
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH][:n_frames]
    spectrum = np.fft.rfft(frames * _window().astype(np.float32), axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    mel = mel_filters(n_mels) @ power.T
    out: Features = np.log10(np.maximum(mel, 1e-10)).astype(np.float32)
    return out
