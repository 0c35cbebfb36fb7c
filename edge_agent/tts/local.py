"""The local synthesizer: voices from the registry, in this process."""

from __future__ import annotations

from collections.abc import Iterator

from edge_agent.audio.frames import AudioChunk
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.settings import TtsSettings
from edge_agent.tts.voice import VoiceOffer, synthesize


class LocalSynthesizer:
    """`Synthesizer` backed by a `VoiceRegistry`."""

    def __init__(self, voices: VoiceRegistry, settings: TtsSettings) -> None:
        self.voices = voices
        self.settings = settings

    def sample_rate(self, voice: str | None = None) -> int:
        return self.voices.get(voice or self.settings.voice).sample_rate

    def offers(self) -> list[VoiceOffer]:
        """The configured voice: the one this synthesizer speaks when asked for none."""
        return [VoiceOffer(self.settings.voice, "local", True)]

    def unload_idle(self) -> list[str]:
        """Free voices unused for `tts.idle_unload_s`."""
        return self.voices.unload_idle()

    def stream(self, text: str, voice: str | None = None) -> Iterator[AudioChunk]:
        loaded = self.voices.get(voice or self.settings.voice)
        return synthesize(loaded, text, self.settings.sentence_silence_s)

    def close(self) -> None:
        """Unload every voice of the registry (it is this synthesizer's own)."""
        self.voices.close()
