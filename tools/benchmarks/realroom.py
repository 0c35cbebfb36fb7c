"""`bench hear --real DIR`: recordings of a wake phrase heard in the room bench's living room by one,
two and four microphones, through each front end, as the device hears them.

DIR holds the talkers' clips (WAV or FLAC, any rate), each a person saying the wake phrase of
`--model` (`okay_nabu` unless told); `--babble` (else `DIR/babble/`, searched recursively) holds
other people's speech for the babble (else the other clips in DIR are the babble: other people
saying the same words). A clip that does not decode is left out and counted (`unreadable`).
`--split` takes the clips whose name hashes into the held-out quarter (`held-out`), the other three
quarters (`tune`) or all: cutoffs are chosen on `tune` and reported on `held-out`.

`--near DIR`: every built-in wake model listens to other words said by real people (each
subfolder of DIR a word, its clips as above), dry and in the quiet room, and the bench counts who
woke on what. `--sweep`: besides the detection at the model's cutoff, the detection each cell
would have at other cutoffs and windows (from the model's probabilities, one run). `--false-wakes
DIR`: other words (a subfolder each, every other clip) said under three other talkers at 10 dB,
heard by each array: the model's wakes an hour. `--real-commands DIR`: recorded commands, each said after
a wake clip, heard by the device's whole hearing loop: turns opened and the commands' WER. `--oracle`:
each board's superdirective beam held on the talker (what perfect steering would buy) and a bank
of fixed beams, each heard by the wake model (what a device that does not steer could get).

The room is `bench hear --room`'s
(pyroomacoustics, 5 x 4 x 2.7 m, RT60 0.45 s by Sabine, the device by a wall, talkers 1-3 m away,
the noise 2-4 m), now with three microphone arrays at the device's place: one microphone, the
ReSpeaker 2-Mic HAT (`respeaker_2mic`) and the 4-Mic HAT (`respeaker_4mic`), every source's
impulse computed to each microphone; each board heard averaged (no geometry), by delay-and-sum,
by the superdirective beamformer steered alone and wake-steered (`audio.steering: wake`: the wake
word on a bank of fixed beams as well, `listen.beams`).

Conditions, after `bench hear --room` and the figures of real people in issue 35: dry (the
recording itself, one microphone); the room with a quiet fan at 30 dB SNR; a fan at 10 dB; three
other talkers from three places at 10 dB (a TV, a dinner table); a fan at 0 dB. SNR is set at
the first microphone of each array, speech by its active level (P.56). Each array's channels are
written to a WAV file and opened the way `listen --input F --front-end` opens it
(`audio.sources.open_source`: the beamformer for two and four channels), then through the
runtime's front end (`listen.microphone.open_microphone`) into the wake engine: front end off,
WebRTC's suppressor at 2, speex's at 2 behind our gain of 10, and (where `pyrnnoise` is installed,
`benchmarks.rnnoise`) RNNoise, the small neural suppressor, after the beamformer.

CPU: thread time of the whole hear path (source with its beamformer, front end, wake word) per
second of audio, per array and front end, over the three-talker scenes.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
import wave
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clips import read_recording
from benchmarks.report import emit, machine
from benchmarks.rnnoise import RNNoise, library
from benchmarks.room import FLOOR, MIC_M, NOISE_M, RATE, ROOM_M, SPEECH_RMS, TALKER_M, place, through
from benchmarks.wake import speech_rms
from edge_agent.audio.beamform import PRESETS, Beamformer, bank_delays
from edge_agent.audio.frames import Samples
from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sources import open_source
from edge_agent.commands.context import Context
from edge_agent.config import Settings, WakeSettings
from edge_agent.errors import AudioError, UsageError
from edge_agent.listen.beams import heard_by
from edge_agent.listen.loop import HearingModels
from edge_agent.listen.microphone import open_microphone
from edge_agent.listen.settings import ListenSettings
from edge_agent.wake import WakeEngine
from edge_agent.wake.models import check_all
from edge_agent.wake.settings import WAKE_BUILTIN

log = logging.getLogger(__name__)

RT60 = 0.45
LEAD_S, TAIL_S = 2.0, 1.5
BOARDS: dict[int, str | None] = {1: None, 2: "respeaker_2mic", 4: "respeaker_4mic"}
"""Microphones -> the board's geometry (one microphone: the boards' centre)."""
Array = tuple[int, str | None, str, str]
ARRAYS: dict[str, Array] = {
    "1 mic": (1, None, "superdirective", "track"),
    "2 mic averaged": (2, None, "superdirective", "track"),
    "2 mic delay-sum": (2, "respeaker_2mic", "delay_sum", "track"),
    "2 mic superdirective": (2, "respeaker_2mic", "superdirective", "track"),
    "2 mic wake-steered": (2, "respeaker_2mic", "superdirective", "wake"),
    "4 mic averaged": (4, None, "superdirective", "track"),
    "4 mic delay-sum": (4, "respeaker_4mic", "delay_sum", "track"),
    "4 mic superdirective": (4, "respeaker_4mic", "superdirective", "track"),
    "4 mic wake-steered": (4, "respeaker_4mic", "superdirective", "wake"),
}
"""How each array is heard: microphones, `audio.mic_geometry` (None: averaged), `audio.beamformer`,
`audio.steering` (`wake`: the superdirective beam and a bank of fixed beams, each heard by the wake
word, as `listen.beams` hears them)."""
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
    "rnnoise": {"noise_suppression": 0, "auto_gain_dbfs": 0},
}
"""The front ends compared (`rnnoise` only where its library is installed)."""
SUFFIXES = (".wav", ".flac")
CUTOFF_GRID = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))
WINDOW_GRID = (5, 8, 10)
"""`--sweep`: the cutoffs and windows each cell is also scored at."""
NEAR_CONDITIONS = ("dry", "room (fan 30 dB)")


def add_real_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--real", type=Path, metavar="DIR",
                        help="recordings of people saying --model's wake phrase (DIR/babble/: others' "
                             "speech): the room, one, two and four microphones, each front end")
    parser.add_argument("--model", default="okay_nabu", help="with --real: the wake model the clips say")
    parser.add_argument("--limit", type=int, default=0, help="with --real: at most this many clips (0: all)")
    parser.add_argument("--mics", default="1,2,4", help="with --real: microphone counts (of 1, 2, 4)")
    parser.add_argument("--babble", type=Path, metavar="DIR",
                        help="with --real: other people's speech for the babble (default DIR/babble/)")
    parser.add_argument("--split", choices=("all", "tune", "held-out"), default="all",
                        help="with --real: the held-out quarter of the clips, the other three, or all")
    parser.add_argument("--front-ends", default=",".join(FRONT_ENDS),
                        help=f"with --real: which front ends (of {', '.join(FRONT_ENDS)})")
    parser.add_argument("--conditions", default="",
                        help="with --real: which conditions, by number from 0 (" +
                             ", ".join(f"{i} {c}" for i, c in enumerate(CONDITIONS)) + "; default all)")
    parser.add_argument("--near", type=Path, metavar="DIR",
                        help="with --real: other words said by people (a subfolder per word): who wakes")
    parser.add_argument("--false-wakes", type=Path, metavar="DIR",
                        help="with --real: other words said by people (a subfolder per word), every "
                             "other clip under three other talkers at 10 dB: --model's wakes an hour")
    parser.add_argument("--real-commands", type=Path, metavar="DIR",
                        help="with --real: recorded commands (references.json or named by what is said), "
                             "each said after a wake clip: turns opened and the commands' WER, per array")
    parser.add_argument("--sweep", action="store_true",
                        help="with --real: also score every cell at other cutoffs and windows")
    parser.add_argument("--oracle", action="store_true",
                        help="with --real: also each board's superdirective beam steered by the talker's "
                             "own channels (what perfect steering would buy) and a bank of fixed beams "
                             "(woken when any wakes); front end off")


def held_out(name: str) -> bool:
    """The quarter of the clips no cutoff is chosen on, by a hash of the file's name."""
    return zlib.crc32(name.encode()) % 4 == 0


