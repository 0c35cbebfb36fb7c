"""Acoustic echo cancellation: our own playback taken back out of the microphone.

Three parts, each usable alone:

- `SpeexEcho`: the speex echo canceller (a multi-delay block frequency-domain adaptive
  filter) and its residual echo suppressor, called through ctypes on the system's
  libspeexdsp (BSD-3-Clause; Debian/Ubuntu/Raspberry Pi OS `libspeexdsp1`). No Python
  wheel of it fits: `speexaec` has wheels for CPython 3.13 only, `speexdsp-aec` is
  marked proprietary, and WebRTC AEC3 (`webrtc-apm`) ships for Windows alone.
- `DelayEstimator`: where the echo sits in the microphone relative to the reference
  (the sound card's buffers plus the air), by GCC-PHAT over one-second windows in
  which something played, smoothed over windows so speech's gaps do not throw it.
- `EchoCanceller`: both together, frame by frame: the reference is delayed by the
  estimate (less a margin, so the filter stays causal) and the filter models the rest
  of the path, `tail_ms` of it. While nothing has played for a filter length it
  passes the microphone through untouched and costs nothing.

Measured by `edge-agent bench hear` (our voice through a simulated 5 x 4 x 2.6 m room, 22 s):
ERLE 39 dB (median of 2 s windows after the first 4 s, while it learns: 1 dB, then 8 dB)
with the residual suppressor, 34 dB without it; libspeexdsp fed the reference unaligned, as
`speexaec` and `speexdsp-aec` use it, 31.5 dB with 100 ms of sound card in front and 0.1 dB
with 300 ms (the echo falls outside its filter). About 10 ms of CPU per second of playback.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.errors import AudioError

log = logging.getLogger(__name__)

RATE = 16000
FRAME = 160
"""Samples per canceller frame (10 ms)."""

_SET_SAMPLING_RATE = 24
"""speex_echo.h `SPEEX_ECHO_SET_SAMPLING_RATE`."""
_PRE_SET_DENOISE = 0
_PRE_SET_NOISE_SUPPRESS = 18
_PRE_SET_ECHO_SUPPRESS = 20
_PRE_SET_ECHO_SUPPRESS_ACTIVE = 22
_PRE_SET_ECHO_STATE = 24
"""speex_preprocess.h requests."""

NOISE_FLOOR_DB = -1
"""The residual suppressor's noise floor: next to nothing (noise is the front end's own stage)."""


class EchoUnavailable(AudioError):
    """The echo canceller's library is not installed."""


@functools.lru_cache(maxsize=1)
def speexdsp() -> Any:
    """The system's libspeexdsp through ctypes (loaded once)."""
    name = ctypes.util.find_library("speexdsp") or "libspeexdsp.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        raise EchoUnavailable("echo cancellation needs libspeexdsp (apt-get install libspeexdsp1)") from None
    void_p, int_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int16)
    lib.speex_echo_state_init.restype = void_p
    lib.speex_echo_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_echo_state_destroy.argtypes = [void_p]
    lib.speex_echo_state_reset.argtypes = [void_p]
    lib.speex_echo_ctl.argtypes = [void_p, ctypes.c_int, void_p]
    lib.speex_echo_cancellation.argtypes = [void_p, int_p, int_p, int_p]
    lib.speex_preprocess_state_init.restype = void_p
    lib.speex_preprocess_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_preprocess_state_destroy.argtypes = [void_p]
    lib.speex_preprocess_ctl.argtypes = [void_p, ctypes.c_int, void_p]
    lib.speex_preprocess_run.argtypes = [void_p, int_p]
    return lib


