"""The echo canceller measured: our announcements played through a room into the microphone, each
canceller's ERLE per 2 s window and its CPU, for `bench hear` and its living room (`bench hear --room`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.clips import PARAGRAPH, RATE
from edge_agent.audio.echo import FRAME, EchoCanceller, EchoUnavailable, SpeexEcho
from edge_agent.audio.frames import Samples

log = logging.getLogger(__name__)

ANNOUNCEMENTS = (
    "The washing machine has finished its program, and the dryer is next. "
    "Please move the clothes before they start to smell.",
    "Your parcel has been delivered to the front porch. The courier left it beside the door.",
)
OWN_SPELLINGS = ("OK Nabu, the washing machine has finished.", "Ok, Nabu: the front door is still open.",
                 "Okey Nabu, it is going to rain.")
"""What our loudspeaker plays in the echo scenes, and announcements that say the wake phrase in
other spellings (the own-voice guard must open no turn for them)."""
CARD_DELAY_S = 0.1
"""Sound card output plus input latency in front of the room (ALSA on a small board)."""

def erle_windows(mic: Samples, out: Samples, window_s: float = 2.0) -> list[float]:
    """Echo return loss enhancement (dB) per `window_s` window; NaN where the microphone is silent."""
    n = round(window_s * RATE)
    found = []
    for start in range(0, min(mic.size, out.size) - n + 1, n):
        m = float(np.sum(mic[start:start + n].astype(np.float64) ** 2))
        o = float(np.sum(out[start:start + n].astype(np.float64) ** 2)) + 1e-12
        found.append(round(10 * np.log10(m / o), 1) if m > 1e-6 else float("nan"))
    return found


def cancel_with(step: Callable[[Samples, Samples], Samples], mic: Samples,
                ref: Samples) -> tuple[Samples, float]:
    """`mic` through `step` frame by frame against `ref`, and the thread CPU it took."""
    out = np.zeros_like(mic)
    started = time.thread_time()
    for i in range(0, mic.size - FRAME + 1, FRAME):
        out[i:i + FRAME] = step(mic[i:i + FRAME], ref[i:i + FRAME])
    return out, time.thread_time() - started


def cancellers(tail_ms: int = 200) -> dict[str, Callable[[Samples, Samples], Samples]]:
    """Each canceller as one frame step; the raw speex ones see the reference unaligned (as
    `speexaec` 0.1.3 and `speexdsp-aec` 0.1.0 offer it: both wrap libspeexdsp's canceller)."""
    out: dict[str, Callable[[Samples, Samples], Samples]] = {
        "ours: speex + delay estimate + residual suppressor": EchoCanceller(tail_ms).process,
        "ours without the residual suppressor": EchoCanceller(tail_ms, suppress=False).process,
    }
    raw = SpeexEcho(tail_ms, suppress=False)
    out["libspeexdsp alone, unaligned"] = lambda m, r: floats(raw.process(pcm16(m), pcm16(r)))
    try:
        import speexaec

        ec = speexaec.EchoCanceller(FRAME, tail_ms * RATE // 1000, RATE)
        out["speexaec 0.1.3, unaligned"] = lambda m, r: floats(ec.process(pcm16(m), pcm16(r)))
    except ImportError:
        log.warning("speexaec not installed: not measured")
    return out


def pcm16(samples: Samples) -> np.ndarray:
    """Samples in -1..1 to 16-bit PCM, as the speex and WebRTC libraries take them."""
    pcm: np.ndarray = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    return pcm


def floats(pcm: bytes | np.ndarray) -> Samples:
    """16-bit PCM (bytes or an array) back to samples in -1..1."""
    ints = np.frombuffer(pcm, "<i2") if isinstance(pcm, bytes) else np.asarray(pcm, dtype=np.int16)
    out: Samples = ints.astype(np.float32) * np.float32(1 / 32768)
    return out


def measure_echo(say: Callable[[str], Samples], impulse: Samples) -> dict[str, Any]:
    """ERLE and CPU of each canceller over our voice (`say`) played through `impulse`."""
    played = np.concatenate([say(PARAGRAPH), say(ANNOUNCEMENTS[0])])
    played = (0.5 * played / np.max(np.abs(played))).astype(np.float32)
    mic = np.convolve(played, impulse)[:played.size].astype(np.float32)
    mic += np.random.default_rng(3).normal(0, 1e-3, mic.size).astype(np.float32)
    out: dict[str, Any] = {"played_s": round(played.size / RATE, 1)}
    try:
        steps = cancellers()
    except EchoUnavailable as exc:
        return {"error": str(exc)}
    for name, step in steps.items():
        cleaned, cpu = cancel_with(step, mic, played)
        windows = erle_windows(mic, cleaned)
        settled = [w for w in windows[2:] if not np.isnan(w)]
        out[name] = {"erle_db_per_2s": windows, "erle_db_first_2s": windows[0],
                     "erle_db_after_4s_median": round(float(np.median(settled)), 1) if settled else None,
                     "cpu_ms_per_s": round(1000 * cpu / (mic.size / RATE), 2)}
        log.info("%s: %s", name, out[name])
    return out
