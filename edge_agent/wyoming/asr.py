"""Wyoming speech to text: `transcribe`, `audio-start`, `audio-chunk`..., `audio-stop` -> `transcript`.

The client has already cut the command out (Home Assistant runs its own VAD), so
the whole recording is one utterance for Whisper, through the same `Transcriber`
as the listener: the same padding, the same no-speech judgement (an empty text
when it heard nothing). One model serves every connection, one request at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import numpy as np
from wyoming.asr import Transcript
from wyoming.event import Event
from wyoming.info import AsrModel, AsrProgram

from edge_agent import __version__
from edge_agent.asr.transcriber import Transcriber
from edge_agent.audio.frames import Samples
from edge_agent.audio.sources import TARGET_RATE
from edge_agent.vad.segmenter import Utterance
from edge_agent.wyoming.audio import Recording, Refused
from edge_agent.wyoming.settings import WyomingSettings
from edge_agent.wyoming.tts import ATTRIBUTION

log = logging.getLogger(__name__)

LEAD_IN_S = 0.3
"""Silence put before the client's audio. A client's VAD may cut a command at its first sample
(the listener's VAD keeps a pre-roll); Whisper mishears a word that starts the window there
(tiny.en, fp32 and int4: "Pern on the kitchen lights." with none, "Turn on ..." with 0.3 s)."""

Send = Callable[[Event], Awaitable[None]]


def program(model_id: str, languages: list[str]) -> AsrProgram:
    return AsrProgram(
        name="edge-speech", description="edge-speech speech to text (Whisper on onnxruntime)",
        attribution=ATTRIBUTION, installed=True, version=__version__,
        models=[AsrModel(name=model_id, description=f"{model_id} exported to ONNX",
                         attribution=ATTRIBUTION, installed=True, version=None, languages=languages)],
    )


class AsrService:
    """The recogniser every connection shares, one request at a time."""

    def __init__(self, transcriber: Transcriber, settings: WyomingSettings) -> None:
        self.transcriber = transcriber
        self.settings = settings
        self._lock = asyncio.Lock()
        asr = transcriber.settings
        self.languages = ([asr.language] if transcriber.model.manifest.multilingual else ["en"])

    def program(self) -> AsrProgram:
        return program(self.transcriber.settings.model, self.languages)

    def session(self, send: Send) -> AsrSession:
        return AsrSession(self, send)

    async def transcribe(self, audio: Samples) -> str:
        audio = np.concatenate([np.zeros(round(LEAD_IN_S * TARGET_RATE), dtype=np.float32), audio])
        seconds = audio.size / TARGET_RATE
        utterance = Utterance(samples=audio, start=0.0, end=seconds, audio_start=0.0, ended_at=seconds,
                              speech_ms=round(seconds * 1000))
        async with self._lock:
            result = await asyncio.to_thread(self.transcriber, utterance)
        return result.text if result is not None else ""


class AsrSession:
    """The ASR state of one connection: the recording in progress."""

    def __init__(self, service: AsrService, send: Send) -> None:
        self.service = service
        self.send = send
        self._recording: Recording | None = None
        self._language: str | None = None

    @property
    def streaming(self) -> bool:
        """An audio stream is open (`audio-start` without its `audio-stop` yet)."""
        return self._recording is not None

    def transcribe(self, event: Event) -> None:
        language = event.data.get("language")
        if language is not None and not isinstance(language, str):
            raise Refused("transcribe 'language' must be a string", "bad-request")
        if language and language.split("-")[0].split("_")[0] not in self.service.languages:
            raise Refused(f"language {language!r} is not one this model knows "
                          f"({', '.join(self.service.languages)})", "unsupported-language")
        self._language = language

    async def audio_start(self, event: Event) -> None:
        self._recording = Recording.begin(event, self.service.settings.max_audio_s)

    async def audio_chunk(self, event: Event) -> None:
        if self._recording is None:
            raise Refused("audio-chunk before audio-start", "no-audio-start")
        try:
            self._recording.push(event)
        except Refused:
            self._recording = None
            raise

    async def audio_stop(self) -> None:
        recording, self._recording = self._recording, None
        if recording is None:
            raise Refused("audio-stop before audio-start", "no-audio-start")
        audio = recording.finish()
        started = time.perf_counter()
        text = await self.service.transcribe(audio) if audio.size else ""
        log.info("transcribed %.2f s of audio in %.3f s: %s", audio.size / TARGET_RATE,
                 time.perf_counter() - started, text)
        language = self._language or self.service.languages[0]
        await self.send(Transcript(text=text, language=language).event())
