"""The configured VAD: its frame classifier (webrtcvad, or Silero's ONNX model from the store) and
the segmenter over it."""

from __future__ import annotations

from edge_agent.errors import ModelError
from edge_agent.models.store import ModelStore
from edge_agent.vad.classifiers import FrameClassifier, SileroClassifier, WebRtcClassifier
from edge_agent.vad.segmenter import Segmenter
from edge_agent.vad.settings import VadSettings

SILERO_MODEL = "silero-vad"
"""Catalog id of the Silero VAD ONNX model."""

def make_classifier(settings: VadSettings, store: ModelStore) -> FrameClassifier:
    """The configured engine; Silero's model comes from the store (never from `silero_vad`)."""
    if settings.engine == "silero":
        files = store.locate(SILERO_MODEL)
        if files is None:
            raise ModelError(f"vad.engine is silero and its model is not present: run `edge-agent models "
                             f"fetch {SILERO_MODEL}` (2.3 MB), or set vad.engine: webrtc")
        return SileroClassifier.load(files.path("silero_vad.onnx"), settings.silero_threshold)
    return WebRtcClassifier(settings.aggressiveness, settings.frame_ms)


def make_segmenter(settings: VadSettings, store: ModelStore) -> Segmenter:
    return Segmenter(make_classifier(settings, store), settings)
