"""End of speech -> transcript, measured live: the VAD's end of turn and the end-of-turn model side by side.

`edge-agent listen --json` runs twice at once, one process per end of turn
(`listen.end_of_turn: vad` and `model`), each reading raw 16 kHz PCM from its own
FIFO (`audio.input_pipe`). One writer feeds both FIFOs at the wall clock's pace
(20 ms chunks, as a microphone delivers them): each "Okay Nabu. <command>" clip
goes to one process while the other hears silence, then the same clip to the
other (the order alternates), so both hear every clip under the same load and
never decode at the same moment: while one hears a clip the other only runs its wake
word on silence (its cores then are measured and reported, `idle_cores`). The turn's
last transcript line (a `continued` one is the whole command again and replaces the
first) is timed from the moment the chunk holding the clip's last speech sample was
written to the moment the line was read from the process's stdout: what a person
waits, from outside.

Clips, real and synthetic, reported apart (real speech decides; the synthetic figures stand
beside them):

- real (`--real`, default the repository's `tests/data/real/commands/`, 31 commands of one
  person, each file named by what is said; a folder's `references.json` can say it instead, for a
  corpus whose files are named by id): each recording whole, with the room noise it has
  before and after the speech, after a synthetic "Okay Nabu." (Piper's joe: the wake phrase only
  opens the turn, and the command is what is measured); and two of them joined, the first up to
  0.4-0.8 s after its speech (its own noise fills the pause), the second from just before its
  speech (the reference is both transcripts). A recording's speech ends where its level last
  stands clear of both its noise and its loudest part (`speech_bounds`: the level, so that the
  VAD under test does not place the end it is measured from; Silero puts it 0.18 s later at
  the median); the second command starts where the configured VAD first hears speech in it
  (the level would take the sound most recordings open with for speech). Nothing is tuned on them here,
  so none is held out.
- synthetic: one sentence (the benches' commands), and two sentences with a pause of 0.4-0.8 s
  between them (synthesized apart and joined), by Piper's joe and espeak-ng en-us; their speech
  ends at the last sample above -40 dBFS. With `--sweep`, also the exporter's 176 sweep clips (22
  commands by Piper at three speeds, four espeak-ng voices, and in a noisy reverberant room) after
  the wake phrase, their speech's end found as a real recording's is (the room's hold noise): the
  issue's check that no turn is cut off mid-command.

Per end of turn and kind of clip: p50/p90 of end of speech -> transcript, words kept (the
reference's words found in the last transcript), turns cut short (judged over before the
clip's speech ended, and fewer than half the last sentence's words kept, or the last transcript
out before the clip's speech was: their latency is left out, the speech they ended at is not the
clip's end; words Whisper mishears in a turn that ended after the speech count against words kept
only), turns missed (no transcript), where the turn
was judged over in the audio (stream time after the speech's end of the first transcript's
decision, else of the turn's end: what the end of turn decides, whatever the load), and each
process's CPU (cores used over the whole run: the wake word and the VAD run all along) and peak
RSS. With `--answer` the processes are daemons that speak an answer to each transcript, and end of
speech -> first audio of the answer is timed too (`benchmarks.turnanswer`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clips import Clip, load_16k, read_recording, sweep_set
from benchmarks.report import emit, machine, percentile
from benchmarks.turnanswer import Answerer, Player, device, first_answer, start_daemon
from benchmarks.wake import Voices
from edge_agent.audio.frames import Samples
from edge_agent.audio.wav import to_pcm16
from edge_agent.commands.context import Context
from edge_agent.errors import AudioError, UsageError
from edge_agent.listen.endofturn import MODEL_ID
from edge_agent.mqtt.localbroker import LocalBroker
from edge_agent.text.wer import words
from edge_agent.vad.classifiers import FrameClassifier
from edge_agent.vad.factory import make_classifier

RATE = 16000
CHUNK_S = 0.02
"""What the writer puts into a FIFO at a time: a microphone's period."""
LEAD_S = 0.5
"""Silence before each clip in its slot."""
TAIL_S = 3.0
"""Silence after each clip: past the incomplete-turn wait, Whisper and the wake word's refractory time."""
SPEECH_LEVEL = 0.01
"""-40 dBFS: the last sample above it is the end of speech."""
START_TIMEOUT_S = 120.0
"""Longest a `listen` process may take to open its FIFO."""
ENDS = ("vad", "model")
WAKE = "Okay Nabu."
ONE_SENTENCE = (
    "Turn on the kitchen lights.",
    "What is the weather like tomorrow?",
    "Set a timer for ten minutes.",
    "Play some relaxing music in the living room.",
    "Turn off all the lights downstairs.",
    "Lock the front door.",
    "Add milk and eggs to the shopping list.",
    "Open the garage door and turn on the porch light.",
)
TWO_SENTENCES = (
    ("Dinner is ready.", "Please come to the table."),
    ("Call mom.", "Tell her I'm running late."),
    ("Good night.", "Turn everything off."),
    ("Turn off the oven and", "start the dishwasher."),
    ("Set a timer for ten minutes.", "Then dim the lights."),
)
PAUSES_S = (0.4, 0.6, 0.8, 0.5, 0.7)
"""The pause between the two sentences, by clip (0.4-0.8 s)."""
VOICES = ("piper:joe", "espeak:en-us@175")
WAKE_VOICE = "piper:joe"
"""The voice of the wake phrase before the real commands."""
REAL_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "real" / "commands"
"""Real commands of the repository (tests/data/real/NOTICE.md), when the bench runs from it."""
REAL_NOISE_S = 0.3
"""The end of a real recording, which holds the room's noise after the command."""
REAL_OVER_NOISE = 2.0
"""A 20 ms frame of a real recording is speech over twice (+6 dB) its noise's RMS..."""
REAL_UNDER_PEAK = 0.03
"""... and over a tenth (-20 dB) of its loudest frame's..."""
REAL_RUN = 3
"""... in a run of this many frames (60 ms)."""
REAL_LEAD_S = 0.05
"""Kept before the speech of a second real command (its onset may be softer than a frame)."""
KINDS = ("real", "synthetic")
REFERENCES = "references.json"
"""In a folder of real recordings: what each one says, where the file names do not."""


