"""Hearing in a room: noise suppressors by wake detection, the echo canceller by ERLE and barge-in.

Audio (no recordings ship with the project): our Piper voice saying "Okay Nabu, <command>"
for the smart-speaker commands, mixed with noise at 10 and 0 dB SNR (speech RMS over noise
RMS): babble of four of our own everyday sentences at once, white noise, pink noise, and
music-like tones (plucked harmonic notes, four a second); and the same clips 40 dB down
(a far, quiet talker: what automatic gain is for). Each noise suppressor and gain hears the
same mixtures, then the real okay_nabu model decides (one detection per clip counts).

Echo: announcements spoken by our voice played through a simulated room (pyroomacoustics
0.10.1, a 5 x 4 x 2.6 m shoebox, the loudspeaker 36 cm from the microphone, plus 100 ms of
sound card; a synthetic impulse when pyroomacoustics is not installed) into the microphone.
ERLE is measured per 2 s window; barge-in is a user saying "Okay Nabu, <command>" half a
second into the second of two announcements at levels from 10 dB below our voice to 10 dB
above it, heard with the canceller off and on; the own-voice check plays announcements
that say the wake phrase in other spellings and counts the turns they would open.

CPU is thread time per second of audio on this machine.

`--room` measures the whole hearing path in a simulated living room instead (`benchmarks.room`).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clips import COMMANDS, clip_settings, clips_dir, load_16k, piper_clip
from benchmarks.echo import ANNOUNCEMENTS, CARD_DELAY_S, OWN_SPELLINGS, floats, measure_echo, pcm16
from benchmarks.livemic import Clock, LiveMic
from benchmarks.report import emit, machine
from benchmarks.wake import EVERYDAY, noise_of, speech_rms
from edge_agent.audio.echo import FRAME
from edge_agent.audio.frames import Samples
from edge_agent.audio.frontend import AutoGain, SpeexSuppressor
from edge_agent.audio.reference import PlaybackReference
from edge_agent.commands.context import Context
from edge_agent.config import Settings, WakeSettings
from edge_agent.listen.microphone import open_microphone
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.wake import Detection, WakeEngine

log = logging.getLogger(__name__)

RATE = 16000
NOISES = ("babble", "white", "pink", "music")
USER_LEVELS_DB = (-10.0, -5.0, 0.0, 5.0, 10.0)
"""The user's speech level relative to our voice's echo at the microphone."""
ECHO_RMS = 0.05
"""Our voice at the microphone (-26 dBFS while speaking) in the barge-in and own-voice runs: loud,
as a loudspeaker a hand's width from the microphone is, with room for a user 10 dB above it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--commands", type=int, default=12, help="wake clips (one per command)")
    parser.add_argument("--snr", type=float, nargs="+", default=[10.0, 0.0], help="noise levels (dB SNR)")
    parser.add_argument("--whisper", type=Path, default=None,
                        help="a Whisper export: also WER of the clips in noise, off vs the chosen suppressor")
    parser.add_argument("--no-room", action="store_true", help="a synthetic impulse, not pyroomacoustics")
    parser.add_argument("--seed", type=int, default=11)
    from benchmarks.realroom import add_real_arguments
    from benchmarks.room import add_room_arguments

    add_room_arguments(parser)
    add_real_arguments(parser)


# -- processors under test ---------------------------------------------------------------


class Processor:
    """A chain over 10 ms frames, with its CPU counted."""

    def __init__(self, name: str, make: Callable[[], Callable[[Samples], Samples]] | None) -> None:
        self.name = name
        self.make = make
        self.cpu_s = 0.0
        self.audio_s = 0.0

    def run(self, audio: Samples) -> Samples:
        """`audio` processed by a chain that has heard it once already: a device's gain and noise
        estimate have settled on the room and the talker before the wake word (a fresh chain
        would be judged on its first second)."""
        if self.make is None:
            return audio
        step = self.make()
        usable = audio.size - audio.size % FRAME
        for i in range(0, usable, FRAME):
            step(audio[i:i + FRAME])
        out = np.empty(usable, dtype=np.float32)
        started = time.thread_time()
        for i in range(0, usable, FRAME):
            out[i:i + FRAME] = step(audio[i:i + FRAME])
        self.cpu_s += time.thread_time() - started
        self.audio_s += usable / RATE
        return out


def webrtc(ns: int, agc: int) -> Callable[[], Callable[[Samples], Samples]]:
    """`webrtc-noise-gain` (what wyoming-satellite uses): its suppressor level and gain target."""
    from webrtc_noise_gain import AudioProcessor

    def make() -> Callable[[Samples], Samples]:
        proc = AudioProcessor(agc, ns)

        def step(frame: Samples) -> Samples:
            return floats(proc.Process10ms(pcm16(frame).tobytes()).audio)

        return step

    return make


