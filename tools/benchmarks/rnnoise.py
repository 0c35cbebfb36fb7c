"""RNNoise (xiph.org, BSD-3-Clause) as a front end for the benches, through the C library that the
`pyrnnoise` wheel ships.

Only the bench uses it, to measure what a small neural suppressor buys on real talkers. The wheel
is installed with `pip install --no-deps pyrnnoise==0.4.5`: its Python side imports `audiolab` and
`matplotlib`, which neither the bench nor a device wants. So the package is located with
`importlib.util.find_spec`, which does not run its `__init__`, and its `librnnoise.so` is called
through ctypes. RNNoise works on 10 ms frames at 48 kHz, so the 16 kHz stream is resampled up by
3 and back down (soxr, streaming), which adds soxr's delay of a few milliseconds.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import StreamResampler

RATE = 48000
FRAME = 480
"""RNNoise's frame: 10 ms at 48 kHz."""


def library() -> Path | None:
    """The `librnnoise.so` of an installed `pyrnnoise`, or None."""
    spec = importlib.util.find_spec("pyrnnoise")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "librnnoise.so"
        if path.is_file():
            return path
    return None


class RNNoise:
    """One stream's suppressor: 16 kHz float blocks in, the same blocks denoised out (as many samples,
    a few milliseconds late)."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        lib.rnnoise_create.argtypes = [ctypes.c_void_p]
        lib.rnnoise_create.restype = ctypes.c_void_p
        lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
        lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                              ctypes.POINTER(ctypes.c_float)]
        lib.rnnoise_process_frame.restype = ctypes.c_float
        if lib.rnnoise_get_frame_size() != FRAME:
            raise RuntimeError(f"{path}: RNNoise frame is not {FRAME} samples")
        self._lib = lib
        self._state = lib.rnnoise_create(None)
        self._up = StreamResampler(16000, RATE)
        self._down = StreamResampler(RATE, 16000)
        self._pending = np.zeros(0, dtype=np.float32)
        self._out = np.zeros(0, dtype=np.float32)

    def process(self, block: Samples) -> Samples:
        data = np.concatenate([self._pending, self._up.push(block) * np.float32(32768)])
        usable = data.size - data.size % FRAME
        self._pending = data[usable:]
        frames = np.ascontiguousarray(data[:usable], dtype=np.float32)
        pointer = ctypes.POINTER(ctypes.c_float)
        for start in range(0, usable, FRAME):
            frame = frames[start:start + FRAME]
            address = frame.ctypes.data_as(pointer)
            self._lib.rnnoise_process_frame(self._state, address, address)
        self._out = np.concatenate([self._out, self._down.push(frames / np.float32(32768))])
        if self._out.size < block.size:  # the resamplers' and the frames' delay, at the start only
            self._out = np.concatenate([np.zeros(block.size - self._out.size, dtype=np.float32), self._out])
        out, self._out = self._out[:block.size], self._out[block.size:]
        return out.astype(np.float32)

    def stream(self, blocks: Iterable[Samples]) -> Iterator[Samples]:
        for block in blocks:
            yield self.process(block)

    def close(self) -> None:
        if self._state:
            self._lib.rnnoise_destroy(self._state)
            self._state = None
