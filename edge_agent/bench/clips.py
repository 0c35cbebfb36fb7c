"""Speech clips with known text, made on this machine: espeak-ng and our own Piper voice.

No recordings ship with the project; the ASR benchmark and tests synthesize
smart-speaker commands instead, once, and keep them in `<cache>/clips/` keyed by
engine, voice and text (a clip is never regenerated, so every later run measures
the very same audio).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import resample
from edge_agent.audio.sinks import WavSink
from edge_agent.audio.wav import read_wav
from edge_agent.errors import AudioError, UsageError
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

ENGINES = ("espeak", "piper")
ESPEAK_VOICE = "en-us"
PIPER_VOICE = "en_US-joe-medium"


@dataclass(frozen=True)
class Clip:
    """A WAV file and the words spoken in it."""

    text: str
    engine: str
    path: Path

    def audio(self) -> Samples:
        """The clip as 16 kHz mono float32."""
        return load_16k(self.path)


def load_16k(path: Path) -> Samples:
    wav = read_wav(path)
    return resample(wav.samples, wav.sample_rate, 16000)


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


def piper_clip(text: str, directory: Path, voice: Voice) -> Path:
    """`text` spoken by a loaded voice (`edge_agent.tts`), cached in `directory`."""
    path = directory / _name("piper", voice.id, text)
    if path.is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    chunks = [c.samples for c in synthesize(voice, text)]
    sink = WavSink(path, voice.sample_rate)
    sink.write(np.concatenate(chunks))
    sink.close()
    return path


def make_clips(directory: Path, texts: Sequence[str] = COMMANDS, engines: Sequence[str] = ENGINES,
               piper_voice: Voice | None = None) -> list[Clip]:
    """One clip per text and engine (Piper needs a loaded voice)."""
    clips = []
    for engine in engines:
        for text in texts:
            if engine == "espeak":
                clips.append(Clip(text, engine, espeak_clip(text, directory)))
            elif engine == "piper":
                if piper_voice is None:
                    raise UsageError("piper clips need a loaded voice")
                clips.append(Clip(text, engine, piper_clip(text, directory, piper_voice)))
            else:
                raise UsageError(f"unknown clip engine {engine!r} (known: {', '.join(ENGINES)})")
    return clips


def clips_dir(cache_dir: Path) -> Path:
    """Where clips are kept: beside the model cache."""
    return cache_dir.parent / "clips"
