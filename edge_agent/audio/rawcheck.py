"""Whether raw s16 PCM from a pipe sounds like audio, a byte out of step, or noise.

A 16-bit stream read one byte off (a writer that wrote half a sample and went on) puts each
sample's noisy low byte where its high byte belongs: whatever was said becomes white noise near
full scale, and nothing else in the chain can tell. Audio, speech or silence or a tone, is
never loud white noise for seconds; read one byte further on, a stream that is out of step is
audio again, while garbage (random bytes, the wrong format) is noise either way.
"""

from __future__ import annotations

import numpy as np

WINDOW_S = 1.0
"""Seconds of audio each verdict is drawn from."""
LOUD = 0.2
"""Mean absolute level (of full scale) from which white noise is not a room's hiss."""
FLOOR = 0.01
"""Mean absolute level below which a stream is not judged out of step (near-silence)."""
WHITE = 0.3
"""Correlation of neighbouring samples below which a signal is taken for white noise (audio at
16 kHz sits near 1; a byte-shifted stream near 0)."""


def _level_white(samples: np.ndarray) -> tuple[float, bool]:
    """Mean absolute level (of full scale), and whether it is white noise."""
    x = samples.astype(np.float32) / 32768.0
    x -= x.mean()
    energy = float(np.dot(x, x))
    white = energy > 0 and abs(float(np.dot(x[:-1], x[1:]))) / energy < WHITE
    return float(np.mean(np.abs(x))), white


class PcmCheck:
    """Verdicts on a stream of interleaved s16le frames, one per `WINDOW_S` of audio: "ok", "out of
    step" (a byte off) or "noise". Other sample widths are not judged."""

    def __init__(self, bytes_per_s: int, width: int, channels: int) -> None:
        self.judged = width == 2
        self.channels = channels
        self._window = max(2 * channels * 16, round(WINDOW_S * bytes_per_s)) // 2 * 2
        self._pending = bytearray()
        self._skip = 0

    def push(self, data: bytes) -> str | None:
        """The verdict on the window `data` completes, else None."""
        if not self.judged:
            return None
        if self._skip:
            cut = min(self._skip, len(data))
            data, self._skip = data[cut:], self._skip - cut
        self._pending += data
        if len(self._pending) < self._window + 2:
            return None
        window = bytes(self._pending[:self._window + 2])
        del self._pending[:self._window]
        as_read = np.frombuffer(window, "<i2", self._window // 2)[::self.channels]
        a_byte_on = np.frombuffer(window, "<i2", self._window // 2, offset=1)[::self.channels]
        level, white = _level_white(as_read)
        if not white or level < FLOOR:
            return "ok"
        # Out of step, a byte on is audio: not white (a voice, a tone), or far quieter (a quiet
        # room, whose noisy low bytes made the noise). Genuine noise stays noise a byte on.
        level_on, white_on = _level_white(a_byte_on)
        if not white_on or level_on < level / 8:
            return "out of step"
        return "noise" if level >= LOUD else "ok"

    def restart(self, skip: int = 0) -> None:
        """Forget the window begun (the stream was cut: a writer left), and judge from `skip` bytes
        further on (the bytes the reader skips to be in step)."""
        self._pending.clear()
        self._skip = skip
