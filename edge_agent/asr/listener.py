"""Listening: audio source -> VAD segmenter -> Whisper, one transcript per utterance as it ends.

`Transcriber` turns one `Utterance` into a `Transcript` (or None when Whisper
hears no speech in it). `Listener` runs the whole chain over a source in one
worker thread: the VAD costs microseconds a frame, so while Whisper works on
one utterance the source's own queue (the sound card's) holds the audio that
keeps coming, and nothing runs ahead of the transcripts it produces.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType

from edge_agent.asr.whisper import Padding, WhisperOnnx
from edge_agent.audio.sources import AudioSource
from edge_agent.config import AsrSettings, Settings
from edge_agent.models.store import ModelStore
from edge_agent.vad.segmenter import Segmenter, Utterance

log = logging.getLogger(__name__)

LOGPROB_THRESHOLD = -1.0
"""With a high no-speech probability, tokens less sure than this mean 'nothing was said'."""


@dataclass(frozen=True)
class Transcript:
    """One recognised utterance."""

    text: str
    start: float
    """Seconds from the start of the stream to the start of the speech."""
    end: float
    """Seconds from the start of the stream to the end of the speech."""
    tokens: tuple[int, ...] = ()
    no_speech_prob: float = 0.0
    avg_logprob: float = 0.0
    asr_s: float = 0.0
    """Seconds Whisper took (features, encoder, decoder)."""
    latency_s: float = 0.0
    """End of speech -> transcript for real-time input: the VAD's hangover plus `asr_s`."""
    cut: bool = False
    """The speech went on past `vad.max_utterance_s` and continues in the next transcript."""

    def to_json(self) -> dict[str, object]:
        return {"text": self.text, "start": round(self.start, 3), "end": round(self.end, 3)}


class Transcriber:
    """Whisper over VAD utterances, dropping the ones it judges to hold no speech."""

    def __init__(self, model: WhisperOnnx, settings: AsrSettings) -> None:
        self.model = model
        self.settings = settings
        self.padding = Padding.from_settings(settings)
        self.dropped = 0

    def __call__(self, utterance: Utterance) -> Transcript | None:
        s = self.settings
        result = self.model.recognize(utterance.samples, self.padding, max_tokens=s.max_tokens,
                                      language=s.language)
        silent = result.no_speech_prob > s.no_speech_threshold and result.avg_logprob < LOGPROB_THRESHOLD
        if silent or result.avg_logprob < s.min_avg_logprob or not result.text:
            self.dropped += 1
            log.debug("dropped %.2f-%.2f s: no speech (p=%.2f, logprob %.2f, text %r)", utterance.start,
                      utterance.end, result.no_speech_prob, result.avg_logprob, result.text)
            return None
        asr_s = result.timings.total
        return Transcript(
            text=result.text, start=utterance.start, end=utterance.end, tokens=result.tokens,
            no_speech_prob=result.no_speech_prob, avg_logprob=result.avg_logprob, asr_s=asr_s,
            latency_s=(utterance.ended_at - utterance.end) + asr_s, cut=utterance.cut,
        )


@dataclass
class ListenerStats:
    """Counts since the listener started."""

    audio_s: float = 0.0
    utterances: int = 0
    transcripts: int = 0
    latencies: list[float] = field(default_factory=list)


class Listener:
    """Transcripts of everything said on `source`, each delivered as its utterance ends.

    Three ways to consume it, pick one per listener:

    - iterate in the caller's thread: ``for t in listener: ...`` (ends with the
      source; errors such as a truncated file are raised from the loop);
    - callbacks from a worker thread: ``listener.start(on_transcript, on_error)``,
      later ``listener.stop()`` (also a context manager: ``with listener.start(cb): ...``);
    - asyncio: ``async for t in listener.stream(): ...`` (the blocking work stays in
      the worker thread; leaving the loop stops the listener).

    Each `Transcript` carries `text`, `start` and `end` in seconds of stream time.
    `stop()` closes the source, so a live microphone is released at once.
    """

    def __init__(self, source: AudioSource, segmenter: Segmenter, transcriber: Transcriber) -> None:
        self.source = source
        self.segmenter = segmenter
        self.transcriber = transcriber
        self.stats = ListenerStats()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- synchronous -------------------------------------------------------------

    def __iter__(self) -> Iterator[Transcript]:
        try:
            for block in self.source.blocks():
                if self._stopping.is_set():
                    return
                self.stats.audio_s += block.size / self.source.sample_rate
                for utterance in self.segmenter.push(block):
                    transcript = self._transcribe(utterance)
                    if transcript is not None:
                        yield transcript
            if self._stopping.is_set():
                return
            for utterance in self.segmenter.flush():
                transcript = self._transcribe(utterance)
                if transcript is not None:
                    yield transcript
        finally:
            self.source.close()

    def _transcribe(self, utterance: Utterance) -> Transcript | None:
        self.stats.utterances += 1
        transcript = self.transcriber(utterance)
        if transcript is not None:
            self.stats.transcripts += 1
            self.stats.latencies.append(transcript.latency_s)
            log.info("heard %.2f-%.2f s in %.3f s: %s", transcript.start, transcript.end,
                     transcript.asr_s, transcript.text)
        return transcript

    # -- worker thread -------------------------------------------------------------

    def start(self, on_transcript: Callable[[Transcript], None],
              on_error: Callable[[BaseException], None] | None = None,
              on_end: Callable[[], None] | None = None) -> Listener:
        """Listen in a worker thread, calling `on_transcript` from it for each transcript."""
        if self._thread is not None:
            raise RuntimeError("this listener has already been started")

        def work() -> None:
            try:
                for transcript in self:
                    on_transcript(transcript)
            except BaseException as exc:
                if self._stopping.is_set():  # closing the source under a read is how stop() works
                    log.debug("listener stopped while reading: %s", exc)
                elif on_error is None:
                    log.exception("listener failed")
                else:
                    on_error(exc)
            finally:
                if on_end is not None:
                    on_end()

        self._thread = threading.Thread(target=work, name="listener", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening: close the source and wait for the worker (and its current utterance)."""
        self._stopping.set()
        self.source.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("listener still busy %.0f s after stop", timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- asyncio ---------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[Transcript]:
        """Transcripts as an async iterator; the listener's work runs in its worker thread."""
        loop = asyncio.get_running_loop()
        # Unbounded on purpose: transcripts arrive at the pace of speech, a few a minute.
        items: asyncio.Queue[Transcript | BaseException | None] = asyncio.Queue()

        def post(item: Transcript | BaseException | None) -> None:
            # RuntimeError: the loop closed under us, so nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(items.put_nowait, item)

        self.start(post, on_error=post, on_end=lambda: post(None))
        try:
            while True:
                item = await items.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            await asyncio.to_thread(self.stop)


def build_listener(settings: Settings, store: ModelStore, source: AudioSource | None = None) -> Listener:
    """A listener as configured: `source` (default: the microphone `audio.input_device`), VAD, Whisper.

    Models load first, so a missing export fails before the microphone is opened.
    """
    from edge_agent.audio.sources import SoundDeviceSource
    from edge_agent.vad import make_segmenter

    segmenter = make_segmenter(settings.vad, store)
    from edge_agent.providers import for_use

    model = WhisperOnnx.from_settings(settings.asr, settings.models, for_use(settings, "asr"))
    if source is None:
        source = SoundDeviceSource(settings.audio.input_device)
    return Listener(source, segmenter, Transcriber(model, settings.asr))