@dataclass(frozen=True)
class TurnClip:
    """One "Okay Nabu. <command>" clip and what was said after the wake word."""

    name: str
    audio: Samples
    sentences: tuple[str, ...]
    last_speech: int
    """Index of the clip's last speech sample."""
    real: bool = False
    """The command is a recording of a person (the wake phrase before it is synthetic)."""


@dataclass
class Slot:
    """One clip written into one process's FIFO."""

    end: str
    clip: TurnClip
    started: float = 0.0
    speech_written: float = 0.0
    """Monotonic time the chunk holding the clip's last speech sample was written."""
    speech_end_s: float = 0.0
    """Stream time (seconds of audio the process has read) of the clip's last speech sample."""
    vad_end_s: float | None = None
    """Stream time the VAD put the end of the command's speech at (the transcript's `end`)."""
    decided_s: float | None = None
    """Stream time the turn was judged over (the `turn_end` event's `time`)."""
    heard: list[tuple[float, str]] = field(default_factory=list)
    """(arrival time, text) of each transcript line that came during this slot."""
    answered: float | None = None
    """Monotonic time the first audio of the answer played (`--answer`; None: no answer)."""
    answered_early: bool = False
    """An answer began before the clip's speech ended (to a first sentence taken for the command)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--one", type=int, default=len(ONE_SENTENCE),
                        help=f"one-sentence commands per voice (at most {len(ONE_SENTENCE)})")
    parser.add_argument("--two", type=int, default=len(TWO_SENTENCES),
                        help=f"two-sentence commands per voice (at most {len(TWO_SENTENCES)})")
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep each listen process's log (at info level) in this directory")
    parser.add_argument("--voices", default=",".join(VOICES),
                        help="comma-separated voices (default %(default)s)")
    parser.add_argument("--real", default=str(REAL_DIR) if REAL_DIR.is_dir() else "none",
                        help="folder of real commands, FLAC or WAV named by what is said (or listed with "
                             "it in the folder's references.json), or 'none' "
                             "(default %(default)s)")
    parser.add_argument("--real-one", type=int, default=None,
                        help="real one-command clips (default: every recording)")
    parser.add_argument("--real-two", type=int, default=None,
                        help="real two-command clips (default: half the recordings, each used once)")
    parser.add_argument("--sweep", action="store_true",
                        help="also the exporter's 176 sweep clips (22 commands by several voices and speeds, "
                             "and in a noisy room), each after the wake phrase: are any cut short?")
    parser.add_argument("--answer", action="store_true",
                        help="run two daemons on a private mosquitto instead of `listen`, answer each "
                             "transcript, and time end of speech -> first audio of the answer too")


def run(ctx: Context, args: argparse.Namespace) -> int:
    counts_ok = 0 <= args.one <= len(ONE_SENTENCE) and 0 <= args.two <= len(TWO_SENTENCES)
    if not counts_ok:
        raise UsageError(f"--one 0..{len(ONE_SENTENCE)} and --two 0..{len(TWO_SENTENCES)}")
    if ctx.store.locate(MODEL_ID) is None:
        raise UsageError(f"the end-of-turn model is not present: run `edge-agent models fetch {MODEL_ID}`")
    speaker = Voices(ctx, kokoro=False)
    clips = real_set(ctx, args, speaker) + make_clips(speaker, args.voices.split(","), args.one, args.two)
    if args.sweep:
        clips += sweep_clips(sweep_set(ctx.store), trimmed(speaker.say(WAKE_VOICE, WAKE)))
    if not clips:
        raise UsageError("no clips: --one, --two, --real-one or --real-two must leave at least one")
    load_before = os.getloadavg()
    measured = measure(clips, passed_on(args), args.logs, answer=args.answer)
    result = summarise(measured, clips)
    result |= {"bench": "turn", "machine": machine(), "load_avg_before": load_before[0],
               "load_avg_after": os.getloadavg()[0], "clips": len(clips)}
    emit(result, report(result), args.json)
    return 0


def real_set(ctx: Context, args: argparse.Namespace, speaker: Voices) -> list[TurnClip]:
    """The real clips `--real`, `--real-one` and `--real-two` ask for."""
    if args.real == "none":
        return []
    recordings = load_recordings(Path(args.real), make_classifier(ctx.settings.vad, ctx.store))
    one = len(recordings) if args.real_one is None else args.real_one
    two = len(recordings) // 2 if args.real_two is None else args.real_two
    if not (0 <= one <= len(recordings) and 0 <= two <= len(recordings) // 2):
        raise UsageError(f"--real-one 0..{len(recordings)} and --real-two 0..{len(recordings) // 2} "
                         f"({len(recordings)} recordings in {args.real})")
    return real_clips(recordings, trimmed(speaker.say(WAKE_VOICE, WAKE)), one, two)


def passed_on(args: argparse.Namespace) -> list[str]:
    """Our config and overrides, so `listen` runs as configured."""
    passed = ["--config", args.config] if getattr(args, "config", None) else []
    for item in getattr(args, "overrides", None) or []:
        passed += ["--set", item]
    return passed


def make_clips(speaker: Voices, voices: list[str], one: int, two: int) -> list[TurnClip]:
    """The synthetic clips, synthesized once into the clip cache (`benchmarks.wake.Voices`)."""
    known = speaker.names(kokoro=False)
    clips = []
    for voice in voices:
        if voice not in known:
            raise UsageError(f"--voices: unknown voice {voice!r} (known: {', '.join(known)})")
        for text in ONE_SENTENCE[:one]:
            clips.append(turn_clip(f"{voice} {text}", speaker.say(voice, f"{WAKE} {text}"), (text,)))
        for (first, second), pause in zip(TWO_SENTENCES[:two], PAUSES_S, strict=False):
            head = trimmed(speaker.say(voice, f"{WAKE} {first}"))
            tail = trimmed(speaker.say(voice, second), keep_start=False)
            audio = np.concatenate([head, np.zeros(round(pause * RATE), dtype=np.float32), tail])
            clips.append(turn_clip(f"{voice} {first} <{pause} s> {second}", audio, (first, second)))
    return clips


@dataclass(frozen=True)
class Recording:
    """A real command: its audio (16 kHz), what is said, and where its speech is (sample indices)."""

    text: str
    audio: Samples
    speech_end: int
    """One past the last speech sample (`speech_bounds`)."""
    onset: int
    """The first sample of the first frame the configured VAD hears speech in."""
    name: str = ""
    """Its file's name."""


