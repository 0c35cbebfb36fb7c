"""The one set of speech clips with known text, made on this machine: espeak-ng and our Piper voice.

No recordings ship with the project. `bench asr`, the exporter (`edge-export whisper`) and the
tests all draw from one set, smart-speaker commands and one paragraph, synthesized once and kept
in `<models.cache_dir>/clips/` keyed by engine, voice and text: a clip is never regenerated, so
every later run, and every consumer, measures the very same audio. Both engines are deterministic
(Piper with its voice's noise off, `clip_settings`), so every machine makes the same samples too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import resample
from edge_agent.audio.sinks import WavSink
from edge_agent.audio.wav import read_wav
from edge_agent.config import TtsSettings
from edge_agent.errors import AudioError, UsageError
from edge_agent.models import ModelStore
from edge_agent.tts.piper import PiperVoice
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import Voice, synthesize

COMMANDS = (
    "Turn on the kitchen lights.",
    "What is the weather like tomorrow?",
    "Set a timer for ten minutes.",
    "Play some relaxing music in the living room.",
    "Turn off all the lights downstairs.",
    "What time is it?",
    "Remind me to call my mother at six o'clock this evening.",
    "Lock the front door.",
    "Set the thermostat to twenty one degrees.",
    "Add milk and eggs to the shopping list.",
    "Stop the music.",
    "Open the garage door and turn on the porch light.",
)
"""Smart-speaker commands, about 1 to 4 seconds each when spoken."""

PARAGRAPH = (
    "The washing machine in the basement has finished its cycle, and the clothes should be "
    "moved to the dryer right away so that they do not start to smell. Remember that the back "
    "door is still unlocked, and the cat has not been fed since lunch. The heating will switch "
    "off at midnight unless somebody changes the schedule on the panel in the hall."
)
"""About twenty seconds of speech: long input for the exporter's parity and timing."""

ENGINES = ("espeak", "piper")
ESPEAK_VOICE = "en-us"
PIPER_VOICE = "en_US-joe-medium"
RATE = 16000
"""Hertz of `Clip.audio()`, what the VAD and Whisper read."""
PIPER_TAKE = "noiseless"
"""In a Piper clip's key: clips made before the noise was turned off were one random take each
(a different one on every machine) and are not reused."""
CLIP_THREADS = 2
"""Cores a Piper clip is made with, whatever `tts.threads` says: they set how the vocoder is cut
into windows, and one core instead of two changes a few samples by one step."""

EXPORT_SET: tuple[tuple[str, str], ...] = (
    *((text, ENGINES[i % 2]) for i, text in enumerate(COMMANDS[:6])),
    (PARAGRAPH, "piper"),
)
"""`(text, engine)` the exporter measures on: six commands, three per voice, then the paragraph."""

SWEEP_TEXTS = (
    *COMMANDS,
    "Dinner is ready. Please come to the table.",
    "Turn it up.",
    "Pause.",
    "Dim the bedroom lights to thirty percent.",
    "Call mom. Tell her I'm running late.",
    "Is the back door locked?",
    "Good night. Turn everything off.",
    "Skip this song.",
    "How long until my timer is done?",
    "Open the blinds in the living room, please.",
)
"""Twenty-two commands: the bench's twelve, ten more (short ones and two sentences in one)."""
PIPER_SPEEDS = (0.8, 1.0, 1.25)
"""Piper length scales in the sweep: fast, the voice's own, slow."""
ESPEAK_VOICES = (("en-us", 175), ("en-us+m7", 200), ("en-gb+m3", 150), ("en-us+f3", 165))
"""espeak-ng voices and words per minute in the sweep."""
ROOM = (0.5, 15.0)
"""The sweep's room: reverberation time (s) and signal-to-noise ratio (dB) of a far talker."""


@dataclass(frozen=True)
class Clip:
    """A WAV file and the words spoken in it."""

    text: str
    engine: str
    path: Path

    @property
    def name(self) -> str:
        return self.path.stem

    def audio(self) -> Samples:
        """The clip as 16 kHz mono float32 (a fresh copy: callers may change it)."""
        return load_16k(self.path)

    @property
    def duration_s(self) -> float:
        return len(_read_16k(self.path)) / RATE


def load_16k(path: Path) -> Samples:
    """A clip file as 16 kHz mono float32 (a fresh copy: callers may change it)."""
    audio: Samples = _read_16k(path).copy()
    return audio