def speex_gain(level: int) -> Callable[[], Callable[[Samples], Samples]]:
    """`pyspeex-noise`'s own gain control (Home Assistant passes 4000 and more)."""
    from pyspeex_noise import AudioProcessor

    def make() -> Callable[[Samples], Samples]:
        proc = AudioProcessor(level, -30)

        def step(frame: Samples) -> Samples:
            return floats(proc.process_10ms(pcm16(frame).tobytes()))

        return step

    return make


def ours(level: int, gain_dbfs: int = 0, after: bool = False) -> Callable[[], Callable[[Samples], Samples]]:
    """Our front end's gain and suppressor (`pyspeex-noise`), as `audio.*` configures them (`after`:
    the gain after the suppressor instead)."""
    def make() -> Callable[[Samples], Samples]:
        stages: list[Callable[[Samples], Samples]] = []
        if gain_dbfs:
            stages.append(AutoGain(gain_dbfs).process)
        if level:
            stages.append(SpeexSuppressor(level).process)
        if after:  # the other order, measured to show why the front end does not use it
            stages.reverse()

        def step(frame: Samples) -> Samples:
            for stage in stages:
                frame = stage(frame)
            return frame

        return step

    return make


def processors() -> list[Processor]:
    out = [Processor("off", None)]
    out += [Processor(f"pyspeex-noise {n}", ours(n)) for n in (1, 2, 3, 4)]
    try:
        out += [Processor(f"webrtc-noise-gain ns {n}", webrtc(n, 0)) for n in (1, 2, 3, 4)]
        out.append(Processor("webrtc-noise-gain ns 2 + agc 10", webrtc(2, 10)))
    except ImportError as exc:
        log.warning("webrtc-noise-gain not installed (the dev extra): %s", exc)
    out.append(Processor("our gain 10, then pyspeex-noise 2", ours(2, 10)))
    out.append(Processor("pyspeex-noise 2, then our gain 10", ours(2, 10, after=True)))
    out.append(Processor("our gain 10 alone", ours(0, 10)))
    out.append(Processor("pyspeex-noise own gain 4000", speex_gain(4000)))
    return out


# -- signals -------------------------------------------------------------------------------


def padded(audio: Samples) -> Samples:
    return np.concatenate([np.zeros(RATE, np.float32), audio, np.zeros(RATE, np.float32)])


def mixed(clean: Samples, snr_db: float, kind: str, pool: Sequence[Samples],
          rng: np.random.Generator) -> Samples:
    audio = padded(clean)
    gain = speech_rms(clean) / 10 ** (snr_db / 20)
    out: Samples = (audio + gain * noise_of(kind, audio.size, pool, rng)).astype(np.float32)
    return out


def conditions(positives: Sequence[Samples], pool: Sequence[Samples], snrs: Sequence[float],
               rng: np.random.Generator) -> dict[str, list[Samples]]:
    out = {"clean": [padded(p) for p in positives],
           "quiet (-40 dB)": [padded(0.01 * p) for p in positives]}
    out["quiet, -70 dBFS floor"] = [q + rng.normal(0, 10 ** (-70 / 20), q.size).astype(np.float32)
                                    for q in out["quiet (-40 dB)"]]
    for snr in snrs:
        for kind in NOISES:
            out[f"{kind} {snr:g} dB"] = [mixed(p, snr, kind, pool, rng) for p in positives]
    return out


# -- measurements ----------------------------------------------------------------------------


def detected(engine: WakeEngine, audio: Samples) -> bool:
    engine.reset()
    return any(d.model == "okay_nabu" for d in engine.feed(audio))


def measure_suppression(cells: dict[str, list[Samples]], texts: Sequence[str], whisper: Path | None,
                        ) -> dict[str, Any]:
    engine = WakeEngine.load(WakeSettings())
    model = None
    if whisper is not None:
        from edge_agent.asr.whisper import WhisperOnnx

        model = WhisperOnnx.load(whisper)
    results: dict[str, Any] = {}
    for proc in processors():
        row: dict[str, Any] = {}
        for cell, clips in cells.items():
            outs = [proc.run(c) for c in clips]
            row[cell] = round(sum(detected(engine, o) for o in outs) / len(outs), 3)
            if model is not None and proc.name in ("off", "pyspeex-noise 2", "webrtc-noise-gain ns 2") \
                    and ("10 dB" in cell or cell == "clean"):
                from edge_agent.text.wer import wer

                row[f"WER {cell}"] = round(wer(list(texts), [model.recognize(o).text for o in outs]), 3)
        row["cpu_ms_per_s"] = round(1000 * proc.cpu_s / proc.audio_s, 2) if proc.audio_s else 0.0
        results[proc.name] = row
        log.info("%s: %s", proc.name, row)
    return results