def load_recordings(directory: Path, vad: FrameClassifier) -> list[Recording]:
    """The real commands in `directory` (`*.flac`, `*.wav`), in name order, each with what is said: its
    entry in the folder's `references.json` (`{"file name": "reference text"}`, where the names are
    not the texts: a corpus's ids), else its name without the suffix; `vad` finds where their speech
    starts."""
    if not directory.is_dir():
        raise UsageError(f"--real: {directory} is not a folder")
    paths = sorted(p for p in directory.iterdir() if p.suffix.lower() in (".flac", ".wav"))
    if not paths:
        raise UsageError(f"--real: no .flac or .wav recordings in {directory}")
    references = load_references(directory / REFERENCES)
    recordings = []
    for path in paths:
        audio = load_recording(path)
        bounds, onset = speech_bounds(audio), speech_onset(audio, vad)
        if bounds is None or onset is None:
            raise UsageError(f"--real: {path.name}: no speech heard in it")
        text = references.get(path.name, path.stem)
        recordings.append(Recording(text, audio, bounds[1], min(onset, bounds[1] - 1), path.name))
    return recordings


def load_references(path: Path) -> dict[str, str]:
    """`references.json` of a folder of recordings: file name -> what is said ({} when there is none)."""
    if not path.exists():
        return {}
    try:
        references = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"--real: {path}: not readable JSON ({exc})") from None
    if not isinstance(references, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in references.items()):
        raise UsageError(f"--real: {path}: must map each file name to a non-empty reference text")
    return references