def read_recording(path: Path) -> Samples:
    """A recording (WAV, FLAC, any rate and channels) as 16 kHz mono float32, its channels averaged;
    an `AudioError` naming the file where it does not decode or holds no audio."""
    import soundfile  # a dependency of the device (ESPHome media)

    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, ValueError, soundfile.LibsndfileError) as exc:
        raise AudioError(f"{path.name}: not a readable recording ({exc})") from None
    if data.shape[0] == 0:
        raise AudioError(f"{path.name}: not a readable recording (no audio)")
    return resample(data.mean(axis=1).astype(np.float32), int(rate), RATE)


@lru_cache(maxsize=64)
def _read_16k(path: Path) -> Samples:
    # Clips never change once written, and the exporter reads each one several times.
    wav = read_wav(path)
    return resample(wav.samples, wav.sample_rate, RATE)


def _name(engine: str, voice: str, text: str) -> str:
    digest = hashlib.sha256(f"{engine}\0{voice}\0{text}".encode()).hexdigest()[:12]
    slug = "".join(c if c.isalnum() else "-" for c in text.lower())[:32].strip("-")
    return f"{engine}-{slug}-{digest}.wav"


def espeak_clip(text: str, directory: Path, voice: str = ESPEAK_VOICE, wpm: int = 160) -> Path:
    """`text` spoken by espeak-ng (Debian's `espeak-ng` program), cached in `directory`."""
    path = directory / _name("espeak", f"{voice}@{wpm}", text)
    if path.is_file():
        return path
    program = shutil.which("espeak-ng")
    if program is None:
        raise UsageError("espeak-ng is not installed (apt-get install espeak-ng)")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=directory)
    os.close(fd)
    try:
        result = subprocess.run([program, "-v", voice, "-s", str(wpm), "-w", tmp, text],
                                capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise AudioError(f"espeak-ng failed: {result.stderr.strip() or result.returncode}")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def clip_settings(tts: TtsSettings) -> TtsSettings:
    """`tts` as clips need it: no noise, the voice's own speaking rate, always the same windows.
    A Piper graph draws its noise unseeded (the same text made twice differed by 1024 samples),
    so a noisy clip would be one random take per machine; without noise Whisper hears the
    commands as well, and a clip is the same bytes on every machine with the same onnxruntime."""
    return replace(tts, length_scale=None, noise_scale=0.0, noise_w=0.0, threads=CLIP_THREADS,
                   stream_vocoder=True)


def _piper_path(directory: Path, voice_id: str, text: str, speaker: str = "") -> Path:
    if speaker:  # the style packs of one model are told apart by speaker
        return directory / _name("voice", f"{voice_id}:{speaker}", text)
    return directory / _name("piper", f"{voice_id}@{PIPER_TAKE}", text)


def piper_clip(text: str, directory: Path, voice: Voice, speaker: str = "") -> Path:
    """`text` spoken by a loaded voice (`edge_agent.tts`; `speaker` names a style pack of a
    multi-speaker model), cached in `directory`. A Piper voice must be loaded with `clip_settings`."""
    path = _piper_path(directory, voice.id, text, speaker)
    if path.is_file():
        return path
    if isinstance(voice, PiperVoice) and not voice.noiseless:
        raise UsageError(f"voice {voice.id}: clips need its noise off (load it with clip_settings), "
                         "or every machine would make a different clip")
    directory.mkdir(parents=True, exist_ok=True)
    chunks = [c.samples for c in synthesize(voice, text)]
    sink = WavSink(path, voice.sample_rate)
    sink.write(np.concatenate(chunks))
    sink.close()
    return path


def make_clips(directory: Path, texts: Sequence[str] = COMMANDS, engines: Sequence[str] = ENGINES,
               piper_voice: Voice | None = None) -> list[Clip]:
    """One clip per text and engine (Piper needs a loaded voice), engine by engine."""
    return make_set(directory, [(text, engine) for engine in engines for text in texts], piper_voice)


def make_set(directory: Path, specs: Sequence[tuple[str, str]], piper_voice: Voice | None = None,
             ) -> list[Clip]:
    """The clip of each `(text, engine)`, in order (Piper needs a loaded voice)."""
    clips = []
    for text, engine in specs:
        if engine == "espeak":
            clips.append(Clip(text, engine, espeak_clip(text, directory)))
        elif engine == "piper":
            path = _piper_path(directory, PIPER_VOICE if piper_voice is None else piper_voice.id, text)
            if not path.is_file():
                if piper_voice is None:
                    raise UsageError("piper clips need a loaded voice")
                piper_clip(text, directory, piper_voice)
            clips.append(Clip(text, engine, path))
        else:
            raise UsageError(f"unknown clip engine {engine!r} (known: {', '.join(ENGINES)})")
    return clips


def clip_set(store: ModelStore, specs: Sequence[tuple[str, str]] = EXPORT_SET) -> list[Clip]:
    """`specs` made into `<store.cache_dir>/clips`; the Piper voice is loaded only to make a missing clip."""
    directory = clips_dir(store.cache_dir)
    if all(e != "piper" or _piper_path(directory, PIPER_VOICE, t).is_file() for t, e in specs):
        return make_set(directory, specs)
    registry = VoiceRegistry(store, clip_settings(TtsSettings(voice=PIPER_VOICE)))
    try:
        return make_set(directory, specs, registry.get(PIPER_VOICE))
    finally:
        registry.close()


def speed_clip_path(directory: Path, text: str, speed: float) -> Path:
    """Where `piper_speed_clip` keeps `text` at `speed`."""
    digest = hashlib.sha256(f"joe\0{speed}\0{text}".encode()).hexdigest()[:12]
    return directory / f"sweep-piper{speed}-{digest}.wav"


def piper_speed_clip(text: str, directory: Path, voice: Voice, speed: float) -> Path:
    """`text` by a noiseless Piper voice loaded at length scale `speed`, cached in `directory`
    (`make_set` keys its Piper clips by text alone, at the voice's own speed)."""
    path = speed_clip_path(directory, text, speed)
    if path.is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    sink = WavSink(part, voice.sample_rate)
    sink.write(np.concatenate([c.samples for c in synthesize(voice, text)]))
    sink.close()
    part.replace(path)
    return path


def in_room(clip: Path, t60_s: float, snr_db: float, seed: int = 0) -> Path:
    """`clip` as a microphone across a room hears it: reverberation decaying by 60 dB in `t60_s`
    (exponentially decaying noise after the direct sound) and white noise `snr_db` below the
    speech; seeded, so every machine makes the same file beside the clip."""
    path = clip.with_name(f"room{t60_s:g}-{snr_db:g}-{seed}-{clip.name}")
    if path.is_file():
        return path
    rng = np.random.default_rng(seed)
    speech = load_16k(clip)
    t = np.arange(round(t60_s * RATE)) / RATE
    impulse = rng.normal(0, 0.1, t.size) * np.exp(-6.9 * t / t60_s)
    impulse[0] = 1.0
    wet = np.convolve(speech, impulse)[: speech.size]
    noise = rng.normal(0, 1, wet.size) * np.sqrt(np.mean(wet ** 2) / 10 ** (snr_db / 10))
    mixed = wet + noise
    mixed *= 0.5 / max(1e-9, float(np.abs(mixed).max()))
    part = path.with_name(f".{path.name}.part")
    sink = WavSink(part, RATE)
    sink.write(mixed.astype(np.float32))
    sink.close()
    part.replace(path)
    return path


def sweep_set(store: ModelStore) -> list[Clip]:
    """The sweep: `SWEEP_TEXTS` by Piper at each of `PIPER_SPEEDS`, by espeak-ng in each of
    `ESPEAK_VOICES`, and by Piper at its own speed in `ROOM` (176 clips), made into
    `<store.cache_dir>/clips`. A clip's `engine` names its voice (`piper@0.8`, `espeak:en-us@175`,
    `room:piper@1.0`)."""
    directory = clips_dir(store.cache_dir)
    clips: list[Clip] = []
    for speed in PIPER_SPEEDS:
        registry = None
        for text in SWEEP_TEXTS:
            path = speed_clip_path(directory, text, speed)
            if not path.is_file():
                if registry is None:
                    settings = replace(clip_settings(TtsSettings(voice=PIPER_VOICE)), length_scale=speed)
                    registry = VoiceRegistry(store, settings)
                piper_speed_clip(text, directory, registry.get(PIPER_VOICE), speed)
            clips.append(Clip(text, f"piper@{speed}", path))
        if registry is not None:
            registry.close()
    for voice, wpm in ESPEAK_VOICES:
        clips += [Clip(t, f"espeak:{voice}@{wpm}", espeak_clip(t, directory, voice, wpm))
                  for t in SWEEP_TEXTS]
    clean = [c for c in clips if c.engine == "piper@1.0"]
    clips += [Clip(c.text, f"room:{c.engine}", in_room(c.path, *ROOM)) for c in clean]
    return clips


def clips_dir(cache_dir: Path) -> Path:
    """Where clips are kept: under the model cache (`<models.cache_dir>/clips`)."""
    return cache_dir / "clips"
