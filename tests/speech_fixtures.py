"""Fixtures for the listening side: speech clips with known text, noise, the exported Whisper.

Imported by the conftest of each test folder that needs them. Clips are synthesized
once (espeak-ng and our Piper voice) and kept in the shared test cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.clips import COMMANDS, SWEEP_TEXTS, Clip, clips_dir, load_16k, make_clips, piper_clip

RATE = 16000
WHISPER_SOURCE = "whisper-tiny.en"
TWO_SENTENCES = SWEEP_TEXTS[12]
"""The truncation clip of issue 23: a turn used to end after "ready." and lose the second sentence."""


def write_wav(path: Path, samples: np.ndarray, rate: int = RATE, channels: int = 1, width: int = 2) -> Path:
    """Write float samples ([n] or [n, channels]) as integer PCM."""
    data = np.asarray(samples, dtype=np.float64)
    if data.ndim == 1 and channels > 1:
        data = np.repeat(data[:, None], channels, axis=1)
    scale = {1: 127, 2: 32767, 4: 2**31 - 1}[width]
    ints = np.round(np.clip(data, -1, 1) * scale)
    if width == 1:
        raw = (ints + 128).astype(np.uint8).tobytes()
    else:
        raw = ints.astype({2: "<i2", 4: "<i4"}[width]).tobytes()
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(raw)
    return path


_speed_voices: dict[float, Any] = {}


def piper_speed_clip(text: str, directory: Path, model_cache: Path, speed: float) -> Path:
    """`text` by Piper's joe, noiseless, at length scale `speed` (1 is the voice's own), cached in
    `directory` (`benchmarks.clips.piper_speed_clip`; the voice is loaded once per speed)."""
    from benchmarks import clips

    path = clips.speed_clip_path(directory, text, speed)
    if path.is_file():
        return path
    from dataclasses import replace

    from edge_agent.config import TtsSettings
    from edge_agent.models import ModelStore, load_catalog
    from edge_agent.tts.registry import VoiceRegistry

    registry = _speed_voices.get(speed)
    if registry is None:
        settings = replace(clips.clip_settings(TtsSettings()), length_scale=speed)
        registry = _speed_voices[speed] = VoiceRegistry(ModelStore(model_cache, load_catalog()), settings)
    return clips.piper_speed_clip(text, directory, registry.get("en_US-joe-medium"), speed)


def close_speed_voices() -> None:
    for registry in _speed_voices.values():
        registry.close()
    _speed_voices.clear()


def run_cli(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `edge-agent` in a subprocess, as a user would."""
    return subprocess.run([sys.executable, "-m", "edge_agent", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, check=False)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), dtype=np.float32)


def noise(seconds: float, level: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, level, round(seconds * RATE)).astype(np.float32)


@pytest.fixture(scope="session")
def clip_cache(shared_cache: Path) -> Path:
    return clips_dir(shared_cache)


@pytest.fixture(scope="session")
def espeak_clips(clip_cache: Path) -> list[Clip]:
    return make_clips(clip_cache, COMMANDS, ["espeak"])


@pytest.fixture(scope="session")
def piper_voice(shared_cache: Path):
    from benchmarks.clips import clip_settings
    from edge_agent.config import TtsSettings
    from edge_agent.models import ModelStore, load_catalog
    from edge_agent.tts.registry import VoiceRegistry

    registry = VoiceRegistry(ModelStore(shared_cache, load_catalog()), clip_settings(TtsSettings(threads=2)))
    yield registry.get("en_US-joe-medium")
    registry.close()


@pytest.fixture(scope="session")
def piper_clips(clip_cache: Path, piper_voice) -> list[Clip]:
    return make_clips(clip_cache, COMMANDS, ["piper"], piper_voice)