def load_recording(path: Path) -> Samples:
    """A recording as 16 kHz mono float32: WAV through the clips' reader, FLAC through soundfile."""
    if path.suffix.lower() == ".wav":
        return load_16k(path)
    try:
        return read_recording(path)
    except AudioError as exc:
        raise UsageError(f"--real: {exc}") from None


def speech_bounds(audio: Samples) -> tuple[int, int] | None:
    """(first, one past the last) sample of the loud part of a real recording: the first and the last run
    of `REAL_RUN` 20 ms frames whose RMS is over both twice (+6 dB) the recording's noise and a tenth
    (-20 dB) of its loudest frame. The noise is the louder of its quietest frames (10th percentile)
    and its last `REAL_NOISE_S` (a room gets noisier after a command as often as not: a fan, the
    microphone's gain rising). A run, so that a burst of noise or a click is not speech."""
    frame = round(CHUNK_S * RATE)
    n = audio.size // frame
    tail = round(REAL_NOISE_S / CHUNK_S)
    if n < max(REAL_RUN, tail):
        return None
    rms = np.sqrt(np.mean(np.square(audio[:n * frame].reshape(n, frame), dtype=np.float64), axis=1))
    noise = max(float(np.percentile(rms, 10)), float(np.median(rms[-tail:])))
    loud = rms > max(REAL_OVER_NOISE * noise, REAL_UNDER_PEAK * float(rms.max()))
    runs = np.nonzero(np.convolve(loud, np.ones(REAL_RUN), mode="valid") == REAL_RUN)[0]
    if runs.size == 0:
        return None
    return int(runs[0]) * frame, (int(runs[-1]) + REAL_RUN) * frame


def speech_onset(audio: Samples, vad: FrameClassifier) -> int | None:
    """Where `vad` first hears speech. Not the level: most of the recordings open with a loud sound
    that decays over 0.3-0.6 s before the speech (a chime, by its shape)."""
    vad.reset()
    size = vad.frame_samples
    for start in range(0, audio.size - size + 1, size):
        if vad.is_speech(audio[start:start + size]):
            return start
    return None


def after_wake(wake: Samples) -> Samples:
    """The wake phrase and a breath (0.1 s) before a recorded command."""
    return np.concatenate([wake, np.zeros(round(0.1 * RATE), dtype=np.float32)])


def real_clips(recordings: list[Recording], wake: Samples, one: int, two: int) -> list[TurnClip]:
    """"Okay Nabu." (synthetic, `wake`) and one real command, for the first `one` recordings; then
    `two` clips of two: recording i with recording i + half, the pause from the first one's end of
    speech to where the VAD hears the second's start 0.4-0.8 s (`PAUSES_S` in turn), filled with the
    first one's own noise."""
    head = after_wake(wake)
    clips = []
    for rec in recordings[:one]:
        clips.append(TurnClip(f"real {rec.text}", np.concatenate([head, rec.audio]).astype(np.float32),
                              (rec.text,), head.size + rec.speech_end - 1, real=True))
    half = len(recordings) // 2
    for i in range(two):
        first, second = recordings[i], recordings[i + half]
        pause = PAUSES_S[i % len(PAUSES_S)]
        lead = min(second.onset, round(REAL_LEAD_S * RATE))
        upto = first.speech_end + round(pause * RATE) - lead
        said = first.audio[:upto]
        if said.size < upto:  # the recording stops before the pause is over: silence after its noise
            said = np.concatenate([said, np.zeros(upto - said.size, dtype=np.float32)])
        tail = second.audio[second.onset - lead:]
        audio = np.concatenate([head, said, tail]).astype(np.float32)
        last = head.size + said.size + (second.speech_end - (second.onset - lead)) - 1
        clips.append(TurnClip(f"real {first.text} <{pause} s> {second.text}", audio,
                              (first.text, second.text), last, real=True))
    return clips


def sweep_clips(sweep: list[Clip], wake: Samples) -> list[TurnClip]:
    """"Okay Nabu." (`wake`) and each clip of the exporter's sweep (synthetic; the room's clips hold
    noise, so their speech ends by the level against the noise, `speech_bounds`)."""
    head = after_wake(wake)
    clips = []
    for clip in sweep:
        audio = clip.audio()
        bounds = speech_bounds(audio)
        if bounds is None:
            raise UsageError(f"--sweep: {clip.path.name}: no speech heard in it")
        joined = np.concatenate([head, audio]).astype(np.float32)
        last = head.size + bounds[1] - 1
        clips.append(TurnClip(f"sweep {clip.engine} {clip.text}", joined, (clip.text,), last))
    return clips


