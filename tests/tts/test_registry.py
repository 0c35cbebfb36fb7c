import pytest

from edge_agent.config import TtsSettings
from edge_agent.errors import ModelError
from edge_agent.models import ModelStore, load_catalog
from edge_agent.tts.registry import VoiceRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    return ModelStore(tmp_path / "cache", load_catalog())


def test_voice_is_loaded_once_and_unloaded_when_idle(store):
    clock = Clock()
    registry = VoiceRegistry(store, TtsSettings(idle_unload_s=60), clock=clock)
    voice = registry.get("en_US-joe-medium")
    assert registry.get("en_US-joe-medium") is voice
    clock.now = 59
    assert registry.unload_idle() == []
    clock.now = 120
    assert registry.unload_idle() == ["en_US-joe-medium"]
    assert registry.loaded() == []
    assert registry.get("en_US-joe-medium") is not voice


def test_zero_idle_time_keeps_voices_loaded(store):
    clock = Clock()
    registry = VoiceRegistry(store, TtsSettings(idle_unload_s=0), clock=clock)
    registry.get("en_US-joe-medium")
    clock.now = 1e9
    assert registry.unload_idle() == []


def test_noise_settings_reach_the_voice_and_default_to_its_own(store):
    noisy = VoiceRegistry(store, TtsSettings()).get("en_US-joe-medium")
    quiet = VoiceRegistry(store, TtsSettings(noise_scale=0.0, noise_w=0.0)).get("en_US-joe-medium")
    assert not noisy.noiseless and quiet.noiseless
    noisy.close()
    quiet.close()


def test_non_voice_and_unavailable_runtime_are_model_errors(store):
    registry = VoiceRegistry(store, TtsSettings())
    with pytest.raises(ModelError, match="is a vad model, not a voice"):
        registry.get("silero-vad")
    with pytest.raises(ModelError, match="needs the 'kokoro' runtime"):
        registry.get("kokoro-82m")
    with pytest.raises(ModelError, match="unknown model"):
        registry.get("nope")