class SpeexEcho:
    """One speex echo canceller (and residual echo suppressor) over 10 ms int16 frames."""

    def __init__(self, tail_ms: int = 200, suppress: bool = True) -> None:
        lib = speexdsp()
        self._lib = lib
        self.tail = round(tail_ms * RATE / 1000)
        self._echo = lib.speex_echo_state_init(FRAME, self.tail)
        if not self._echo:
            raise AudioError(f"speex_echo_state_init({FRAME}, {self.tail}) failed")
        rate = ctypes.c_int(RATE)
        lib.speex_echo_ctl(self._echo, _SET_SAMPLING_RATE, ctypes.byref(rate))
        self._pre = None
        if suppress:
            # The linear filter leaves the echo's nonlinear part and what it has not learnt yet;
            # the preprocessor, told the echo state, attenuates that residual (denoise off: the
            # front end's own suppressor does noise).
            self._pre = lib.speex_preprocess_state_init(FRAME, RATE)
            # Its spectral gain (where the echo suppression lives) runs only with denoise on.
            on = ctypes.c_int(1)
            lib.speex_preprocess_ctl(self._pre, _PRE_SET_DENOISE, ctypes.byref(on))
            for request, db in ((_PRE_SET_NOISE_SUPPRESS, NOISE_FLOOR_DB), (_PRE_SET_ECHO_SUPPRESS, -40),
                                (_PRE_SET_ECHO_SUPPRESS_ACTIVE, -15)):
                value = ctypes.c_int(db)
                lib.speex_preprocess_ctl(self._pre, request, ctypes.byref(value))
            lib.speex_preprocess_ctl(self._pre, _PRE_SET_ECHO_STATE, self._echo)
        self._out = np.zeros(FRAME, dtype=np.int16)
        self._ptr = ctypes.POINTER(ctypes.c_int16)

    def process(self, mic: np.ndarray, far: np.ndarray) -> np.ndarray:
        """One frame: `mic` with the echo of `far` removed (int16 in, int16 out)."""
        mic = np.ascontiguousarray(mic, dtype=np.int16)
        far = np.ascontiguousarray(far, dtype=np.int16)
        out = np.empty(FRAME, dtype=np.int16)
        self._lib.speex_echo_cancellation(self._echo, mic.ctypes.data_as(self._ptr),
                                          far.ctypes.data_as(self._ptr), out.ctypes.data_as(self._ptr))
        if self._pre is not None:
            self._lib.speex_preprocess_run(self._pre, out.ctypes.data_as(self._ptr))
        return out

    def reset(self) -> None:
        self._lib.speex_echo_state_reset(self._echo)

    def close(self) -> None:
        if self._pre is not None:
            self._lib.speex_preprocess_state_destroy(self._pre)
            self._pre = None
        if self._echo:
            self._lib.speex_echo_state_destroy(self._echo)
            self._echo = None

    def __del__(self) -> None:
        self.close()


@dataclass
class DelayEstimate:
    """One window's verdict."""

    lag: int
    """Samples the echo arrives after the reference."""
    confidence: float
    """Peak of the PHAT correlation over its mean absolute value."""


class DelayEstimator:
    """GCC-PHAT between the reference and the microphone over `window` samples at a time."""

    MIN_CONFIDENCE = 8.0
    """A peak this far above the correlation's floor is an echo, not chance."""

    def __init__(self, max_lag: int, window: int = 16384, smoothing: float = 0.5) -> None:
        self.max_lag = max_lag
        self.window = max(window, 2 * max_lag)
        self.smoothing = smoothing
        self._n = 1 << int(np.ceil(np.log2(2 * self.window)))
        self._mic: list[Samples] = []
        self._ref: list[Samples] = []
        self._filled = 0
        self._cross: np.ndarray | None = None
        self.lag: int | None = None
        """The last confident lag (None until one was found)."""

    def push(self, mic: Samples, ref: Samples) -> DelayEstimate | None:
        """Add equally long pieces; a verdict at each full window in which the reference played."""
        self._mic.append(mic)
        self._ref.append(ref)
        self._filled += mic.size
        if self._filled < self.window:
            return None
        m = np.concatenate(self._mic)
        r = np.concatenate(self._ref)
        self._mic, self._ref, self._filled = [], [], 0
        if np.mean(np.abs(r) > 1e-3) < 0.2:  # too little played in this window to tell
            return None
        spec = np.fft.rfft(m, self._n) * np.conj(np.fft.rfft(r, self._n))
        spec /= np.abs(spec) + 1e-12
        self._cross = spec if self._cross is None else (
            self.smoothing * self._cross + (1 - self.smoothing) * spec)
        corr = np.abs(np.fft.irfft(self._cross, self._n)[:self.max_lag + 1])
        lag = int(np.argmax(corr))
        estimate = DelayEstimate(lag, float(corr[lag] / (np.mean(corr) + 1e-12)))
        if estimate.confidence >= self.MIN_CONFIDENCE:
            self.lag = lag
        return estimate