def room_impulse(simulated: bool, rng: np.random.Generator, card_delay_s: float = CARD_DELAY_S,
                 ) -> tuple[Samples, str]:
    """Loudspeaker -> microphone, with `card_delay_s` of sound card in front."""
    delay = np.zeros(round(card_delay_s * RATE), dtype=np.float32)
    if simulated:
        try:
            import pyroomacoustics as pra

            room = pra.ShoeBox([5.0, 4.0, 2.6], fs=RATE, materials=pra.Material(0.35), max_order=12)
            room.add_source([1.0, 1.0, 1.0])
            room.add_microphone([1.3, 1.2, 1.0])
            room.compute_rir()
            rir = np.asarray(room.rir[0][0], dtype=np.float32)
            rt60 = float(pra.experimental.measure_rt60(rir, fs=RATE))
            return np.concatenate([delay, rir]), f"pyroomacoustics shoebox 5x4x2.6 m, RT60 {rt60:.2f} s"
        except ImportError:
            log.warning("pyroomacoustics not installed (the dev extra): a synthetic impulse instead")
    n = round(0.15 * RATE)
    t = np.arange(n) / RATE
    tail = rng.normal(0, 0.1, n) * np.exp(-6.9 * t / 0.25)
    tail[0] = 1.0
    return np.concatenate([delay, 0.5 * tail]).astype(np.float32), "synthetic, RT60 0.25 s"


# -- the whole path: sink timeline, live microphone, front end, own-voice guard --------------


