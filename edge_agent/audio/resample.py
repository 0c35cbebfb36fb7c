"""Sample-rate conversion through soxr (one-shot and streaming)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_agent.audio.frames import Samples


def resample(samples: Samples, rate_in: int, rate_out: int) -> Samples:
    """Resample a whole mono float32 signal."""
    if rate_in == rate_out or samples.size == 0:
        return samples.astype(np.float32, copy=False)
    import soxr

    out: Samples = soxr.resample(samples.astype(np.float32, copy=False), rate_in, rate_out, quality="HQ")
    return out.astype(np.float32, copy=False)


class StreamResampler:
    """Resample a stream chunk by chunk without clicks at chunk boundaries."""

    def __init__(self, rate_in: int, rate_out: int) -> None:
        self.rate_in = rate_in
        self.rate_out = rate_out
        self._stream: Any = None
        if rate_in != rate_out:
            import soxr

            self._stream = soxr.ResampleStream(rate_in, rate_out, 1, dtype="float32", quality="HQ")

    def push(self, samples: Samples, last: bool = False) -> Samples:
        if self._stream is None:
            return samples.astype(np.float32, copy=False)
        out: Samples = self._stream.resample_chunk(samples.astype(np.float32, copy=False), last=last)
        return out