def trimmed(audio: Samples, keep_start: bool = True) -> Samples:
    """`audio` without the silence after its speech (and, unless `keep_start`, before it)."""
    voiced = np.nonzero(np.abs(audio) > SPEECH_LEVEL)[0]
    if voiced.size == 0:
        return audio
    return audio[0 if keep_start else voiced[0]:voiced[-1] + 1]


def turn_clip(name: str, audio: Samples, sentences: tuple[str, ...]) -> TurnClip:
    voiced = np.nonzero(np.abs(audio) > SPEECH_LEVEL)[0]
    return TurnClip(name, audio.astype(np.float32), sentences, int(voiced[-1]) if voiced.size else 0)


# -- the live run ------------------------------------------------------------------------


@dataclass
class Listener:
    """One `edge-agent listen --json` process and its FIFO."""

    end: str
    fifo: Path
    proc: subprocess.Popen[bytes]
    lines: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    log: Path | None = None
    reader: threading.Thread | None = None
    writer: int = -1
    player: Player | None = None
    """What a daemon's answers play into (`--answer`)."""

    def read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            arrived = time.monotonic()
            try:
                self.lines.append((arrived, json.loads(raw)))
            except ValueError:
                continue  # a log line on stdout is not an event


def measure(clips: list[TurnClip], passed: list[str], logs: Path | None = None,
            answer: bool = False) -> dict[str, Any]:
    """Feed every clip to both ends of turn, live; the slots with their transcripts and each process's
    CPU and memory. `logs`: where each process's log stays (else it goes with the FIFOs). `answer`:
    the processes are daemons that answer each transcript (`benchmarks.turnanswer`)."""
    with tempfile.TemporaryDirectory(prefix="edge-bench-turn-") as tmp, ExitStack() as stack:
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
        if answer:
            listeners = answering(Path(tmp), passed, logs or Path(tmp), stack)
        else:
            listeners = [start_listener(end, Path(tmp), passed, logs or Path(tmp)) for end in ENDS]
        try:
            for listener in listeners:
                listener.writer = open_writer(listener)
            slots = [Slot(ENDS[(i + k) % 2], clip) for i, clip in enumerate(clips) for k in range(2)]
            cpu_before = {lst.end: cpu_seconds(lst.proc.pid) for lst in listeners}
            started = time.monotonic()
            idle_cpu = feed(listeners, slots)
            wall = time.monotonic() - started
            cpu = {lst.end: cpu_seconds(lst.proc.pid) - cpu_before[lst.end] for lst in listeners}
            rss = {lst.end: peak_rss_mb(lst.proc.pid) for lst in listeners}
        finally:
            for listener in listeners:
                stop(listener)
    for listener in listeners:
        mine = [s for s in slots if s.end == listener.end]
        assign(listener, mine)
        if listener.player is not None:
            for slot, after in zip(mine, [*mine[1:], None], strict=True):
                until = after.started if after is not None else float("inf")
                slot.answered, slot.answered_early = first_answer(listener.player.audible, slot.started,
                                                                  slot.speech_written, until)
    return {"slots": slots, "cpu_s": cpu, "wall_s": wall, "peak_rss_mb": rss, "idle_cores": idle_cpu,
            "errors": {lst.end: lst.proc.returncode for lst in listeners}, "answer": answer}


def answering(tmp: Path, passed: list[str], logs: Path, stack: ExitStack) -> list[Listener]:
    """Two daemons on a private mosquitto, their players, and the client answering their transcripts
    (closed by `stack`, after the daemons: `stop`)."""
    broker = LocalBroker(tmp / "broker", persistence=False).start()
    stack.callback(broker.stop)
    listeners: list[Listener] = []
    by_device: dict[str, Listener] = {}

    def heard(device_id: str, arrived: float, doc: dict[str, Any]) -> None:
        if device_id in by_device:
            by_device[device_id].lines.append((arrived, doc))

    answerer = Answerer(broker.url, heard)
    stack.callback(answerer.close)
    for end in ENDS:
        fifo = tmp / f"{end}.pcm"
        os.mkfifo(fifo)
        player = Player(tmp / f"{end}.out").start()
        stack.callback(player.close)
        proc = start_daemon(end, fifo, player.path, url=broker.url, tmp=tmp, passed=passed,
                            log=logs / f"{end}.log")
        listener = Listener(end, fifo, proc, log=logs / f"{end}.log", player=player)
        by_device[device(end)] = listener
        listeners.append(listener)
    return listeners


