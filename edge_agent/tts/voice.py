"""What every voice offers: sentences in, audio chunks out."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edge_agent.audio.frames import AudioChunk, Samples


class Voice(Protocol):
    """A loaded voice."""

    id: str
    sample_rate: int

    def sentences(self, text: str) -> list[str]:
        """Normalise `text` and split it the way this voice synthesizes it."""
        ...

    def synthesize_sentence(self, sentence: str) -> Iterator[Samples]:
        """Audio for one sentence, possibly in several chunks."""
        ...

    def sessions(self) -> dict[str, Any]:
        """Its onnxruntime sessions by part (`doctor` shows the providers each runs on)."""
        ...

    def close(self) -> None:
        """Release the model."""
        ...


@dataclass(frozen=True)
class VoiceOffer:
    """A voice a synthesizer offers, the engine that has it, and whether that engine can speak now."""

    id: str
    engine: str
    """`local` (this process) or `remote` (a synthesis server), as `AudioChunk.engine` says."""
    reachable: bool
    """It can speak with this voice now: a local voice always; a server's while a connected server
    offers it and is not shut out by its circuit breaker."""


class Synthesizer(Protocol):
    """Text in, a stream of chunks out, whichever engine does the work."""

    def stream(self, text: str, voice: str | None = None) -> Iterator[AudioChunk]:
        """Chunks of `text` spoken by `voice` (None: the configured default)."""
        ...

    def sample_rate(self, voice: str | None = None) -> int:
        """The rate `stream` speaks `voice` at when it speaks locally (an empty text still has one)."""
        ...

    def offers(self) -> list[VoiceOffer]:
        """The voices on offer, each with whether it is reachable now; asking costs nothing (no
        connection, no probe a circuit breaker would count)."""
        ...

    def unload_idle(self) -> list[str]:
        """Free voices unused for `tts.idle_unload_s`; the ids freed."""
        ...

    def close(self) -> None:
        """Release what it holds (models, connections); called once, when nothing streams from it."""
        ...


@runtime_checkable
class StreamingVoice(Voice, Protocol):
    """A voice that plans a whole text's work at once (windows, look-ahead)."""

    def stream(self, sentences: list[str]) -> Iterator[tuple[int, Samples, bool]]:
        """`(sentence index, samples, last of its sentence)`; one `last` per sentence."""
        ...


def by_sentence(voice: Voice, sentences: list[str]) -> Iterator[tuple[int, Samples, bool]]:
    """`StreamingVoice.stream` for any voice: one sentence after the other."""
    for index, sentence in enumerate(sentences):
        pending: Samples = np.zeros(0, dtype=np.float32)
        for n, samples in enumerate(voice.synthesize_sentence(sentence)):
            if n:
                yield index, pending, False
            pending = samples
        yield index, pending, True


def synthesize(voice: Voice, text: str, silence_s: float = 0.0) -> Iterator[AudioChunk]:
    """Stream `text` sentence by sentence; `silence_s` of silence closes each sentence."""
    return synthesize_sentences(voice, voice.sentences(text), silence_s)


def synthesize_sentences(voice: Voice, sentences: list[str], silence_s: float = 0.0,
                         start: int = 0) -> Iterator[AudioChunk]:
    """Like `synthesize`, for sentences `start..` of an already split text (indices kept)."""
    gap = np.zeros(round(silence_s * voice.sample_rate), dtype=np.float32)
    todo = sentences[start:]
    pieces = voice.stream(todo) if isinstance(voice, StreamingVoice) else by_sentence(voice, todo)
    for index, samples, last in pieces:
        if last:
            yield AudioChunk(np.concatenate([samples, gap]) if gap.size else samples,
                             voice.sample_rate, start + index, last=True)
        elif samples.size:
            yield AudioChunk(samples, voice.sample_rate, start + index, last=False)
