"""Listening: audio source -> VAD segmenter -> Whisper, one transcript per utterance as it ends.

`Transcriber` turns one `Utterance` into a `Transcript` (or None when Whisper
hears no speech in it); `Transcribing` is that as a push/flush stage, and
`TranscribingLoop` pumps a source through it in one worker thread (`audio.pump`): the
VAD costs microseconds a frame, so while Whisper works on one utterance the
source's own queue (the sound card's) holds the audio that keeps coming.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from edge_agent.asr.settings import AsrSettings
from edge_agent.asr.whisper import Padding, WhisperOnnx
from edge_agent.audio.frames import Samples
from edge_agent.audio.pump import Pump
from edge_agent.audio.sources import AudioSource, open_source
from edge_agent.config import Settings
from edge_agent.models.store import ModelStore
from edge_agent.providers import for_use
from edge_agent.vad import make_segmenter
from edge_agent.vad.classifiers import SAMPLE_RATE
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
    """End of speech -> transcript for real-time input: the VAD's hangover plus `asr_s` (in a
    turn Whisper may run during the hangover: then the later of the two, `listen.hearing`)."""
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
                                      language=s.language, beam_size=s.beam_size)
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
class TranscribingStats:
    """Counts since the listener started."""

    audio_s: float = 0.0
    utterances: int = 0
    transcripts: int = 0
    latencies: list[float] = field(default_factory=list)


class Transcribing:
    """The push/flush stage of a listener: VAD utterances in, transcripts out."""

    def __init__(self, segmenter: Segmenter, transcriber: Transcriber) -> None:
        self.segmenter = segmenter
        self.transcriber = transcriber
        self.stats = TranscribingStats()

    def push(self, block: Samples) -> list[Transcript]:
        return self._transcribe_all(self.segment(block))

    def segment(self, block: Samples) -> list[Utterance]:
        """The utterances that ended in `block`, not yet transcribed (a caller that already
        decoded one, `listen.hearing`'s speculative decode, transcribes the rest itself)."""
        self.stats.audio_s += block.size / SAMPLE_RATE
        return self.segmenter.push(block)

    def flush(self) -> list[Transcript]:
        return self._transcribe_all(self.segmenter.flush())

    def _transcribe_all(self, utterances: list[Utterance]) -> list[Transcript]:
        heard = (self.transcribe(u) for u in utterances)
        return [t for t in heard if t is not None]

    def transcribe(self, utterance: Utterance) -> Transcript | None:
        self.stats.utterances += 1
        transcript = self.transcriber(utterance)
        if transcript is not None:
            self.stats.transcripts += 1
            self.stats.latencies.append(transcript.latency_s)
            log.info("heard %.2f-%.2f s in %.3f s: %s", transcript.start, transcript.end,
                     transcript.asr_s, transcript.text)
        return transcript


class TranscribingLoop(Pump[Transcript]):
    """Transcripts of everything said on `source`, each delivered as its utterance ends.

    A `Pump` (iterate, `start(on_transcript)` / `stop()`, or `async for t in
    listener.stream()`) over the `Transcribing` stage. Each `Transcript` carries
    `text`, `start` and `end` in seconds of stream time.
    """

    thread_name = "listener"

    def __init__(self, source: AudioSource, segmenter: Segmenter, transcriber: Transcriber) -> None:
        self.transcribing = Transcribing(segmenter, transcriber)
        super().__init__(source, self.transcribing)

    @property
    def segmenter(self) -> Segmenter:
        return self.transcribing.segmenter

    @property
    def transcriber(self) -> Transcriber:
        return self.transcribing.transcriber

    @property
    def stats(self) -> TranscribingStats:
        return self.transcribing.stats


def build_transcribing_loop(settings: Settings, store: ModelStore,
                            source: AudioSource | None = None) -> TranscribingLoop:
    """A listener as configured: `source` (default: the configured input, `audio.open_source`), VAD, Whisper.

    Models load first, so a missing export fails before the microphone is opened.
    """
    segmenter = make_segmenter(settings.vad, store)
    model = WhisperOnnx.from_settings(settings.asr, settings.models, for_use(settings, "asr"))
    if source is None:
        source = open_source(settings.audio)
    return TranscribingLoop(source, segmenter, Transcriber(model, settings.asr))
