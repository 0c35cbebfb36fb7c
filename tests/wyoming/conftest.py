"""The models a Wyoming server serves in these tests: our voice and our Whisper export, once a session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.speech_fixtures import *  # noqa: F403


@pytest.fixture(scope="session")
def local_synth(shared_cache: Path) -> Iterator[Any]:
    from edge_agent.config import TtsSettings
    from edge_agent.models import ModelStore, load_catalog
    from edge_agent.tts.local import LocalSynthesizer
    from edge_agent.tts.registry import VoiceRegistry

    # The voice's noise off: every take of a text is the same samples, so what Whisper hears of it
    # (the tests' check that it was spoken) does not change from run to run.
    settings = TtsSettings(threads=2, noise_scale=0.0, noise_w=0.0)
    synth = LocalSynthesizer(VoiceRegistry(ModelStore(shared_cache, load_catalog()), settings), settings)
    yield synth
    synth.close()


@pytest.fixture(scope="session")
def transcriber(whisper: Any) -> Any:
    from edge_agent.asr.transcriber import Transcriber
    from edge_agent.config import AsrSettings

    return Transcriber(whisper, AsrSettings())
