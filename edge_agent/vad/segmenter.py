"""Cut a stream into utterances from per-frame speech decisions.

States: idle (remembering `preroll_ms` of audio) -> speech on the first speech
frame -> back to idle once `hangover_ms` of consecutive non-speech has passed, or
when the utterance reaches `max_utterance_s` (it then goes on as a new
utterance). Utterances with less than `min_utterance_ms` of speech frames
(clicks, a door, a cough) are dropped. Times count samples from the start of the
stream, so they are exact for files and drift-free for live input.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.vad.classifiers import SAMPLE_RATE, FrameClassifier
from edge_agent.vad.settings import VadSettings

TAIL_MS = 200
"""Audio kept after the last speech frame: word endings the VAD calls silence."""


@dataclass(frozen=True)
class Utterance:
    """A stretch of speech found by the VAD."""

    samples: Samples
    """16 kHz audio from `audio_start`: pre-roll, the speech, and a short tail."""
    start: float
    """Seconds from the start of the stream to the first speech frame."""
    end: float
    """Seconds to the end of the last speech frame."""
    audio_start: float
    """Seconds to the first sample of `samples`."""
    ended_at: float
    """Seconds of stream read when the end was decided (`end` + hangover, or the cut)."""
    speech_ms: int
    """Milliseconds of frames classified as speech."""
    cut: bool = False
    """True when `max_utterance_s` ended it rather than silence."""

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class SegmenterStats:
    """Counts since the segmenter was made."""

    frames: int = 0
    speech_frames: int = 0
    utterances: int = 0
    dropped_short: int = 0
    cuts: int = 0


@dataclass
class _Open:
    frames: list[Samples]
    audio_start: int
    start: int
    last_speech_end: int
    speech_frames: int = 1
    silence_run: int = 0


class Segmenter:
    """Feed blocks of any length with `push`; it returns the utterances that ended in them."""

    def __init__(self, classifier: FrameClassifier, settings: VadSettings) -> None:
        self.classifier = classifier
        self.settings = settings
        self.frame = classifier.frame_samples
        self.frame_ms = 1000 * self.frame / SAMPLE_RATE
        self._preroll: deque[Samples] = deque(maxlen=max(0, round(settings.preroll_ms / self.frame_ms)))
        self._hangover = max(1, round(settings.hangover_ms / self.frame_ms))
        self._tail = min(self._hangover, round(TAIL_MS / self.frame_ms))
        self._max = round(settings.max_utterance_s * SAMPLE_RATE)
        self._pending = np.zeros(0, dtype=np.float32)
        self._pos = 0
        self._open: _Open | None = None
        self.stats = SegmenterStats()

    @property
    def position(self) -> float:
        """Seconds of audio classified so far."""
        return self._pos / SAMPLE_RATE

    @property
    def in_speech(self) -> bool:
        return self._open is not None

    @property
    def silence_ms(self) -> float:
        """Non-speech since the last speech frame of the open utterance (0 when none is open)."""
        return self._open.silence_run * self.frame_ms if self._open is not None else 0.0

    def peek(self) -> Utterance | None:
        """The open utterance as it would end now (speech so far and a short tail), leaving it open.

        For deciding early: a caller may transcribe it and, if that is enough, `discard` the rest.
        """
        return self._utterance(self._open, cut=False) if self._open is not None else None

    def discard(self) -> None:
        """Forget the open utterance and the pre-roll (the stream position keeps counting)."""
        self._open = None
        self._preroll.clear()

    def push(self, block: Samples) -> list[Utterance]:
        """Classify `block` (16 kHz mono) and return every utterance that ended in it."""
        data = np.concatenate([self._pending, block]) if self._pending.size else block
        usable = len(data) - len(data) % self.frame
        self._pending = data[usable:].copy()
        done: list[Utterance] = []
        for offset in range(0, usable, self.frame):
            utterance = self._step(data[offset:offset + self.frame])
            if utterance is not None:
                done.append(utterance)
        return done

    def flush(self) -> list[Utterance]:
        """End of stream: close the open utterance, if any (a partial last frame is ignored)."""
        self._pending = np.zeros(0, dtype=np.float32)
        utterance = self._finish(cut=False) if self._open is not None else None
        self._preroll.clear()
        self.classifier.reset()
        return [utterance] if utterance is not None else []

    def _step(self, frame: Samples) -> Utterance | None:
        speech = self.classifier.is_speech(frame)
        start = self._pos
        self._pos += self.frame
        self.stats.frames += 1
        self.stats.speech_frames += speech
        current = self._open
        if current is None:
            if speech:
                frames = [*self._preroll, frame]
                audio_start = start - len(self._preroll) * self.frame
                self._open = _Open(frames, audio_start, start, self._pos)
                self._preroll.clear()
            else:
                self._preroll.append(frame)
            return None
        current.frames.append(frame)
        if speech:
            current.last_speech_end = self._pos
            current.speech_frames += 1
            current.silence_run = 0
        else:
            current.silence_run += 1
        if current.silence_run >= self._hangover:
            return self._finish(cut=False)
        if self._pos - current.start >= self._max:
            return self._finish(cut=True)
        return None

    def _finish(self, cut: bool) -> Utterance | None:
        current = self._open
        assert current is not None
        self._open = None
        # Keep pre-roll continuity: the frames after the speech become the next pre-roll.
        if not cut:
            for frame in current.frames[len(current.frames) - self._after_speech(current):]:
                self._preroll.append(frame)
        if round(current.speech_frames * self.frame_ms) < self.settings.min_utterance_ms:
            self.stats.dropped_short += 1
            return None
        self.stats.utterances += 1
        self.stats.cuts += cut
        return self._utterance(current, cut)

    def _after_speech(self, current: _Open) -> int:
        """Frames of the open utterance after its last speech frame."""
        return len(current.frames) - (current.last_speech_end - current.audio_start) // self.frame

    def _utterance(self, current: _Open, cut: bool) -> Utterance:
        keep = len(current.frames) - max(0, self._after_speech(current) - self._tail)
        return Utterance(
            samples=np.concatenate(current.frames[:keep]),
            start=current.start / SAMPLE_RATE,
            end=current.last_speech_end / SAMPLE_RATE,
            audio_start=current.audio_start / SAMPLE_RATE,
            ended_at=self._pos / SAMPLE_RATE,
            speech_ms=round(current.speech_frames * self.frame_ms),
            cut=cut,
        )
