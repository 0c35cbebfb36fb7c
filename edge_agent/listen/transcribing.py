"""The VAD and Whisper as one push/flush stage of the hearing loop: audio in, utterances and
transcripts out, counted.

The listener drives both: the VAD (`vad.segmenter`) finds where speech starts, pauses and ends,
and Whisper (`asr.transcriber`) is asked about an utterance only when the loop wants its words
(at a pause, when the VAD ends it). The VAD costs microseconds a frame, so while Whisper works on
one utterance the source's own queue (the sound card's) holds the audio that keeps coming. The
hearing loop asks this stage about the speech (`in_speech`, `silence_ms`, `peek`) and never
reaches into the segmenter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from edge_agent.asr.transcriber import Transcriber, Transcript
from edge_agent.audio.frames import Samples
from edge_agent.vad.classifiers import SAMPLE_RATE
from edge_agent.vad.segmenter import Segmenter, Utterance
from edge_agent.vad.settings import VadSettings

log = logging.getLogger(__name__)


@dataclass
class TranscribingStats:
    """Counts since the listener started."""

    audio_s: float = 0.0
    utterances: int = 0
    transcripts: int = 0
    latencies: list[float] = field(default_factory=list)


class Transcribing:
    """VAD utterances in, transcripts out; the speech's state for the turn around it."""

    def __init__(self, segmenter: Segmenter, transcriber: Transcriber) -> None:
        self.segmenter = segmenter
        self.transcriber = transcriber
        self.stats = TranscribingStats()

    # -- the speech, as the VAD hears it -------------------------------------------

    @property
    def vad(self) -> VadSettings:
        return self.segmenter.settings

    @property
    def frame(self) -> int:
        """Samples the VAD judges at a time."""
        return self.segmenter.frame

    @property
    def position(self) -> float:
        """Seconds of audio segmented since the stage started (or was last discarded)."""
        return self.segmenter.position

    @property
    def in_speech(self) -> bool:
        """An utterance is open (speech began and has not ended)."""
        return self.segmenter.in_speech

    @property
    def silence_ms(self) -> float:
        """How long the open utterance has been silent (0 while speech goes on)."""
        return self.segmenter.silence_ms

    def peek(self) -> Utterance | None:
        """The open utterance so far, without ending it."""
        return self.segmenter.peek()

    def discard(self) -> None:
        """Forget the audio segmented so far (a turn opens or ends)."""
        self.segmenter.discard()

    # -- stage ---------------------------------------------------------------------

    def push(self, block: Samples) -> list[Transcript]:
        return self._transcribe_all(self.segment(block))

    def segment(self, block: Samples) -> list[Utterance]:
        """The utterances that ended in `block`, not yet transcribed (a caller that already
        decoded one, the hearing loop's speculative decode, transcribes the rest itself)."""
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
