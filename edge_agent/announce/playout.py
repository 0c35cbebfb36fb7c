"""Playing one announcement out: synthesis stream -> (chime) -> gain -> sink, stoppable between sentences.

An audio announcement is played from its stored WAV instead of the synthesizer, in 1 s pieces
that count as sentences (`audiofiles.pieces`); everything after the source is the same.

The audio policy of announcements lives here: where they are heard (`SinkOpener`:
the sound card or one WAV file per id), the attention chime, the per-announcement
gain, and resampling when the engine changes mid-announcement.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from edge_agent.announce.audiofiles import pieces
from edge_agent.announce.message import Announcement
from edge_agent.announce.queue import Item
from edge_agent.audio.frames import AudioChunk, Samples
from edge_agent.audio.playback import play
from edge_agent.audio.resample import resample
from edge_agent.audio.sinks import AudioOutput, NullSink, Sink, WavSink
from edge_agent.errors import AudioError
from edge_agent.tts.voice import Synthesizer

log = logging.getLogger(__name__)


class SinkOpener(Protocol):
    """Where announcements are spoken."""

    keeps_open: bool
    """A sink may stay open while a more urgent announcement plays (a file, not a sound card)."""

    def open(self, ann: Announcement, sample_rate: int) -> Sink: ...


class DeviceOpener:
    """The configured audio output (sound card with its fallback)."""

    keeps_open = False

    def __init__(self, output: AudioOutput) -> None:
        self.output = output

    def open(self, ann: Announcement, sample_rate: int) -> Sink:
        return self.output.open(sample_rate, name=ann.id)


class DirOpener:
    """`<out_dir>/<id>.wav` per announcement (`edge-agent run --out-dir`)."""

    keeps_open = True

    def __init__(self, out_dir: Path, volume: float = 1.0) -> None:
        self.out_dir = out_dir
        self.volume = volume

    def open(self, ann: Announcement, sample_rate: int) -> Sink:
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AudioError(f"cannot create {self.out_dir}: {exc.strerror}") from None
        return WavSink(self.out_dir / f"{ann.id}.wav", sample_rate, self.volume)


def remove_partials(out_dir: Path) -> int:
    """Delete the temp files of `<id>.wav` files a killed process left half-written; how many.

    Only at start: while the daemon runs, an interrupted announcement keeps its file open.
    """
    count = 0
    for part in out_dir.glob(".*.wav.*.part"):
        part.unlink(missing_ok=True)
        count += 1
    if count:
        log.info("removed %d half-written announcement files from %s", count, out_dir)
    return count


class GainSink:
    """Scales samples by an announcement's own volume."""

    def __init__(self, inner: Sink, gain: float) -> None:
        self.inner = inner
        self.gain = np.float32(gain)
        self.sample_rate = inner.sample_rate
        self.frames = 0

    def write(self, samples: Samples) -> None:
        self.inner.write(samples * self.gain)
        self.frames += len(samples)

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()


