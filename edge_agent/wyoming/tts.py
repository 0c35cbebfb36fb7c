"""Wyoming text to speech: `synthesize`, and text streamed in with `synthesize-start/chunk/stop`.

Plain `synthesize`: one `audio-start`, the chunks as the voice makes them, one
`audio-stop`. Streamed text (an LLM's answer as it is written) is spoken a
sentence at a time: as soon as a chunk completes one or more sentences, they are
synthesized and sent as their own `audio-start` .. `audio-stop`; `synthesize-stop`
speaks the rest and ends with `synthesize-stopped`. A `synthesize` arriving inside
a stream is the copy Home Assistant sends for older servers, and is ignored.

Synthesis goes through the daemon's synthesizer (the offload router: the server's
voice when it is healthy, the local voice otherwise, each sentence once). Its
blocking generator runs in worker threads, one chunk per hop, so the event loop
keeps serving other connections and a client that leaves stops the synthesis.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from wyoming.event import Event
from wyoming.info import Attribution, TtsProgram, TtsVoice
from wyoming.tts import Synthesize, SynthesizeStart, SynthesizeStopped

from edge_agent import __version__
from edge_agent.audio.frames import AudioChunk, Samples
from edge_agent.audio.resample import resample
from edge_agent.tts.sentences import split_complete
from edge_agent.tts.voice import Synthesizer
from edge_agent.wyoming.audio import Refused, chunk_events, start_event
from edge_agent.wyoming.settings import WyomingSettings

log = logging.getLogger(__name__)

Send = Callable[[Event], Awaitable[None]]

ATTRIBUTION = Attribution(name="edge-speech", url="https://github.com/edge-speech/edge-speech")
STREAM_EVENTS = frozenset({"synthesize-start", "synthesize-chunk", "synthesize-stop"})
EVENTS = frozenset({"synthesize", *STREAM_EVENTS})


@dataclass(frozen=True)
class OfferedVoice:
    """A voice listed in `info`."""

    id: str
    description: str
    languages: tuple[str, ...]


def offered_voices(synth: Synthesizer, local: str, remote: str) -> list[OfferedVoice]:
    """The `local` voice, and the synthesis server's voice (`remote`, empty for none) while it is
    configured and reachable."""
    voices = [OfferedVoice(local, "on this device", ("en_US",))]
    if remote and remote != local and any(
            o.id == remote and o.engine == "remote" and o.reachable for o in synth.offers()):
        voices.append(OfferedVoice(remote, "on a synthesis server (falls back to this device)", ("en_US",)))
    return voices


def program(voices: list[OfferedVoice]) -> TtsProgram:
    return TtsProgram(
        name="edge-speech", description="edge-speech text to speech", attribution=ATTRIBUTION,
        installed=True, version=__version__, supports_synthesize_streaming=True,
        voices=[TtsVoice(name=v.id, description=v.description, attribution=ATTRIBUTION, installed=True,
                         version=None, languages=list(v.languages)) for v in voices],
    )


class TtsService:
    """What every connection's TTS session shares: the synthesizer (read once per request) and limits."""

    def __init__(self, synth: Callable[[], Synthesizer], settings: WyomingSettings, local_voice: str,
                 remote_voice: str = "") -> None:
        self.synth = synth
        self.settings = settings
        self.local_voice = local_voice
        """`tts.voice`, the device's own."""
        self.remote_voice = remote_voice
        """`offload.voice`, offered while a synthesis server has it (empty: none)."""

    def voices(self) -> list[OfferedVoice]:
        return offered_voices(self.synth(), self.local_voice, self.remote_voice)

    def session(self, send: Send) -> TtsSession:
        return TtsSession(self, send)


