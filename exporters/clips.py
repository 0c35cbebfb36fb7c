"""The fixed test-speech set: clips with known text, made offline and cached.

Half the clips come from espeak-ng (formant synthesis, very regular), half from our own
Piper voice with its noise turned off (natural-sounding and deterministic), so the set
does not flatter one kind of voice. Clips are 16 kHz mono float32, written once into
`<cache>/clips/` and reused; tests, the exporter and the benchmarks share them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_agent.audio.resample import resample
from edge_agent.audio.wav import WavWriter, read_wav
from edge_agent.errors import AudioError, ModelError
from edge_agent.models import ModelStore

SAMPLE_RATE = 16000
PIPER_VOICE = "en_US-joe-medium"
_VERSION = "1"
"""Bump to regenerate every cached clip (e.g. after changing how clips are made)."""


@dataclass(frozen=True)
class ClipSpec:
    """What to say and with which engine."""

    name: str
    text: str
    engine: str
    """`espeak` or `piper`."""

    @property
    def key(self) -> str:
        digest = hashlib.sha256(f"{_VERSION}|{self.engine}|{self.text}".encode()).hexdigest()
        return f"{self.name}-{digest[:12]}"


@dataclass(frozen=True)
class Clip:
    """One clip of the set, with its audio."""

    name: str
    text: str
    engine: str
    audio: np.ndarray
    """16 kHz mono float32."""

    @property
    def duration_s(self) -> float:
        return len(self.audio) / SAMPLE_RATE


CLIPS: tuple[ClipSpec, ...] = (
    ClipSpec("lights", "Turn on the kitchen lights.", "espeak"),
    ClipSpec("weather", "What is the weather like tomorrow morning?", "piper"),
    ClipSpec("garage", "Please close the garage door before you leave.", "espeak"),
    ClipSpec("music", "Play some quiet music in the living room.", "piper"),
    ClipSpec("delivery", "The delivery van is waiting outside the front gate.", "espeak"),
    ClipSpec("reminder", "Remind me to call my sister when I get home tonight.", "piper"),
    ClipSpec(
        "laundry",
        "The washing machine in the basement has finished its cycle, and the clothes should be "
        "moved to the dryer right away so that they do not start to smell. Remember that the back "
        "door is still unlocked, and the cat has not been fed since lunch. The heating will switch "
        "off at midnight unless somebody changes the schedule on the panel in the hall.",
        "piper",
    ),
)
"""Six commands of one to four seconds and one paragraph of about twenty seconds."""

Progress = Callable[[str], None]


def clip_set(cache_dir: Path, store: ModelStore, progress: Progress | None = None,
             specs: tuple[ClipSpec, ...] = CLIPS) -> list[Clip]:
    """The clips of `specs`, generated into `cache_dir/clips/` on first use."""
    say = progress or (lambda _line: None)
    directory = cache_dir / "clips"
    directory.mkdir(parents=True, exist_ok=True)
    clips = []
    for spec in specs:
        path = directory / f"{spec.key}.wav"
        if not path.is_file():
            say(f"making test clip {spec.name!r} with {spec.engine}")
            audio = _espeak(spec.text) if spec.engine == "espeak" else _piper(spec.text, store)
            writer = WavWriter(path, SAMPLE_RATE)
            writer.write(audio)
            writer.close()
        wav = read_wav(path)
        clips.append(Clip(spec.name, spec.text, spec.engine, wav.samples))
    return clips


def _espeak(text: str) -> np.ndarray:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise AudioError("espeak-ng is not installed (apt-get install espeak-ng): it makes the test clips")
    with tempfile.TemporaryDirectory(prefix="clip-") as tmp:
        out = Path(tmp) / "clip.wav"
        result = subprocess.run([exe, "-v", "en-us", "-s", "160", "-w", str(out), text],
                                capture_output=True, text=True, check=False, timeout=60)
        if result.returncode != 0 or not out.is_file():
            raise AudioError(f"espeak-ng failed: {result.stderr.strip() or result.returncode}")
        wav = read_wav(out)
    return _finish(wav.samples, wav.sample_rate)


def _piper(text: str, store: ModelStore) -> np.ndarray:
    from edge_agent.runtime import make_session
    from edge_agent.tts.piper import PiperConfig, PiperVoice

    files = store.locate(PIPER_VOICE) or store.fetch(PIPER_VOICE)
    model = files.path(f"{PIPER_VOICE}.onnx")
    config = PiperConfig.load(files.path(f"{PIPER_VOICE}.onnx.json"))
    # No sampling noise: the same text always gives the same clip.
    config = dataclasses.replace(config, noise_scale=0.0, noise_w=0.0)
    voice = PiperVoice(PIPER_VOICE, make_session(model, 2), config)
    gap = np.zeros(int(0.25 * config.sample_rate), dtype=np.float32)
    parts: list[np.ndarray] = []
    for sentence in voice.sentences(text):
        for samples in voice.synthesize_sentence(sentence):
            parts.extend([samples, gap])
    if not parts:
        raise ModelError(f"voice {PIPER_VOICE} produced no audio for {text!r}")
    return _finish(np.concatenate(parts), config.sample_rate)


def _finish(samples: np.ndarray, rate: int) -> np.ndarray:
    """16 kHz, with a quarter second of silence on both sides."""
    audio = resample(samples.astype(np.float32), rate, SAMPLE_RATE)
    pad = np.zeros(SAMPLE_RATE // 4, dtype=np.float32)
    return np.concatenate([pad, audio, pad])