def chime(sample_rate: int) -> Samples:
    """A soft two-tone attention chime (~0.45 s, with fades, then a short pause)."""
    parts = []
    for freq, dur in ((880.0, 0.16), (659.25, 0.22)):
        t = np.arange(round(dur * sample_rate), dtype=np.float32) / sample_rate
        tone = 0.35 * np.sin(2 * np.pi * freq * t) * np.exp(-3.0 * t / dur)
        fade = min(len(t) // 8, round(0.01 * sample_rate))
        tone[:fade] *= np.linspace(0, 1, fade, dtype=np.float32)
        tone[-fade:] *= np.linspace(1, 0, fade, dtype=np.float32)
        parts.append(tone.astype(np.float32))
    parts.append(np.zeros(round(0.12 * sample_rate), dtype=np.float32))
    return np.concatenate(parts)


CUE_RATE = 22050


def play_chime(opener: SinkOpener, name: str) -> None:
    """The chime alone, on the announcements' output (a conversation turn's cue to speak).

    With a directory opener it is `<out_dir>/<name>.wav`."""
    sink = opener.open(Announcement(id=name, text="(chime)"), CUE_RATE)
    try:
        sink.write(chime(sink.sample_rate))
    except BaseException:
        sink.abort()
        raise
    sink.close()


@dataclass
class Spoken:
    """The outcome of one `speak` call."""

    complete: bool
    """False: stopped at a sentence boundary with sentences left (resume from `resume`)."""
    resume: int
    engine: str | None
    """The engine that made most of the audio."""
    audio_s: float
    sink: Sink | None = None
    """The open sink, when an interrupted announcement keeps it for later."""
    truncated: bool = False
    """Cut at the audio budget (`announcements.max_audio_s`): complete, but not all of it."""
    discarded: str | None = None
    """Why nobody heard it (no sound output and `audio.fallback: null`, or `audio.output: null`);
    None when it reached a loudspeaker, a command or a file."""


class _Tracked:
    """Follows a chunk stream: skips sentences already spoken, counts engines, notes the end."""

    def __init__(self, chunks: Iterator[AudioChunk], skip_before: int, budget_s: float) -> None:
        self._chunks = chunks
        self._skip = skip_before
        self.rate = 0
        """The sink's rate: chunks at another rate are resampled to it."""
        self.engines: Counter[str] = Counter()
        self.last_sentence = -1
        self.exhausted = False
        self.budget_s = budget_s
        """Audio still allowed; the stream is cut (mid-sentence if need be) when it runs out."""
        self.truncated = False

    def first(self) -> AudioChunk | None:
        for chunk in self._chunks:
            if chunk.sentence >= self._skip:
                return self._note(chunk)
        self.exhausted = True
        return None

    def rest(self, first: AudioChunk) -> Iterator[AudioChunk]:
        chunk: AudioChunk | None = first
        while chunk is not None:
            out = self._convert(chunk)
            # Frames still allowed (inf: no bound), rounded so 0.12 - 0.05 s is 1120 frames, not 1119.
            room = max(0.0, round(self.budget_s * out.sample_rate, 6))
            if len(out.samples) > room or (len(out.samples) == room and not out.last):
                # The cost bound: what was sent cannot make the device speak for longer than this.
                self.truncated = self.exhausted = True
                yield AudioChunk(out.samples[:int(room)], out.sample_rate, out.sentence, True, out.engine)
                close = getattr(self._chunks, "close", None)
                if close is not None:
                    close()  # stops synthesis of the rest
                return
            self.budget_s -= len(out.samples) / out.sample_rate
            yield out
            chunk = self._next()
        self.exhausted = True

    def _next(self) -> AudioChunk | None:
        for chunk in self._chunks:
            if chunk.sentence >= self._skip:
                return self._note(chunk)
        return None

    def _note(self, chunk: AudioChunk) -> AudioChunk:
        self.engines[chunk.engine] += len(chunk.samples)
        self.last_sentence = max(self.last_sentence, chunk.sentence)
        return chunk

    def _convert(self, chunk: AudioChunk) -> AudioChunk:
        # An engine switch mid-announcement (remote 24 kHz, local 22.05 kHz) keeps the sink's rate.
        if chunk.sample_rate == self.rate or not self.rate:
            return chunk
        return AudioChunk(resample(chunk.samples, chunk.sample_rate, self.rate), self.rate,
                          chunk.sentence, chunk.last, chunk.engine)


def _open(item: Item, opener: SinkOpener, sample_rate: int) -> Sink:
    if item.sink is not None:
        sink: Sink = item.sink
        return sink
    opened = opener.open(item.announcement, sample_rate)
    return GainSink(opened, item.announcement.volume) if item.announcement.volume != 1.0 else opened


def _source(item: Item, synth: Synthesizer) -> Iterator[AudioChunk]:
    """Where an announcement's audio comes from: its stored WAV, or the synthesizer."""
    ann = item.announcement
    if ann.audio is not None:
        return pieces(Path(ann.audio), item.resume)
    return iter(synth.stream(ann.text, ann.voice))


def speak(item: Item, synth: Synthesizer, opener: SinkOpener, *,
          should_stop: Callable[[], bool], on_start: Callable[[str], None],
          budget_s: float = float("inf")) -> Spoken:
    """Speak `item` from its resume sentence; stop at a sentence boundary when `should_stop()`,
    and for good after `budget_s` seconds of audio (`Spoken.truncated`)."""
    ann = item.announcement
    tracked = _Tracked(_source(item, synth), item.resume, budget_s)
    try:
        first = tracked.first()
    except BaseException:
        if item.sink is not None:  # a file kept open across an interruption: no half of it stays
            item.sink.abort()
        raise
    if first is None:
        if item.sink is not None:
            item.sink.close()
        return Spoken(True, item.resume, None, 0.0)
    sink = _open(item, opener, first.sample_rate)
    inner = sink.inner if isinstance(sink, GainSink) else sink
    discarded = inner.reason if isinstance(inner, NullSink) else None
    tracked.rate = sink.sample_rate
    try:
        on_start(first.engine)
        if ann.chime and item.resume == 0:
            sink.write(chime(sink.sample_rate))
        stats = play(tracked.rest(first), sink, should_stop=should_stop)
    except BaseException:
        sink.abort()
        raise
    done_through = item.resume + stats.sentences - 1
    complete = not stats.interrupted or (tracked.exhausted and done_through >= tracked.last_sentence)
    engine = tracked.engines.most_common(1)[0][0] if tracked.engines else None
    audio_s = stats.frames / sink.sample_rate if sink.sample_rate else 0.0
    if complete:
        sink.close()
        return Spoken(True, done_through + 1, engine, audio_s, truncated=tracked.truncated,
                      discarded=discarded)
    # Stopped before its end, even if synthesis ran ahead into the audio budget: what was not
    # played is spoken later, within what is left of the budget.
    if not opener.keeps_open:
        sink.close()
        return Spoken(False, done_through + 1, engine, audio_s)
    return Spoken(False, done_through + 1, engine, audio_s, sink)