class EchoCanceller:
    """Microphone frames in, echo-free frames out, given the reference at the microphone's times.

    `process(mic, ref)` takes one 10 ms frame of each: `ref` is what the timeline says
    played at the time the microphone frame was captured; the canceller finds how much
    later it is heard (`delay`) and cancels it.
    """

    MARGIN = 2 * FRAME
    """Samples of the filter spent ahead of the estimated delay (a slightly late estimate stays
    causal)."""

    def __init__(self, tail_ms: int = 200, max_delay_ms: int = 500, suppress: bool = True) -> None:
        self.speex = SpeexEcho(tail_ms, suppress)
        self.tail = self.speex.tail
        self.estimator = DelayEstimator(round(max_delay_ms * RATE / 1000))
        self.applied = 0
        """Samples the reference is delayed by before the filter."""
        keep = self.estimator.max_lag + self.tail + 2 * FRAME
        self._history = np.zeros(keep, dtype=np.float32)
        self._quiet = keep
        """Frames' worth of samples since the reference last played (reset when it plays)."""
        self.frames = 0
        self.cancelled = 0
        """Frames that went through the filter (something had played within its reach)."""

    @property
    def delay(self) -> int | None:
        return self.estimator.lag

    def process(self, mic: Samples, ref: Samples) -> Samples:
        """One frame (`FRAME` samples, float -1..1) of each; the microphone without our playback."""
        self.frames += 1
        self._history = np.concatenate([self._history[FRAME:], ref])
        self._quiet = 0 if np.any(ref) else self._quiet + FRAME
        if self._quiet >= self._history.size:  # nothing within reach played: leave the filter be
            return mic
        self._follow(self.estimator.push(mic, ref))
        end = self._history.size - self.applied
        far = self._history[end - FRAME:end]
        self.cancelled += 1
        out = self.speex.process(_pcm(mic), _pcm(far))
        result: Samples = out.astype(np.float32) / 32768.0
        return result

    def aligned(self, n: int) -> Samples:
        """The last `n` samples of the reference as the microphone hears them (delayed by the estimate)."""
        lag = self.delay or 0
        end = self._history.size - lag
        heard: Samples = self._history[max(0, end - n):end].copy()
        return heard

    def _follow(self, estimate: DelayEstimate | None) -> None:
        lag = self.estimator.lag
        if estimate is None or lag is None:
            return
        # The filter's whole length goes to the room after the direct path. A move costs the
        # filter a re-convergence, so jitter of less than a frame is left alone.
        target = max(0, lag - self.MARGIN)
        if abs(target - self.applied) > FRAME:
            old, self.applied = self.applied, target
            log.info("echo delay %.1f ms (reference moved from %.1f to %.1f ms, confidence %.0f)",
                     lag / RATE * 1000, old / RATE * 1000, self.applied / RATE * 1000, estimate.confidence)

    def close(self) -> None:
        self.speex.close()


def _pcm(samples: Samples) -> np.ndarray:
    pcm: np.ndarray = np.clip(np.round(samples * 32767.0), -32768, 32767).astype(np.int16)
    return pcm
