"""Audio over Wyoming: our float32 samples out as `audio-chunk` events, a client's PCM in as 16 kHz.

Out: s16le mono at the voice's own rate, `samples_per_chunk` samples an event.
In: whatever plausible format `audio-start` declares (Home Assistant sends 16 kHz
s16le mono, satellites may not), mixed down and resampled to the 16 kHz the VAD,
the wake engine and Whisper take, and bounded in length.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from wyoming.audio import AudioChunk, AudioStart
from wyoming.event import Event

from edge_agent.audio.frames import Samples
from edge_agent.audio.sources import TARGET_RATE, PcmConverter
from edge_agent.audio.wav import check_format, to_pcm16
from edge_agent.errors import AudioError, EdgeError

WIDTH = 2
"""Bytes per sample we send (s16le)."""


class Refused(EdgeError):
    """A request the server will not carry out: the client gets one `error` event and the connection
    is closed (Home Assistant's clients wait for audio or a closed connection, not for errors); only
    Home Assistant's satellite link stays open (see `server`)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def start_event(rate: int) -> Event:
    return AudioStart(rate=rate, width=WIDTH, channels=1).event()


def chunk_events(samples: Samples, rate: int, per_chunk: int) -> Iterator[Event]:
    """`audio-chunk` events carrying `samples` as s16le mono, at most `per_chunk` samples each."""
    for start in range(0, len(samples), per_chunk):
        pcm = to_pcm16(samples[start:start + per_chunk])
        yield AudioChunk(rate=rate, width=WIDTH, channels=1, audio=pcm).event()


class Recording:
    """One client audio stream (`audio-start`, `audio-chunk`..., `audio-stop`) as mono float32 at
    `rate`: 16 kHz for listening (the default), the stream's own rate for playing it."""

    def __init__(self, start: AudioStart, max_s: float, keep: bool = True, rate: int | None = None) -> None:
        try:
            check_format(start.rate, start.channels, start.width, "audio-start")
        except AudioError as exc:
            raise Refused(str(exc), "bad-audio-format") from None
        self.format = (start.rate, start.width, start.channels)
        self.rate = rate or TARGET_RATE
        self.max_s = max_s
        self.keep = keep
        """Keep the audio for `finish` (ASR); a live stream (wake) only passes it on, unbounded."""
        self._convert = PcmConverter(start.rate, start.channels, start.width, "audio-chunk",
                                     target_rate=self.rate)
        self._parts: list[Samples] = []
        self.samples = 0

    @staticmethod
    def begin(event: Event, max_s: float, keep: bool = True, native: bool = False) -> Recording:
        """`native`: keep the stream's own sample rate instead of converting to 16 kHz."""
        bad = Refused("audio-start needs integer 'rate', 'width' and 'channels'", "bad-audio-format")
        try:
            start = AudioStart.from_event(event)
        except (KeyError, TypeError, ValueError):
            raise bad from None
        if not all(_integer(v) for v in (start.rate, start.width, start.channels)):
            raise bad
        return Recording(start, max_s, keep, start.rate if native else None)

    def push(self, event: Event) -> Samples:
        """Add one `audio-chunk`; returns its 16 kHz samples (the resampler may hold a few back)."""
        data = event.data
        declared = (data.get("rate"), data.get("width"), data.get("channels"))
        if declared != self.format:
            raise Refused(f"audio-chunk format {declared} differs from audio-start's {self.format}",
                          "bad-audio-format")
        samples = self._convert.push(event.payload or b"")
        self._add(samples)
        return samples

    def finish(self) -> Samples:
        """All the audio, once `audio-stop` has come."""
        self._add(self._convert.finish())
        if not self._parts:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(self._parts)

    def _add(self, samples: Samples) -> None:
        self.samples += samples.size
        if not self.keep:
            return
        if self.samples > self.max_s * self.rate:
            raise Refused(f"audio longer than {self.max_s:g} s", "audio-too-long")
        if samples.size:
            self._parts.append(samples)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