def read_folder(directory: Path, recursive: bool = False) -> tuple[list[tuple[str, Samples]], list[str]]:
    """The clips of a folder in name order, and the names of those that did not decode."""
    if recursive:  # folders linked in are followed (`Path.rglob` does not follow them before 3.13)
        found = [Path(top) / name for top, _, names in os.walk(directory, followlinks=True) for name in names]
    else:
        found = list(directory.glob("*"))
    clips, unreadable = [], []
    for path in sorted(p for p in found if p.suffix.lower() in SUFFIXES and p.is_file()):
        try:
            clips.append((str(path.relative_to(directory)), read_recording(path)))
        except AudioError:
            unreadable.append(path.name)
    return clips, unreadable


def load_dir(directory: Path, babble: Path | None = None,
             ) -> tuple[list[tuple[str, Samples]], list[Samples], list[str]]:
    """The talkers' clips (name, 16 kHz mono), the babble's, and the clips that did not decode."""
    if not directory.is_dir():
        raise UsageError(f"--real {directory}: not a directory")
    clips, unreadable = read_folder(directory)
    if not clips:
        raise UsageError(f"--real {directory}: no .wav or .flac files" +
                         (f" that decode ({len(unreadable)} do not)" if unreadable else ""))
    babble_dir = babble if babble is not None else directory / "babble"
    if babble is not None and not babble.is_dir():
        raise UsageError(f"--babble {babble}: not a directory")
    pool = [a for _, a in read_folder(babble_dir, recursive=True)[0]] if babble_dir.is_dir() else []
    return clips, [trimmed(a) for a in pool or [c for _, c in clips]], unreadable


