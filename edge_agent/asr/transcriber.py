"""Whisper over one utterance: `Transcriber` turns a VAD `Utterance` into a `Transcript`, or None
when Whisper hears no speech in it. The loop that feeds it utterances is the listener's
(`listen/`): this package only recognises."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edge_agent.asr.settings import AsrSettings
from edge_agent.asr.whisper import Padding, WhisperOnnx
from edge_agent.vad.segmenter import Utterance

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
