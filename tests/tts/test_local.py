"""The local synthesizer's side of the `Synthesizer` interface that needs no model loaded."""

from __future__ import annotations

from pathlib import Path

from edge_agent.config import TtsSettings
from edge_agent.models import ModelStore, load_catalog
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import VoiceOffer


def test_the_local_synthesizer_offers_its_configured_voice_as_reachable_without_loading_it(tmp_path: Path):
    settings = TtsSettings(voice="en_US-joe-medium")
    registry = VoiceRegistry(ModelStore(tmp_path, load_catalog()), settings)
    synth = LocalSynthesizer(registry, settings)
    assert synth.offers() == [VoiceOffer("en_US-joe-medium", "local", True)]
    assert registry.loaded() == []