def play_and_hear(played: Samples, impulse: Samples, user: Samples | None = None, *, echo_cancel: bool,
                  settings: Settings | None = None, noise: float = 0.003,
                  ) -> tuple[list[Detection], list[Detection]]:
    """Play `played` (0.5 s in) through `impulse` while `user` speaks next to the microphone (from
    the same moment); what the wake engine hears behind the front end, and the detections the
    own-voice guard lets through (the turns that would open)."""
    clock = Clock()
    reference = PlaybackReference(keep_s=30.0, clock=clock)
    lead = np.zeros(RATE // 2, dtype=np.float32)
    echo = np.convolve(played, impulse)[:played.size].astype(np.float32)
    mic = np.concatenate([lead, echo, np.zeros(RATE, dtype=np.float32)])
    if user is not None:
        take = min(user.size, mic.size - lead.size)
        mic[lead.size:lead.size + take] += user[:take]
    mic += np.random.default_rng(5).normal(0, noise, mic.size).astype(np.float32)
    reference.write(played, at=clock.now + lead.size / RATE)
    base = settings or Settings()
    configured = replace(base, audio=replace(base.audio, echo_cancel=echo_cancel))
    heard_by = open_microphone(configured.audio, source=LiveMic(mic, clock), reference=reference,
                               wake=configured.wake)
    source, accept = heard_by.source, heard_by.accept_wake
    engine = WakeEngine.load(WakeSettings())
    heard = [d for block in source.blocks() for d in engine.feed(block)]
    return heard, [d for d in heard if accept is None or accept(d)]


def at_echo_level(played: Samples, impulse: Samples) -> Samples:
    """`played` scaled so that its echo reaches the microphone at `ECHO_RMS`."""
    echo = np.convolve(played, impulse)[:played.size]
    scaled: Samples = (played * np.float32(ECHO_RMS / speech_rms(echo))).astype(np.float32)
    return scaled


def measure_barge_in(say: Callable[[str], Samples], impulse: Samples, commands: Sequence[str],
                     ) -> dict[str, Any]:
    first, second = say(ANNOUNCEMENTS[0]), say(ANNOUNCEMENTS[1])
    gap = np.zeros(RATE, dtype=np.float32)
    played = at_echo_level(np.concatenate([first, gap, second]), impulse)
    echo_rms = ECHO_RMS
    at = first.size + gap.size + RATE // 2
    out: dict[str, Any] = {}
    for level in USER_LEVELS_DB:
        row = {}
        for echo_cancel in (False, True):
            woke = 0
            for text in commands:
                clip = say(f"Okay Nabu, {text[0].lower()}{text[1:]}")
                clip = clip * np.float32(echo_rms * 10 ** (level / 20) / speech_rms(clip))
                user = np.concatenate([np.zeros(at, dtype=np.float32), clip])
                _, accepted = play_and_hear(played, impulse, user, echo_cancel=echo_cancel)
                woke += any(d.model == "okay_nabu" for d in accepted)
            row["on" if echo_cancel else "off"] = round(woke / len(commands), 3)
        out[f"user {level:+g} dB"] = row
        log.info("barge-in, user %+g dB vs our echo: %s", level, row)
    return out


def measure_own_voice(say: Callable[[str], Samples], impulse: Samples) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for text in OWN_SPELLINGS:
        row = {}
        for echo_cancel in (False, True):
            heard, accepted = play_and_hear(at_echo_level(say(text), impulse), impulse,
                                            echo_cancel=echo_cancel)
            row["on" if echo_cancel else "off"] = {"mic_detections": len(heard),
                                                   "turns_opened": len(accepted)}
        out[text] = row
    return out


def idle_cost(seconds: float = 10.0) -> dict[str, float]:
    """CPU of the front end per second of microphone audio while nothing plays (echo cancel on)."""
    clock = Clock()
    reference = PlaybackReference(clock=clock)
    mic = np.random.default_rng(1).normal(0, 0.01, round(seconds * RATE)).astype(np.float32)
    defaults = Settings()
    source = open_microphone(defaults.audio, source=LiveMic(mic, clock), reference=reference,
                             wake=defaults.wake).source
    started = time.thread_time()
    for _ in source.blocks():
        pass
    return {"cpu_ms_per_s": round(1000 * (time.thread_time() - started) / seconds, 2)}


def run(ctx: Context, args: argparse.Namespace) -> int:
    if args.real is not None:
        from benchmarks.realroom import run_real

        return run_real(ctx, args)
    if args.room:
        from benchmarks.room import run_room

        return run_room(ctx, args)
    rng = np.random.default_rng(args.seed)
    directory = clips_dir(ctx.settings.models.cache_dir) / "hear"
    registry = VoiceRegistry(ctx.store, clip_settings(ctx.settings.tts))
    voice = registry.get(ctx.settings.tts.voice)

    def say(text: str) -> Samples:
        return load_16k(piper_clip(text, directory, voice))

    commands = COMMANDS[:args.commands]
    texts = [f"Okay Nabu, {c[0].lower()}{c[1:]}" for c in commands]
    log.info("synthesizing clips (cached in %s)", directory)
    positives = [say(t) for t in texts]
    pool = [say(t) for t in EVERYDAY[:12]]
    cells = conditions(positives, pool, args.snr, rng)
    impulse, room = room_impulse(not args.no_room, rng)
    result: dict[str, Any] = {
        "subject": "hear", "machine": machine(), "clips": len(positives), "room": room,
        "suppression": measure_suppression(cells, texts, args.whisper),
        "echo": measure_echo(say, impulse),
    }
    if "error" not in result["echo"]:
        # A USB or Bluetooth card, or a sound server, puts 200-300 ms in front of the room.
        result["echo_300ms"] = measure_echo(say, room_impulse(not args.no_room, rng, 0.3)[0])
    if "error" not in result["echo"]:
        result["barge_in"] = measure_barge_in(say, impulse, commands[:6])
        result["own_voice"] = measure_own_voice(say, impulse)
        result["front_end_idle"] = idle_cost()
    registry.close()
    emit(result, report_lines(result), args.json)
    return 0


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['clips']} wake clips (our Piper voice); room: {result['room']}",
             "wake detection (okay_nabu) per condition, and CPU per second of audio:"]
    for name, row in result["suppression"].items():
        cells = "  ".join(f"{k} {v}" for k, v in row.items() if k != "cpu_ms_per_s")
        lines.append(f"  {name:32s} {cells}  CPU {row['cpu_ms_per_s']} ms/s")
    echo = result["echo"]
    if "error" in echo:
        lines.append(f"echo cancellation not measured: {echo['error']}")
        return lines
    lines.append(f"echo cancellation, {echo['played_s']} s of our voice through the room:")
    for name, row in echo.items():
        if isinstance(row, dict):
            lines.append(f"  {name}: ERLE first 2 s {row['erle_db_first_2s']} dB, after 4 s median "
                         f"{row['erle_db_after_4s_median']} dB, CPU {row['cpu_ms_per_s']} ms/s")
    slow = result.get("echo_300ms", {})
    for name, row in slow.items():
        if isinstance(row, dict):
            lines.append(f"  300 ms card delay, {name}: ERLE after 4 s median "
                         f"{row['erle_db_after_4s_median']} dB")
    lines.append("barge-in (wake word over our second announcement), detected with the canceller off / on:")
    for level, row in result["barge_in"].items():
        lines.append(f"  {level}: {row['off']} / {row['on']}")
    lines.append("announcements saying the wake phrase: microphone detections -> turns opened (off / on):")
    for text, row in result["own_voice"].items():
        lines.append(f"  {text!r}: {row['off']['mic_detections']} -> {row['off']['turns_opened']} / "
                     f"{row['on']['mic_detections']} -> {row['on']['turns_opened']}")
    lines.append(f"front end while nothing plays: {result['front_end_idle']['cpu_ms_per_s']} ms/s")
    return lines