def trimmed(audio: Samples, floor_db: float = 35.0, margin_s: float = 0.05) -> Samples:
    """A babble clip without the silence around its speech (a word recorded in a 3 s window would
    otherwise make a talker who is mostly silent): 20 ms frames within `floor_db` of its loudest."""
    frame = RATE // 50
    n = audio.size // frame
    if n == 0:
        return audio
    rms = np.sqrt(np.mean(audio[:n * frame].reshape(n, frame) ** 2, axis=1))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (-floor_db / 20))
    margin = round(margin_s * RATE)
    out: Samples = audio[max(0, loud[0] * frame - margin):min(audio.size, (loud[-1] + 1) * frame + margin)]
    return out


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
    return scene_parts(room, clip, where, cond, pool, count=count, rng=rng)[0]


def scene_parts(room: ArrayRoom, clip: Samples, where: int, cond: str, pool: list[Samples], *, count: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The array's channels for `clip` said at talker place `where` in `cond`, and the talker's alone
    (over the microphones' own noise)."""
    kind, snr = CONDITIONS[cond]
    lead, tail = round(LEAD_S * RATE), round(TAIL_S * RATE)
    n = lead + clip.size + tail
    dry = np.zeros(n, dtype=np.float32)
    dry[lead:lead + clip.size] = clip * np.float32(SPEECH_RMS / speech_rms(clip))
    if kind is None:
        return dry[:, None], dry[:, None]
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
    return out, mic


def heard_as(audio: AudioSettings, array: Array, front_end: str) -> AudioSettings:
    """`audio` as `array` is heard through `front_end` (no echo canceller: a scene plays nothing)."""
    count, geometry, method, steering = array
    return replace(audio, input_channels=count, mic_geometry=geometry, beamformer=method, steering=steering,
                   echo_cancel=False, **FRONT_ENDS[front_end])


def device_arrays(arrays: dict[str, Array]) -> dict[str, Array]:
    """One microphone and the boards' superdirective beams, tracked and wake-steered (averaging and
    delay-and-sum are left out: they hear no better than the one microphone they resemble)."""
    return {key: array for key, array in arrays.items()
            if array[0] == 1 or (array[1] is not None and array[2] == "superdirective")}


def level(clip: Samples) -> Samples:
    """`clip` at the talkers' speech level (two people's recordings said as one talker's)."""
    out: Samples = (clip * np.float32(SPEECH_RMS / max(speech_rms(clip), 1e-9))).astype(np.float32)
    return out


def one_voice(n: int, pool: list[Samples], rng: np.random.Generator) -> Samples:
    """One talker's speech, a clip after another with a short pause, from a random place in it, at
    one level (the talkers are as loud as each other)."""
    parts, size = [], 0
    while size < n + RATE * 4:
        clip = pool[int(rng.integers(len(pool)))]
        clip = level(clip)
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


class Ears:
    """Wake models for the bench, keeping each run's raw probabilities so that a cell can be scored at
    other cutoffs and windows than the engine's."""

    def __init__(self, settings: WakeSettings) -> None:
        self.specs = check_all(settings)
        self.raw: dict[str, list[tuple[float, float]]] = {}
        self.engine = WakeEngine(self.specs, settings.refractory_s, listener=self._heard)

    def _heard(self, model: str, time_s: float, probability: float) -> None:
        self.raw.setdefault(model, []).append((time_s, probability))

    def reset(self) -> None:
        self.engine.reset()
        self.raw = {}

    def cutoff(self, model: str) -> float:
        return next(s.probability_cutoff for s in self.specs if s.name == model)

    def peak(self, model: str, window: int, after_s: float) -> float:
        """The highest mean of `window` probabilities of `model` whose window ends after `after_s`."""
        pairs = np.array(self.raw.get(model, []), dtype=np.float64).reshape(-1, 2)
        if pairs.shape[0] < window:
            return 0.0
        means = np.convolve(pairs[:, 1], np.ones(window) / window, mode="valid")
        late = means[pairs[window - 1:, 0] >= after_s]
        return float(late.max()) if late.size else 0.0


@dataclass(frozen=True)
class SceneHeard:
    """One scene heard as the device hears it."""

    woke: bool
    """`model` woke after the scene's lead-in."""
    wakes: int
    """Detections of `model` anywhere in the scene."""
    peak: float
    """`model`'s highest windowed probability anywhere, on any beam."""
    cpu_s: float
    """The hear path's thread time."""
    seconds: float
    problem: str | None
    """The beamformer's complaint."""


def hear(path: Path, settings: Settings, ears: Ears, model: str, after_s: float, *,
         denoiser: Path | None) -> SceneHeard:
    """The file heard as `listen --input F --front-end` hears it (with RNNoise after the front end
    where `denoiser` names its library)."""
    source = open_source(replace(settings.audio, input_file=path))
    microphone = open_microphone(settings.audio, source=source, wake=settings.wake)
    heard = microphone.source
    ears.reset()
    wake = heard_by(ears.engine, microphone)
    woke, wakes = False, 0
    started = time.thread_time()
    samples = 0
    rnnoise = RNNoise(denoiser) if denoiser is not None else None
    blocks = rnnoise.stream(heard.blocks()) if rnnoise is not None else heard.blocks()
    for block in blocks:
        samples += block.size
        for d in wake.feed(block):
            wakes += d.model == model
            woke |= d.model == model and d.time >= after_s
    cpu = time.thread_time() - started
    peak = wake.stats.peak.get(model, 0.0)
    if wake is not ears.engine:
        wake.close()
    if rnnoise is not None:
        rnnoise.close()
    mixer = getattr(source, "mixer", None)
    heard.close()
    return SceneHeard(woke, wakes, peak, cpu, samples / RATE, getattr(mixer, "problem", None))


def chosen(args: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """The front ends, conditions and notes the arguments ask for."""
    notes: list[str] = []
    front_ends = [f.strip() for f in str(args.front_ends).split(",") if f.strip()]
    if unknown := [f for f in front_ends if f not in FRONT_ENDS]:
        raise UsageError(f"--front-ends: {', '.join(unknown)} unknown (of {', '.join(FRONT_ENDS)})")
    if "rnnoise" in front_ends and library() is None:
        if args.front_ends != ",".join(FRONT_ENDS):
            raise UsageError("--front-ends rnnoise: install it with `pip install --no-deps pyrnnoise==0.4.5`")
        front_ends.remove("rnnoise")
        notes.append("rnnoise left out: `pip install --no-deps pyrnnoise==0.4.5` to compare it")
    names = list(CONDITIONS)
    try:
        conditions = [names[int(c)] for c in str(args.conditions).split(",") if c.strip()] or names
    except (ValueError, IndexError):
        raise UsageError(f"--conditions {args.conditions}: numbers of 0..{len(names) - 1}") from None
    return front_ends, conditions, notes


def run_real(ctx: Context, args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    front_ends, conditions, notes = chosen(args)
    clips, pool, unreadable = load_dir(args.real, args.babble)
    if args.split != "all":
        clips = [c for c in clips if held_out(c[0]) == (args.split == "held-out")]
    if args.limit:
        clips = clips[:args.limit]
    counts = [int(c) for c in str(args.mics).split(",") if c.strip().isdigit()]
    if not counts or any(c not in BOARDS for c in counts):
        raise UsageError(f"--mics {args.mics}: each of 1, 2, 4")
    arrays = {k: v for k, v in ARRAYS.items() if v[0] in counts}
    settings = ctx.settings
    ears = Ears(replace(settings.wake, models=(args.model,)))
    room = ArrayRoom(rng, talkers=4, noises=1)
    result: dict[str, Any] = {
        "subject": "hear", "mode": "real", "machine": machine(), "dir": str(args.real), "split": args.split,
        "clips": len(clips), "unreadable": len(unreadable), "babble_clips": len(pool), "model": args.model,
        "cutoff": ears.cutoff(args.model), "window": ears.specs[0].sliding_window_size,
        "room": {"rt60_sabine_s": RT60, "talker_m": room.talker_m, "noise_m": room.noise_m},
        "conditions": conditions, "front_ends": front_ends, "arrays": list(arrays),
        "detected": {}, "cpu_percent": {}, "problems": [], "notes": notes,
    }
    if args.sweep:
        result["sweep"] = {"cutoffs": list(CUTOFF_GRID), "windows": list(WINDOW_GRID), "detected": {}}
    cpu: dict[str, list[float]] = {}
    rnnoise = library()
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        wav = Path(tmp) / "scene.wav"
        for cond in conditions:
            for key, array in arrays.items() if cond != "dry" else [("1 mic", ARRAYS["1 mic"])]:
                for fe in front_ends:
                    s = replace(settings, audio=heard_as(settings.audio, array, fe))
                    found = 0
                    peaks: dict[int, list[float]] = {w: [] for w in WINDOW_GRID}
                    for i, (_, clip) in enumerate(clips):
                        scene_rng = np.random.default_rng([args.seed, list(CONDITIONS).index(cond), i])
                        frames = scene(room, clip, i, cond, pool, count=array[0], rng=scene_rng)
                        write_channels(wav, frames)
                        heard = hear(wav, s, ears, args.model, LEAD_S - 0.5,
                                     denoiser=rnnoise if fe == "rnnoise" else None)
                        found += heard.woke
                        problem = heard.problem
                        for window, kept in peaks.items():
                            kept.append(ears.peak(args.model, window, LEAD_S - 0.5))
                        if problem and problem not in result["problems"]:
                            result["problems"].append(problem)
                        if cond == "three talkers 10 dB":
                            cpu.setdefault(f"{key} {fe}", []).extend([heard.cpu_s, heard.seconds])
                    rate = round(found / len(clips), 3)
                    result["detected"].setdefault(cond, {}).setdefault(key, {})[fe] = rate
                    if args.sweep and array[3] == "track":  # the raw probabilities are one stream's
                        result["sweep"]["detected"].setdefault(cond, {}).setdefault(key, {})[fe] = {
                            str(w): [round(float(np.mean(np.array(v) > c)), 3) for c in CUTOFF_GRID]
                            for w, v in peaks.items()}
                    log.info("%s, %s, front end %s: %.3f", cond, key, fe, rate)
    for name, pairs in cpu.items():
        result["cpu_percent"][name] = round(100 * sum(pairs[::2]) / sum(pairs[1::2]), 2)
    if args.oracle:
        result["oracle"] = oracle(room, clips, pool, conditions=conditions, counts=counts, ears=ears,
                                  args=args)
    if args.near is not None:
        result["near_miss"] = near_misses(args.near, settings, args.seed)
    if args.real_commands is not None:
        result["commands"] = commands_heard(ctx, args, clips=clips, arrays=arrays, room=room, pool=pool)
    if args.false_wakes is not None:
        result["false_wakes"] = false_wakes(args.false_wakes, settings, ears, model=args.model, arrays=arrays,
                                            room=room, pool=pool, seed=args.seed)
    emit(result, report_lines(result), args.json)
    return 0


def held(geometry: str, count: int, delays: np.ndarray, reference: int = 0) -> Beamformer:
    beam = Beamformer.from_geometry(geometry, count, RATE)
    beam.delays, beam.reference, beam.track = delays.copy(), reference, False
    return beam


def oracle(room: ArrayRoom, clips: list[tuple[str, Samples]], pool: list[Samples], *, conditions: list[str],
           counts: list[int], ears: Ears, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Detection with each board's superdirective beam held on the talker (its delays measured on
    the talker's own channels, never tracked), and with a bank of fixed beams, each heard by the wake
    model, woken when any wakes (`audio.beamform.bank_delays`). The same scenes as the table. The gap
    between the held beam and the tracked one is what steering loses, e.g. to babble heard before the
    wake word; the bank is a way to get it back that does not steer (with a false-accept chance per
    beam): the device's is the `wake-steered` row."""
    out: dict[str, dict[str, float]] = {}

    def woke(audio: Samples) -> bool:
        ears.reset()
        return any(d.model == args.model and d.time >= LEAD_S - 0.5 for d in ears.engine.feed(audio))

    for cond in (c for c in conditions if c != "dry"):
        for count in (c for c in counts if BOARDS[c] is not None):
            geometry = BOARDS[count]
            assert geometry is not None
            bank = bank_delays(PRESETS[geometry], RATE)
            on_talker = in_bank = 0
            for i, (_, clip) in enumerate(clips):
                scene_rng = np.random.default_rng([args.seed, list(CONDITIONS).index(cond), i])
                mixture, talker = scene_parts(room, clip, i, cond, pool, count=count, rng=scene_rng)
                probe = Beamformer.from_geometry(geometry, count, RATE)
                probe.process(talker)
                on_talker += woke(held(geometry, count, probe.delays, probe.reference).process(mixture))
                in_bank += any(woke(held(geometry, count, d).process(mixture)) for d in bank)
            row = out.setdefault(cond, {})
            row[f"{count} mic superdirective"] = round(on_talker / len(clips), 3)
            row[f"{count} mic bank of {len(bank)}"] = round(in_bank / len(clips), 3)
    return out


def word_folders(directory: Path, option: str) -> list[Path]:
    """The subfolders of `directory`, a word each."""
    if not directory.is_dir():
        raise UsageError(f"{option} {directory}: not a directory")
    words = sorted(p for p in directory.iterdir() if p.is_dir())
    if not words:
        raise UsageError(f"{option} {directory}: no subfolder (one per word)")
    return words


FALSE_WAKE_CONDITION = "three talkers 10 dB"


def false_wakes(directory: Path, settings: Settings, ears: Ears, *, model: str,
                arrays: dict[str, Array], room: ArrayRoom, pool: list[Samples],
                seed: int) -> dict[str, Any]:
    """`--false-wakes DIR`: every other clip of each word (a subfolder each) said in the room under
    three other talkers at 10 dB, heard by each array, front end off: `model`'s wakes anywhere in
    the scene at its cutoff, an hour, and the scenes it would have woken in at each cutoff of the
    sweep's grid (from its highest windowed probability on any beam), for `device_arrays`."""
    scenes = [clip for folder in word_folders(directory, "--false-wakes")
              for clip in [c for _, c in read_folder(folder)[0]][::2]]
    out: dict[str, Any] = {"scenes": len(scenes), "condition": FALSE_WAKE_CONDITION, "arrays": {}}
    with tempfile.TemporaryDirectory(prefix="bench-false-") as tmp:
        wav = Path(tmp) / "scene.wav"
        for key, array in device_arrays(arrays).items():
            count = array[0]
            s = replace(settings, audio=heard_as(settings.audio, array, "off"))
            wakes, seconds, peaks = 0, 0.0, []
            for i, clip in enumerate(scenes):
                rng = np.random.default_rng([seed, len(CONDITIONS), i])
                write_channels(wav, scene(room, clip, i, FALSE_WAKE_CONDITION, pool, count=count, rng=rng))
                heard = hear(wav, s, ears, model, 0.0, denoiser=None)
                wakes, seconds = wakes + heard.wakes, seconds + heard.seconds
                peaks.append(heard.peak)
            hours = seconds / 3600
            out["hours"] = round(hours, 3)
            out["arrays"][key] = {
                "wakes": wakes, "per_hour": round(wakes / hours, 2) if hours else None,
                "scenes_woken_at": {str(c): int(np.sum(np.array(peaks) > c)) for c in CUTOFF_GRID}}
            log.info("false wakes, %s: %d in %.2f h", key, wakes, hours)
    return out


COMMAND_CONDITIONS = ("room (fan 30 dB)", "three talkers 10 dB")
COMMAND_PAUSE_S = 0.4
"""Between the wake phrase and the command (people wait for the chime, or do not)."""


def commands_heard(ctx: Context, args: argparse.Namespace, *, clips: list[tuple[str, Samples]],
                   arrays: dict[str, Array], room: ArrayRoom,
                   pool: list[Samples]) -> dict[str, Any]:
    """`--real-commands DIR`: each recorded command (what is said: the folder's `references.json`, else the
    file's name) said after one of the wake clips (in turn, another person's voice from the same
    place), in the quiet room and under three other talkers at 10 dB, heard by one microphone and
    the boards' superdirective beams, tracked and wake-steered, through the device's hearing loop
    (wake mode, Whisper, the configured end of turn, front end off): the turns the wake phrase
    opened, the commands' WER over all (a turn not opened is a command not heard) and the share of
    their words heard (`bench turn`'s words kept)."""
    from benchmarks.turn import kept, load_recording, load_references
    from edge_agent.parts import load_hearing
    from edge_agent.text.wer import wer
    from edge_agent.vad import make_segmenter

    directory: Path = args.real_commands
    if not directory.is_dir():
        raise UsageError(f"--real-commands {directory}: not a directory")
    references = load_references(directory / "references.json")
    paths = sorted(p for p in directory.iterdir() if p.suffix.lower() in SUFFIXES)
    if args.split != "all":
        paths = [p for p in paths if held_out(p.name) == (args.split == "held-out")]
    if args.limit:
        paths = paths[:args.limit]
    said = [(references.get(p.name, p.stem), trimmed(load_recording(p))) for p in paths]
    if not said:
        raise UsageError(f"--real-commands {directory}: no .wav or .flac files")
    settings = replace(ctx.settings, wake=replace(ctx.settings.wake, models=(args.model,)))
    models = load_hearing(replace(settings, listen=replace(settings.listen, mode="wake")), ctx.store)
    assert models.wake is not None
    out: dict[str, Any] = {"commands": len(said), "dir": str(directory), "conditions": {}}
    with tempfile.TemporaryDirectory(prefix="bench-commands-") as tmp:
        wav = Path(tmp) / "scene.wav"
        for cond in COMMAND_CONDITIONS:
            for key, array in device_arrays(arrays).items():
                count = array[0]
                audio = replace(heard_as(settings.audio, array, "off"), input_file=wav)
                opened, refs, hyps, got, of = 0, [], [], 0, 0
                pause = np.zeros(round(COMMAND_PAUSE_S * RATE), np.float32)
                for i, (text, command) in enumerate(said):
                    spoken = np.concatenate([level(trimmed(clips[i % len(clips)][1])), pause, level(command)])
                    rng = np.random.default_rng([args.seed, list(CONDITIONS).index(cond), i])
                    write_channels(wav, scene(room, spoken, i, cond, pool, count=count, rng=rng))
                    # A new VAD each scene: a scene ends in babble, mid-utterance.
                    fresh = replace(models, segmenter=make_segmenter(settings.vad, ctx.store))
                    woke, heard = command_turn(fresh, settings.listen, audio)
                    log.debug("%s, %s: %r heard as %r", cond, key, text, heard)
                    opened += woke
                    refs.append(text)
                    hyps.append(heard)
                    k, n = kept(text, heard)
                    got, of = got + k, of + n
                row = {"opened": round(opened / len(said), 3), "wer": round(wer(refs, hyps), 3),
                       "words_heard": round(got / max(of, 1), 3)}
                out["conditions"].setdefault(cond, {})[key] = row
                log.info("commands, %s, %s: %s", cond, key, row)
    return out


def command_turn(models: HearingModels, listen: ListenSettings, audio: AudioSettings) -> tuple[bool, str]:
    """Whether the file's wake phrase (after the lead-in) opened a turn, and what that turn heard."""
    from edge_agent.listen import Heard, Woke, hearing_loop

    assert models.wake is not None
    models.wake.reset()
    turn, heard = None, ""
    for event in hearing_loop("wake", listen, models, open_microphone(audio, source=open_source(audio))):
        if isinstance(event, Woke) and turn is None and event.detection.time >= LEAD_S - 0.5:
            turn = event.conversation_id
        elif isinstance(event, Heard) and turn is not None and event.conversation_id == turn:
            heard = event.transcript.text
    return turn is not None, heard


def near_misses(directory: Path, settings: Settings, seed: int) -> dict[str, Any]:
    """Wakes of every built-in model on other words said by people: per word, condition and model,
    the clips it woke on at its cutoff (and, per model, its highest windowed probability)."""
    words = word_folders(directory, "--near")
    ears = Ears(replace(settings.wake, models=WAKE_BUILTIN, probability_cutoff={}, sliding_window={}))
    room = ArrayRoom(np.random.default_rng(seed), talkers=1, noises=1)
    out: dict[str, Any] = {"models": {s.name: [s.probability_cutoff, s.sliding_window_size]
                                      for s in ears.specs}, "words": {}}
    for folder in words:
        clips, unreadable = read_folder(folder)
        row: dict[str, Any] = {"clips": len(clips), "unreadable": len(unreadable)}
        for cond in NEAR_CONDITIONS:
            woke = dict.fromkeys(ears.engine.names, 0)
            for i, (_, clip) in enumerate(clips):
                frames = scene(room, clip, 0, cond, [], count=1, rng=np.random.default_rng([seed, i]))
                ears.reset()
                ears.engine.feed(frames[:, 0])
                for spec in ears.specs:
                    peak = ears.peak(spec.name, spec.sliding_window_size, 0.0)
                    woke[spec.name] += peak > spec.probability_cutoff
            row[cond] = woke
        out["words"][folder.name] = row
        log.info("near miss %s: %s", folder.name, row)
    return out


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['clips']} clips of {result['model']} from {result['dir']} (split {result['split']}, "
             f"{result['unreadable']} unreadable left out; {result['babble_clips']} babble clips); room RT60 "
             f"{result['room']['rt60_sabine_s']} s, talkers at {result['room']['talker_m']} m, noise at "
             f"{result['room']['noise_m']} m; cutoff {result['cutoff']}, window {result['window']}",
             "detected, front end " + " / ".join(result["front_ends"]) + ":"]
    for cond, arrays in result["detected"].items():
        for key, row in arrays.items():
            lines.append(f"  {cond:22s} {key:22s} " + " / ".join(f"{row[f]}" for f in result["front_ends"]))
    lines.append("hear path CPU (% of a core, three talkers): "
                 + ", ".join(f"{k} {v}" for k, v in result["cpu_percent"].items()))
    for problem in result["problems"]:
        lines.append(f"channels: {problem}")
    if "near_miss" in result:
        lines.append("wakes on other words (clips woken; dry / room):")
        for word, row in result["near_miss"]["words"].items():
            dry, room = (row[c] for c in NEAR_CONDITIONS)
            woke = ", ".join(f"{m} {dry[m]}/{room[m]}" for m in dry)
            lines.append(f"  {word:14s} ({row['clips']} clips) {woke}")
    if "commands" in result:
        lines.append(f"commands ({result['commands']['commands']} from {result['commands']['dir']}) after "
                     "the wake phrase: turns opened / WER / words heard:")
        for cond, rows in result["commands"]["conditions"].items():
            for key, row in rows.items():
                lines.append(f"  {cond:22s} {key:22s} {row['opened']} / {row['wer']} / {row['words_heard']}")
    if "false_wakes" in result:
        fw = result["false_wakes"]
        lines.append(f"false wakes, {fw['scenes']} scenes of other words ({fw.get('hours', 0)} h), "
                     f"{fw['condition']}:")
        for key, row in fw["arrays"].items():
            lines.append(f"  {key:22s} {row['wakes']} ({row['per_hour']} an hour); scenes woken at "
                         + ", ".join(f"{c} {n}" for c, n in row["scenes_woken_at"].items()))
    for cond, row in result.get("oracle", {}).items():
        held = ", ".join(f"{k} {v}" for k, v in row.items())
        lines.append(f"  {cond:22s} steered by the talker alone: {held}")
    lines += result["notes"]
    return lines