class TtsSession:
    """The TTS state of one connection."""

    def __init__(self, service: TtsService, send: Send) -> None:
        self.service = service
        self.send = send
        self._stream: _TextStream | None = None

    async def handle(self, event: Event) -> None:
        """Carry out one TTS event (`EVENTS`); a bad request raises `Refused`."""
        if event.type == "synthesize":
            if self._stream is not None:
                return  # the compatibility copy of a streamed text
            request = _parse(Synthesize.from_event, event)
            await self._speak(_text(request.text, self._limit), _voice_name(request.voice), self._budget())
            return
        if event.type == "synthesize-start":
            start = _parse(SynthesizeStart.from_event, event)
            self._stream = _TextStream(_voice_name(start.voice), self._limit, self._budget())
            return
        stream = self._stream
        if stream is None:
            raise Refused(f"{event.type} without synthesize-start", "no-stream")
        if event.type == "synthesize-chunk":
            text = event.data.get("text")
            if not isinstance(text, str):
                raise Refused("synthesize-chunk needs 'text' (a string)", "bad-request")
            complete = stream.push(text)
            if complete:
                await self._speak(complete, stream.voice, stream.budget)
            return
        self._stream = None  # synthesize-stop
        rest = stream.finish()
        if rest:
            await self._speak(rest, stream.voice, stream.budget)
        await self.send(SynthesizeStopped().event())

    @property
    def streaming(self) -> bool:
        """A streamed text is open (`synthesize-start` without its `synthesize-stop` yet)."""
        return self._stream is not None

    @property
    def _limit(self) -> int:
        return self.service.settings.max_text_chars

    def _budget(self) -> SpeechBudget:
        return SpeechBudget(self.service.settings.max_speech_s)

    async def _speak(self, text: str, voice: str | None, budget: SpeechBudget) -> None:
        """Synthesize `text` and send it as one audio stream, cut where `budget` runs out."""
        known = {v.id for v in self.service.voices()}
        if voice is not None and voice not in known:
            raise Refused(f"unknown voice {voice!r} (known: {', '.join(sorted(known))})", "unknown-voice")
        synth = self.service.synth()
        per_chunk = self.service.settings.samples_per_chunk
        chunks = _Chunks(synth.stream(text, voice))
        rate = 0
        try:
            while not budget.spent and (chunk := await chunks.next()) is not None:
                if not rate:
                    rate = chunk.sample_rate
                    await self.send(start_event(rate))
                samples = chunk.samples
                if chunk.sample_rate != rate:  # an engine switch mid-text keeps the stream's rate
                    samples = resample(samples, chunk.sample_rate, rate)
                samples = budget.take(samples, rate)
                for out in chunk_events(samples, rate, per_chunk):
                    await self.send(out)
        finally:
            await asyncio.to_thread(chunks.close)
        if not rate:  # nothing to say (only punctuation): still a well-formed, empty stream
            await self.send(start_event(synth.sample_rate(voice)))
        await self.send(Event(type="audio-stop", data={"timestamp": None}))


class SpeechBudget:
    """Seconds of audio one request may still be given (`wyoming.max_speech_s`).

    Closing the generator at the cut stops the synthesis too, so the cost is bounded by audio
    made, not by how much text the limit on characters let in."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.left_s = seconds
        self.spent = False

    def take(self, samples: Samples, rate: int) -> Samples:
        """The part of `samples` the budget still covers; the first cut is logged once."""
        fits = max(0, int(self.left_s * rate))
        self.left_s -= samples.size / rate
        if samples.size <= fits:
            return samples
        if not self.spent:
            log.warning("speech cut after %g s of audio (wyoming.max_speech_s)", self.seconds)
        self.spent = True
        return samples[:fits]


class _TextStream:
    """Text arriving in pieces, released a complete sentence at a time (bounded in length)."""

    def __init__(self, voice: str | None, limit: int, budget: SpeechBudget) -> None:
        self.voice = voice
        self.limit = limit
        self.budget = budget
        self.received = 0
        self.pending = ""

    def push(self, text: str) -> str:
        self.received += len(text)
        if self.received > self.limit:
            raise Refused(f"streamed text longer than {self.limit} characters", "text-too-long")
        complete, self.pending = split_complete(self.pending + text)
        return complete

    def finish(self) -> str:
        rest, self.pending = self.pending.strip(), ""
        return rest


T = TypeVar("T")


def _parse(parse: Callable[[Event], T], event: Event) -> T:
    try:
        return parse(event)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise Refused(f"malformed {event.type} event", "bad-request") from None


def _text(text: object, limit: int) -> str:
    if not isinstance(text, str):
        raise Refused("synthesize needs 'text' (a string)", "bad-request")
    if len(text) > limit:
        raise Refused(f"text has {len(text)} characters, the limit is {limit}", "text-too-long")
    return text


def _voice_name(voice: object) -> str | None:
    name = getattr(voice, "name", None)
    if name is not None and not isinstance(name, str):
        raise Refused("voice name must be a string", "bad-request")
    return name


class _Chunks:
    """A voice's blocking chunk generator, advanced and closed from worker threads one hop at a time.

    The lock makes `close` wait for a `next` still running: a request cancelled mid-chunk (the
    server stopping, the client gone) would otherwise close a generator that is executing, which
    raises ValueError instead of stopping the synthesis."""

    def __init__(self, chunks: Iterable[AudioChunk]) -> None:
        self._chunks = iter(chunks)
        self._lock = threading.Lock()

    async def next(self) -> AudioChunk | None:
        """The next chunk, made in a worker thread; a failing voice is a refusal the client is told of."""
        try:
            return await asyncio.to_thread(self._next)
        except Exception as exc:
            log.error("synthesis failed: %s", exc)
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise Refused(f"synthesis failed: {text}", "synthesis-failed") from exc

    def _next(self) -> AudioChunk | None:
        with self._lock:
            return next(self._chunks, None)

    def close(self) -> None:
        """Stop the synthesis (blocking: call it from a worker thread)."""
        with self._lock:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
