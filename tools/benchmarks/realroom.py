"""`bench hear --real DIR`: recordings of a wake phrase heard in the room bench's living room by one,
two and four microphones, through each front end, as the device hears them.

DIR holds the talkers' clips (WAV, any rate), each a person saying the wake phrase of `--model`
(`okay_nabu` unless told); `DIR/babble/` holds other speech for the babble (else the other clips in
DIR are the babble: other people saying the same words). The room is `bench hear --room`'s
(pyroomacoustics, 5 x 4 x 2.7 m, RT60 0.45 s by Sabine, the device by a wall, talkers 1-3 m away,
the noise 2-4 m), now with three microphone arrays at the device's place: one microphone, the
ReSpeaker 2-Mic HAT (`respeaker_2mic`) and the 4-Mic HAT (`respeaker_4mic`), every source's
impulse computed to each microphone; each board heard averaged (no geometry), by delay-and-sum
and by the superdirective beamformer.

Conditions, after `bench hear --room` and the figures of real people in issue 35: dry (the
recording itself, one microphone); the room with a quiet fan at 30 dB SNR; a fan at 10 dB; three
other talkers from three places at 10 dB (a TV, a dinner table); a fan at 0 dB. SNR is set at
the first microphone of each array, speech by its active level (P.56). Each array's channels are
written to a WAV file and opened the way `listen --input F --front-end` opens it
(`audio.sources.open_source`: the beamformer for two and four channels), then through the
runtime's front end (`listen.microphone.open_microphone`) into the wake engine: front end off,
WebRTC's suppressor at 2, and speex's at 2 behind our gain of 10.

CPU: thread time of the whole hear path (source with its beamformer, front end, wake word) per
second of audio, per array and front end, over the three-talker scenes.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import wave
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import emit, machine
from benchmarks.room import FLOOR, MIC_M, NOISE_M, RATE, ROOM_M, SPEECH_RMS, TALKER_M, place, through
from benchmarks.wake import speech_rms
from edge_agent.audio.beamform import PRESETS
from edge_agent.audio.frames import Samples
from edge_agent.audio.sources import WavFileSource, open_source
from edge_agent.commands.context import Context
from edge_agent.config import Settings, WakeSettings
from edge_agent.errors import UsageError
from edge_agent.listen.microphone import open_microphone
from edge_agent.wake import WakeEngine

log = logging.getLogger(__name__)

RT60 = 0.45
LEAD_S, TAIL_S = 2.0, 1.5
BOARDS: dict[int, str | None] = {1: None, 2: "respeaker_2mic", 4: "respeaker_4mic"}
"""Microphones -> the board's geometry (one microphone: the boards' centre)."""
ARRAYS: dict[str, tuple[int, str | None, str]] = {
    "1 mic": (1, None, "superdirective"),
    "2 mic averaged": (2, None, "superdirective"),
    "2 mic delay-sum": (2, "respeaker_2mic", "delay_sum"),
    "2 mic superdirective": (2, "respeaker_2mic", "superdirective"),
    "4 mic averaged": (4, None, "superdirective"),
    "4 mic delay-sum": (4, "respeaker_4mic", "delay_sum"),
    "4 mic superdirective": (4, "respeaker_4mic", "superdirective"),
}
"""How each array is heard: microphones, `audio.mic_geometry` (None: averaged), `audio.beamformer`."""
CONDITIONS: dict[str, tuple[str | None, float | None]] = {
    "dry": (None, None),
    "room (fan 30 dB)": ("fan", 30.0),
    "fan 10 dB": ("fan", 10.0),
    "three talkers 10 dB": ("talkers", 10.0),
    "fan 0 dB": ("fan", 0.0),
}
FRONT_ENDS: dict[str, dict[str, Any]] = {
    "off": {"noise_suppression": 0, "auto_gain_dbfs": 0},
    "webrtc": {"noise_suppression": 2, "noise_suppressor": "webrtc", "auto_gain_dbfs": 0},
    "speex": {"noise_suppression": 2, "noise_suppressor": "speex", "auto_gain_dbfs": 10},
}


def add_real_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--real", type=Path, metavar="DIR",
                        help="recordings of people saying --model's wake phrase (DIR/babble/: others' "
                             "speech): the room, one, two and four microphones, each front end")
    parser.add_argument("--model", default="okay_nabu", help="with --real: the wake model the clips say")
    parser.add_argument("--limit", type=int, default=0, help="with --real: at most this many clips (0: all)")
    parser.add_argument("--mics", default="1,2,4", help="with --real: microphone counts (of 1, 2, 4)")


def load_dir(directory: Path) -> tuple[list[tuple[str, Samples]], list[Samples]]:
    """The talkers' clips (name, 16 kHz mono) and the babble's."""
    if not directory.is_dir():
        raise UsageError(f"--real {directory}: not a directory")

    def read(path: Path) -> Samples:
        source = WavFileSource(path)
        try:
            return np.concatenate(list(source.blocks()))
        finally:
            source.close()

    clips = [(p.name, read(p)) for p in sorted(directory.glob("*.wav"))]
    if not clips:
        raise UsageError(f"--real {directory}: no .wav files")
    babble_dir = directory / "babble"
    pool = [read(p) for p in sorted(babble_dir.glob("*.wav"))] if babble_dir.is_dir() else []
    return clips, pool or [c for _, c in clips]


class ArrayRoom:
    """Impulses from `sources` places to every microphone of every array (direct sound at 1 m: 1)."""

    def __init__(self, rng: np.random.Generator, talkers: int, noises: int) -> None:
        import pyroomacoustics as pra

        absorption, order = pra.inverse_sabine(RT60, list(ROOM_M))
        room = pra.ShoeBox(list(ROOM_M), fs=RATE, materials=pra.Material(absorption), max_order=order)
        self.talker_m: list[float] = []
        for _ in range(talkers):
            pos, d = place(rng, TALKER_M, (1.1, 1.7))
            room.add_source(pos)
            self.talker_m.append(round(d, 2))
        self.noise_m: list[float] = []
        for _ in range(noises):
            pos, d = place(rng, NOISE_M, (0.3, 1.5))
            room.add_source(pos)
            self.noise_m.append(round(d, 2))
        # The arrays lie flat at the device's place, rotated so no microphone is closer to the wall.
        self.mics: dict[int, list[int]] = {}
        points: list[list[float]] = []
        for count, geometry in BOARDS.items():
            offsets = PRESETS[geometry] if geometry else ((0.0, 0.0),)
            self.mics[count] = list(range(len(points), len(points) + len(offsets)))
            points += [[MIC_M[0] + 0.05 + y, MIC_M[1] + x, MIC_M[2]] for x, y in offsets]
        room.add_microphone_array(np.array(points).T)
        room.compute_rir()
        self.rirs = [[np.asarray(room.rir[m][s], dtype=np.float32) for s in range(talkers + noises)]
                     for m in range(len(points))]
        self.talkers = talkers

    def heard(self, audio: Samples, source: int, count: int) -> np.ndarray:
        """(n, count): `audio` from source `source` at each microphone of the `count` array."""
        return np.stack([through(audio, self.rirs[m][source]) for m in self.mics[count]], axis=1)


def scene(room: ArrayRoom, clip: Samples, where: int, cond: str, pool: list[Samples], *, count: int,
          rng: np.random.Generator) -> np.ndarray:
    """The array's channels for `clip` said at talker place `where` in `cond`."""
    kind, snr = CONDITIONS[cond]
    lead, tail = round(LEAD_S * RATE), round(TAIL_S * RATE)
    n = lead + clip.size + tail
    dry = np.zeros(n, dtype=np.float32)
    dry[lead:lead + clip.size] = clip * np.float32(SPEECH_RMS / speech_rms(clip))
    if kind is None:
        return dry[:, None]
    # The noise is drawn before anything that depends on the array, so that every array and front
    # end hears the same scene.
    if kind == "fan":
        noise = room.heard(rng.normal(size=n).astype(np.float32), room.talkers, count)
    else:
        others = [p for p in range(room.talkers) if p != where % room.talkers][:3]
        voices = [one_voice(n, pool, rng) for _ in others]
        noise = sum((room.heard(v, p, count) for v, p in zip(voices, others, strict=True)),
                    np.zeros((n, count), dtype=np.float32))
    speech = room.heard(dry, where % room.talkers, count)
    mic = speech + rng.normal(0, FLOOR, speech.shape).astype(np.float32)
    level = speech_rms(speech[:, 0])
    gain = level / 10 ** (float(snr or 0.0) / 20) / np.sqrt(np.mean(noise[:, 0] ** 2))
    out: np.ndarray = (mic + noise * np.float32(gain)).astype(np.float32)
    return out