def start_listener(end: str, tmp: Path, passed: list[str], logs: Path) -> Listener:
    fifo = tmp / f"{end}.pcm"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-m", "edge_agent", "listen", "-v", "--json", *passed,
           "--set", f'audio.input_pipe="{fifo}"', "--set", f"audio.input_rate={RATE}",
           "--set", "audio.input_channels=1", "--set", f"listen.end_of_turn={end}"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=(logs / f"{end}.log").open("wb"))
    listener = Listener(end, fifo, proc, log=logs / f"{end}.log")
    listener.reader = threading.Thread(target=listener.read, name=f"turn-{end}", daemon=True)
    listener.reader.start()
    return listener


def open_writer(listener: Listener) -> int:
    """The FIFO's write end, once the process has opened it for reading (after loading its models)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            fd = os.open(listener.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            if listener.proc.poll() is not None:
                # Exit 2 is a usage error (no Whisper export, a bad setting): the bench's own as well.
                error = UsageError if listener.proc.returncode == 2 else RuntimeError
                raise error(f"listen ({listener.end}) exited {listener.proc.returncode} before "
                            f"reading: {log_tail(listener)}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"listen ({listener.end}) did not open its FIFO in "
                                   f"{START_TIMEOUT_S:.0f} s") from None
            time.sleep(0.1)  # polling a FIFO for its reader: there is no event to wait on
            continue
        os.set_blocking(fd, True)
        return fd


def feed(listeners: list[Listener], slots: list[Slot]) -> dict[str, float]:
    """Write each slot into its process's FIFO and silence into the others', at the wall clock's pace;
    the cores each process used while the others' slots ran (what it took from the one measured)."""
    chunk = round(CHUNK_S * RATE)
    lead = np.zeros(round(LEAD_S * RATE), dtype=np.float32)
    tail = np.zeros(round(TAIL_S * RATE), dtype=np.float32)
    silence = to_pcm16(np.zeros(chunk, dtype=np.float32))
    t0 = time.monotonic()
    written = 0
    idle = dict.fromkeys((lst.end for lst in listeners), 0.0)
    idle_wall = dict.fromkeys((lst.end for lst in listeners), 0.0)
    for slot in slots:
        others = [lst for lst in listeners if lst.end != slot.end]
        cpu_before = [cpu_seconds(lst.proc.pid) for lst in others]
        wall_before = time.monotonic()
        audio = np.concatenate([lead, slot.clip.audio, tail])
        speech_end = lead.size + slot.clip.last_speech
        slot.started = time.monotonic()
        slot.speech_end_s = (written + speech_end + 1) / RATE
        for start in range(0, audio.size, chunk):
            due = t0 + written / RATE
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)  # pacing at the wall clock, not a wait for anything
            pcm = to_pcm16(audio[start:start + chunk])
            for listener in listeners:
                os.write(listener.writer, pcm if listener.end == slot.end else silence[:len(pcm)])
            if start <= speech_end < start + chunk:
                slot.speech_written = time.monotonic()
            written += min(chunk, audio.size - start)
        for listener, before in zip(others, cpu_before, strict=True):
            idle[listener.end] += cpu_seconds(listener.proc.pid) - before
            idle_wall[listener.end] += time.monotonic() - wall_before
    return {end: idle[end] / idle_wall[end] if idle_wall[end] else 0.0 for end in idle}


def assign(listener: Listener, slots: list[Slot]) -> None:
    """Each transcript line belongs to the last slot of its process that started before it arrived."""
    for arrived, doc in listener.lines:
        owner = None
        for slot in slots:
            if slot.started <= arrived:
                owner = slot
        if owner is None:
            continue
        if doc.get("event") == "transcript":
            owner.heard.append((arrived, str(doc.get("text", ""))))
            if owner.vad_end_s is None:
                owner.vad_end_s = float(doc.get("end", 0.0))
            if owner.decided_s is None and doc.get("time") is not None:
                # Judged complete, the turn stays open for a continuation: the transcript's own time
                # is where it was decided, the turn's end comes later.
                owner.decided_s = float(doc["time"])
        elif doc.get("event") == "turn_end" and owner.decided_s is None:
            owner.decided_s = float(doc.get("time", 0.0))