@pytest.fixture(scope="session")
def dinner(clip_cache: Path, piper_voice) -> tuple[np.ndarray, np.ndarray]:
    """A first sentence complete by itself and a second one: "Okay Nabu. Dinner is ready." "Please
    come to the table." (synthesized apart, trimmed to their speech; the end-of-turn model judges the
    first complete, p 0.9-0.99)."""
    first, second = (load_16k(piper_clip(text, clip_cache, piper_voice))
                     for text in ("Okay Nabu. Dinner is ready.", "Please come to the table."))
    voiced = np.nonzero(np.abs(second) > 0.01)[0]
    return first[:np.nonzero(np.abs(first) > 0.01)[0][-1] + 1], second[voiced[0]:voiced[-1] + 1]


def fetch_vad_model(cache: Path) -> Path:
    """The default VAD's model in `cache`, fetched once."""
    from edge_agent.models import ModelStore, load_catalog

    store = ModelStore(cache, load_catalog())
    return store.fetch("silero-vad").path("silero_vad.onnx")


@pytest.fixture(scope="session")
def silero_model(shared_cache: Path) -> Path:
    return fetch_vad_model(shared_cache)


def fetch_turn_model(cache: Path) -> Path:
    """The end-of-turn model (`smart-turn`) in `cache`, fetched once."""
    from edge_agent.listen.endofturn import MODEL_FILE, MODEL_ID
    from edge_agent.models import ModelStore, load_catalog

    return ModelStore(cache, load_catalog()).fetch(MODEL_ID).path(MODEL_FILE)


@pytest.fixture(scope="session")
def turn_model(shared_cache: Path) -> Path:
    return fetch_turn_model(shared_cache)


@pytest.fixture(scope="session")
def whisper_dir(shared_cache: Path) -> Path:
    """whisper-tiny.en exported by the exporter into the shared test cache.

    The same directory and variants as the exporter's own tests use, so one run of
    the suite exports it at most once (and not at all while the source is unchanged).
    A test that hears needs the default VAD's model beside it: fetched first.
    """
    fetch_vad_model(shared_cache)
    env = os.environ.get("EDGE_SPEECH_TEST_WHISPER")
    if env:
        return Path(env)
    pytest.importorskip("torch", reason="exporting Whisper needs the export extra")
    from benchmarks.clips import clip_set, sweep_set
    from edge_agent.models import ModelStore, load_catalog
    from exporters.progress import Progress
    from exporters.whisper.pipeline import ExportOptions, export_whisper, resolve_source, up_to_date

    store = ModelStore(shared_cache, load_catalog())
    progress = Progress(quiet=True)
    source = resolve_source(WHISPER_SOURCE, store, progress)
    out = shared_cache / "exported-tests" / f"tiny.en-{source.sha256[:16]}"
    options = ExportOptions(variants=("fp32", "int8", "fp16", "int4"))
    if not up_to_date(out, source, options):
        export_whisper(source, out, clip_set(store), options, progress, choice=sweep_set(store))
    return out


@pytest.fixture(scope="session")
def whisper(whisper_dir: Path):
    from edge_agent.asr.whisper import WhisperOnnx

    model = WhisperOnnx.load(whisper_dir, threads=2)
    yield model
    model.close()


def room_impulse(delay_s: float, t60_s: float = 0.25, length_s: float = 0.15, gain: float = 0.5,
                 seed: int = 1) -> np.ndarray:
    """A simulated loudspeaker-to-microphone path: `delay_s` of sound card and air, a direct
    sound, then a diffuse tail decaying by 60 dB in `t60_s` (exponentially decaying noise)."""
    rng = np.random.default_rng(seed)
    n = round(length_s * RATE)
    t = np.arange(n) / RATE
    tail = rng.normal(0, 0.1, n) * np.exp(-6.9 * t / t60_s)
    tail[0] = 1.0  # the direct sound
    return np.concatenate([np.zeros(round(delay_s * RATE)), gain * tail])


def through_room(played: np.ndarray, impulse: np.ndarray) -> np.ndarray:
    """What a microphone picks up of `played` (same length)."""
    return np.convolve(played, impulse)[: played.size].astype(np.float32)