def one_voice(n: int, pool: list[Samples], rng: np.random.Generator) -> Samples:
    """One talker's speech, a clip after another with a short pause, from a random place in it, at
    one level (the talkers are as loud as each other)."""
    parts, size = [], 0
    while size < n + RATE * 4:
        clip = pool[int(rng.integers(len(pool)))]
        clip = clip * np.float32(SPEECH_RMS / max(speech_rms(clip), 1e-9))
        parts += [clip, np.zeros(RATE // 4, dtype=np.float32)]
        size += clip.size + RATE // 4
    joined = np.concatenate(parts)
    start = int(rng.integers(joined.size - n))
    out: Samples = joined[start:start + n].astype(np.float32)
    return out


def write_channels(path: Path, frames: np.ndarray) -> None:
    peak = float(np.max(np.abs(frames)))
    scaled = frames / peak * 0.99 if peak > 0.99 else frames
    ints = np.round(np.clip(scaled, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(ints.tobytes())


def hear(path: Path, settings: Settings, engine: WakeEngine, model: str, after_s: float,
         ) -> tuple[bool, float, float, str | None]:
    """Whether `model` woke after `after_s`, the hear path's thread time, the audio's seconds and the
    beamformer's complaint, hearing the file as `listen --input F --front-end` does."""
    source = open_source(replace(settings.audio, input_file=path))
    heard = open_microphone(settings.audio, source=source, wake=settings.wake).source
    engine.reset()
    woke = False
    started = time.thread_time()
    samples = 0
    for block in heard.blocks():
        samples += block.size
        woke |= any(d.model == model and d.time >= after_s for d in engine.feed(block))
    cpu = time.thread_time() - started
    mixer = getattr(source, "mixer", None)
    heard.close()
    return woke, cpu, samples / RATE, getattr(mixer, "problem", None)


def run_real(ctx: Context, args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    clips, pool = load_dir(args.real)
    if args.limit:
        clips = clips[:args.limit]
    counts = [int(c) for c in str(args.mics).split(",") if c.strip().isdigit()]
    if not counts or any(c not in BOARDS for c in counts):
        raise UsageError(f"--mics {args.mics}: each of 1, 2, 4")
    arrays = {k: v for k, v in ARRAYS.items() if v[0] in counts}
    settings = ctx.settings
    engine = WakeEngine.load(WakeSettings(models=(args.model,)))
    room = ArrayRoom(rng, talkers=4, noises=1)
    result: dict[str, Any] = {
        "subject": "hear", "mode": "real", "machine": machine(), "dir": str(args.real),
        "clips": len(clips), "babble_clips": len(pool), "model": args.model,
        "room": {"rt60_sabine_s": RT60, "talker_m": room.talker_m, "noise_m": room.noise_m},
        "conditions": list(CONDITIONS), "front_ends": list(FRONT_ENDS), "arrays": list(arrays),
        "detected": {}, "cpu_percent": {}, "problems": [],
    }
    cpu: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        wav = Path(tmp) / "scene.wav"
        for cond in CONDITIONS:
            for key, (count, geometry, method) in arrays.items() if cond != "dry" else [
                    ("1 mic", ARRAYS["1 mic"])]:
                for fe, changes in FRONT_ENDS.items():
                    s = replace(settings, audio=replace(settings.audio, input_channels=count,
                                                        mic_geometry=geometry, beamformer=method,
                                                        echo_cancel=False, **changes))
                    found = 0
                    for i, (_, clip) in enumerate(clips):
                        scene_rng = np.random.default_rng([args.seed, list(CONDITIONS).index(cond), i])
                        frames = scene(room, clip, i, cond, pool, count=count, rng=scene_rng)
                        write_channels(wav, frames)
                        woke, used, seconds, problem = hear(wav, s, engine, args.model, LEAD_S - 0.5)
                        found += woke
                        if problem and problem not in result["problems"]:
                            result["problems"].append(problem)
                        if cond == "three talkers 10 dB":
                            cpu.setdefault(f"{key} {fe}", []).extend([used, seconds])
                    rate = round(found / len(clips), 3)
                    result["detected"].setdefault(cond, {}).setdefault(key, {})[fe] = rate
                    log.info("%s, %s, front end %s: %.3f", cond, key, fe, rate)
    for name, pairs in cpu.items():
        result["cpu_percent"][name] = round(100 * sum(pairs[::2]) / sum(pairs[1::2]), 2)
    emit(result, report_lines(result), args.json)
    return 0


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['clips']} clips of {result['model']} from {result['dir']} "
             f"({result['babble_clips']} babble clips); room RT60 {result['room']['rt60_sabine_s']} s, "
             f"talkers at {result['room']['talker_m']} m, noise at {result['room']['noise_m']} m",
             "detected, front end off / webrtc / speex:"]
    for cond, arrays in result["detected"].items():
        for key, row in arrays.items():
            lines.append(f"  {cond:22s} {key:22s} " + " / ".join(f"{row[f]}" for f in FRONT_ENDS))
    lines.append("hear path CPU (% of a core, three talkers): "
                 + ", ".join(f"{k} {v}" for k, v in result["cpu_percent"].items()))
    for problem in result["problems"]:
        lines.append(f"channels: {problem}")
    return lines