def stop(listener: Listener) -> None:
    if listener.writer >= 0:
        os.close(listener.writer)
    listener.proc.terminate()
    try:
        listener.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        listener.proc.kill()
        listener.proc.wait(timeout=30)
    if listener.reader is not None:
        listener.reader.join(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (`/proc/PID/stat`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def log_tail(listener: Listener) -> str:
    path = listener.log
    return path.read_text(errors="replace").strip()[-400:] if path is not None and path.exists() else ""


# -- the figures -------------------------------------------------------------------------


def kept(reference: str, heard: str) -> tuple[int, int]:
    """(reference words found in `heard`, reference words)."""
    ref, hyp = Counter(words(reference)), Counter(words(heard))
    return sum(min(n, hyp[w]) for w, n in ref.items()), sum(ref.values())


def summarise(measured: dict[str, Any], clips: list[TurnClip]) -> dict[str, Any]:
    """The figures per kind of clip (`real`, `synthetic`: each present only with clips of its kind) and
    end of turn; CPU and memory are each process's over the whole run. The goals are judged on the real
    clips where there are any."""
    result: dict[str, Any] = {}
    for kind in KINDS:
        chosen = [s for s in measured["slots"] if s.clip.real == (kind == "real")]
        if chosen:
            result[kind] = {end: figures([s for s in chosen if s.end == end], measured, end) for end in ENDS}
            vad, model = result[kind]["vad"], result[kind]["model"]
            result[kind]["ratio_p50"] = model["p50_s"] / vad["p50_s"]
            result[kind]["ratio_p90"] = model["p90_s"] / vad["p90_s"]
    result["wall_s"] = measured["wall_s"]
    turns = len(clips)
    processes = {end: {"cpu_cores": measured["cpu_s"][end] / measured["wall_s"],
                       "cpu_s": measured["cpu_s"][end], "idle_cores": measured["idle_cores"][end],
                       "peak_rss_mb": measured["peak_rss_mb"][end]} for end in ENDS}
    result["processes"] = processes
    # Both processes run the wake word and the VAD over the whole run: the difference is what judging
    # each pause costs (the model, and Whisper decoding at pauses the VAD would not have ended at).
    extra_s = processes["model"]["cpu_s"] - processes["vad"]["cpu_s"]
    result["model_extra_cpu_per_turn_s"] = extra_s / max(1, turns)
    judged = "real" if "real" in result else "synthetic"
    vad, model = result[judged]["vad"], result[judged]["model"]
    result["goals"] = {
        "on": judged,
        "p50_le_0.30": model["p50_s"] <= 0.30, "p90_le_0.50": model["p90_s"] <= 0.50,
        "two_sentence_words_kept_ge_vad": not model["words_kept_two"] < vad["words_kept_two"],
    }
    if "answer_p50_s" in model:
        result["goals"]["answer_p50_le_0.45"] = model["answer_p50_s"] <= 0.45
    else:  # the goal is listening's: a daemon's RSS holds its voice and the rest as well
        result["goals"]["rss_le_330_mb"] = processes["model"]["peak_rss_mb"] <= 330.0
    return result


def figures(slots: list[Slot], measured: dict[str, Any], end: str) -> dict[str, Any]:
    """One end of turn's figures over `slots` (the clips of one kind)."""
    latencies, kept_words, total_words, cut, missed = [], 0, 0, 0, 0
    vad_lag: list[float] = []
    decided: list[float] = []
    by_kind: dict[str, list[float]] = {"one": [], "two": []}
    answers: list[float] = []
    for slot in slots:
        text = final_text(slot)
        got, of = kept(" ".join(slot.clip.sentences), text)
        kept_words += got
        total_words += of
        last_got, last_of = kept(slot.clip.sentences[-1], text)
        if not slot.heard:
            missed += 1
            continue
        if cut_short(slot, last_got, last_of):
            cut += 1  # its end of speech is not the clip's: no latency to measure
            continue
        # The line that completes the turn: a continuation comes after the first transcript, and it
        # is the one that ends at the clip's end of speech.
        latency = slot.heard[-1][0] - slot.speech_written
        latencies.append(latency)
        if slot.vad_end_s is not None and slot.decided_s is not None:
            vad_lag.append(slot.vad_end_s - slot.speech_end_s)
            decided.append(slot.decided_s - slot.speech_end_s)
        by_kind["two" if len(slot.clip.sentences) > 1 else "one"].append(latency)
        if slot.answered is not None and not slot.answered_early:
            answers.append(slot.answered - slot.speech_written)
    answered = {} if not measured.get("answer") else {
        "answer_p50_s": percentile(answers, 50), "answer_p90_s": percentile(answers, 90),
        "answers_timed": len(answers), "answered_early": sum(s.answered_early for s in slots),
        "unanswered": sum(s.answered is None for s in slots if s.heard),
        "answer_latencies_s": [round(x, 3) for x in answers]}
    return answered | {
        "turns": len(slots), "p50_s": percentile(latencies, 50), "p90_s": percentile(latencies, 90),
        "p50_one_s": percentile(by_kind["one"], 50), "p50_two_s": percentile(by_kind["two"], 50),
        "words_kept": kept_words / total_words if total_words else float("nan"),
        "words_kept_two": two_sentence_words(slots),
        "cut_short": cut, "missed": missed, "latencies_s": [round(x, 3) for x in latencies],
        "vad_end_lag_p50_s": percentile(vad_lag, 50), "decided_after_p50_s": percentile(decided, 50),
        "cpu_cores": measured["cpu_s"][end] / measured["wall_s"],
        "peak_rss_mb": measured["peak_rss_mb"][end],
        "heard": [[s.clip.name, " | ".join(t for _, t in s.heard)] for s in slots],
    }


def cut_short(slot: Slot, last_got: int, last_of: int) -> bool:
    """Whether the turn ended before the clip's speech: judged over before the speech ended with
    fewer than half the last sentence's words kept, or its last transcript out before the last
    speech was written (whatever its words: a reference of a command's slot values, "coffee, light
    roast", shares words with the command before it)."""
    if slot.heard and slot.heard[-1][0] < slot.speech_written:
        return True
    return last_got * 2 < last_of and (slot.decided_s is None or slot.decided_s < slot.speech_end_s)


def final_text(slot: Slot) -> str:
    """What the turn was heard as in the end: its last transcript (a `continued` one is the whole
    command again and replaces the first)."""
    return slot.heard[-1][1] if slot.heard else ""


def two_sentence_words(slots: list[Slot]) -> float:
    got = of = 0
    for slot in slots:
        if len(slot.clip.sentences) > 1:
            g, o = kept(" ".join(slot.clip.sentences), final_text(slot))
            got, of = got + g, of + o
    return got / of if of else float("nan")


def report(result: dict[str, Any]) -> list[str]:
    kinds = [k for k in KINDS if k in result]
    lines = [f"end of speech -> transcript, live through a FIFO at the wall clock's pace: {result['clips']} "
             f"clips per end of turn; load average {result['load_avg_before']:.2f} before, "
             f"{result['load_avg_after']:.2f} after, {result['machine']['cpus']} CPUs",
             f"  {'clips':<9} {'end':<6} {'turns':>5} {'p50':>6} {'p90':>6} {'p50 1st':>8} {'p50 2nd':>8} "
             f"{'kept':>6} {'kept 2':>7} {'cut':>4} {'miss':>5} {'cores':>6} {'RSS MB':>7}"]
    for kind in kinds:
        for end in ENDS:
            r = result[kind][end]
            lines.append(f"  {kind:<9} {end:<6} {r['turns']:5d} {r['p50_s']:6.3f} {r['p90_s']:6.3f} "
                         f"{r['p50_one_s']:8.3f} {r['p50_two_s']:8.3f} {r['words_kept']:6.3f} "
                         f"{r['words_kept_two']:7.3f} {r['cut_short']:4d} {r['missed']:5d} "
                         f"{r['cpu_cores']:6.3f} {r['peak_rss_mb']:7.1f}")
    for kind in kinds:
        for end in ENDS:
            r = result[kind][end]
            if "answer_p50_s" in r:
                lines.append(f"  {kind} {end}: end of speech -> first answer audio p50 "
                             f"{r['answer_p50_s']:.3f} s, p90 {r['answer_p90_s']:.3f} s over "
                             f"{r['answers_timed']} turns; answered while the speech went on: "
                             f"{r['answered_early']}; no answer after the speech: {r['unanswered']}")
    for kind in kinds:
        ratios = result[kind]
        lines.append(f"  {kind}: model / vad p50 {ratios['ratio_p50']:.2f}, p90 {ratios['ratio_p90']:.2f}")
    lines.append("  ('1st': one sentence, '2nd': two with a 0.4-0.8 s pause; 'kept 2': their words kept; "
                 "'real': recordings of a person after a synthetic wake phrase; cores and RSS: each process "
                 "over the whole run)")
    for kind in kinds:
        for end in ENDS:
            r = result[kind][end]
            if r["decided_after_p50_s"] != r["decided_after_p50_s"]:
                continue  # NaN: the daemon's MQTT transcript does not say where the turn was decided
            lines.append(f"  {kind} {end}: the VAD put the speech's end {r['vad_end_lag_p50_s']:+.3f} s "
                         f"from the clip's, the turn was judged over {r['decided_after_p50_s']:.3f} s of "
                         f"audio after it (p50); the rest is Whisper, the model and any backlog")
    extra = result["model_extra_cpu_per_turn_s"]
    processes = result["processes"]
    lines.append(f"  CPU: the model's process used {extra:+.3f} s more per turn than the VAD-only one "
                 f"(both run the wake word and the VAD all along); while the other's clip ran, the idle "
                 f"one took {processes['vad']['idle_cores']:.3f} (vad) and "
                 f"{processes['model']['idle_cores']:.3f} (model) cores")
    goals = ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in result["goals"].items() if k != "on")
    lines.append(f"  goals (model, {result['goals']['on']} clips): {goals}")
    for kind in kinds:
        for end in ENDS:
            for name, text in result[kind][end]["heard"]:
                lines.append(f"  {end:<6} {name[:60]:<60} -> {text}")
    return lines
