"""Frame classifiers: is this 10-32 ms of 16 kHz audio speech?

`WebRtcClassifier` is webrtcvad's GMM (about 3 µs a frame, no model file);
`SileroClassifier` runs the Silero VAD ONNX model (about 0.1 ms a 32 ms frame,
more robust to noise and music). Both see the same stream of float32 frames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.wav import to_pcm16
from edge_agent.errors import ModelError
from edge_agent.runtime.sessions import make_session

SAMPLE_RATE = 16000


class FrameClassifier(Protocol):
    """Decides, frame by frame, whether a stream is speech."""

    frame_samples: int
    """Samples per frame at 16 kHz."""

    def is_speech(self, frame: Samples) -> bool:
        """Classify the next frame of the stream (exactly `frame_samples` samples)."""
        ...

    def reset(self) -> None:
        """Forget the stream so far (a new stream follows)."""
        ...


class WebRtcClassifier:
    """webrtcvad (from the `webrtcvad-wheels` distribution) at a fixed aggressiveness."""

    def __init__(self, aggressiveness: int = 2, frame_ms: int = 30) -> None:
        if frame_ms not in (10, 20, 30):
            raise ValueError(f"webrtcvad frames are 10, 20 or 30 ms, not {frame_ms}")
        import webrtcvad

        self.aggressiveness = aggressiveness
        self.frame_samples = SAMPLE_RATE * frame_ms // 1000
        self._vad = webrtcvad.Vad(aggressiveness)

    def is_speech(self, frame: Samples) -> bool:
        return bool(self._vad.is_speech(to_pcm16(frame), SAMPLE_RATE))

    def reset(self) -> None:
        import webrtcvad

        self._vad = webrtcvad.Vad(self.aggressiveness)


class SileroClassifier:
    """Silero VAD v5/v6 ONNX: 512-sample frames, each seen with the 64 samples before it."""

    frame_samples = 512
    _CONTEXT = 64

    def __init__(self, session: Any, threshold: float = 0.5) -> None:
        self.threshold = threshold
        self._session = session
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        self.last_probability = 0.0
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(self._CONTEXT, dtype=np.float32)

    @staticmethod
    def load(path: Path, threshold: float = 0.5) -> SileroClassifier:
        """Load the model in one thread (it is tiny; a second thread only adds overhead)."""
        session = make_session(path, threads=1, spin=False)
        names = {i.name for i in session.get_inputs()}
        if names != {"input", "state", "sr"}:
            raise ModelError(f"{path}: not a Silero VAD v5+ model (inputs {sorted(names)})")
        return SileroClassifier(session, threshold)

    def probability(self, frame: Samples) -> float:
        """Speech probability of the next frame."""
        x = np.concatenate([self._context, frame.astype(np.float32, copy=False)])[None, :]
        out, self._state = self._session.run(None, {"input": x, "state": self._state, "sr": self._sr})
        self._context = x[0, -self._CONTEXT:]
        self.last_probability = float(out.reshape(-1)[0])
        return self.last_probability

    def is_speech(self, frame: Samples) -> bool:
        return self.probability(frame) >= self.threshold

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(self._CONTEXT, dtype=np.float32)
