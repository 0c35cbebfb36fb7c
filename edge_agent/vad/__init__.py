"""Voice activity detection: frame classifiers (webrtcvad, Silero), the utterance segmenter and
the configured pair (`factory`). The names below load on first use (`edge_agent.lazy`: `config`
reads `vad.settings`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_agent.lazy import exports

if TYPE_CHECKING:
    from edge_agent.vad.classifiers import FrameClassifier, SileroClassifier, WebRtcClassifier
    from edge_agent.vad.factory import SILERO_MODEL, make_classifier, make_segmenter
    from edge_agent.vad.segmenter import Segmenter, SegmenterStats, Utterance

__all__ = ["SILERO_MODEL", "FrameClassifier", "Segmenter", "SegmenterStats", "SileroClassifier", "Utterance",
           "WebRtcClassifier", "make_classifier", "make_segmenter"]

__getattr__ = exports(__name__, {
    "FrameClassifier": "classifiers", "SileroClassifier": "classifiers", "WebRtcClassifier": "classifiers",
    "Segmenter": "segmenter", "SegmenterStats": "segmenter", "Utterance": "segmenter",
    "SILERO_MODEL": "factory", "make_classifier": "factory", "make_segmenter": "factory",
})
