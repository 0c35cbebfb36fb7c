"""A ducked announcement over music is understood as well as without music: our voice over a
synthetic band at the player's default `duck_level`, transcribed by the exported Whisper.

No aiosendspin needed: what reaches the room is the announcement plus the music times the
player's gain (`SendspinPlayer.gain`, measured on its output timeline in the other tests).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.clips import COMMANDS, load_16k, piper_clip
from edge_agent.asr.whisper import WhisperOnnx
from edge_agent.sendspin.settings import SendspinSettings
from edge_agent.text.wer import wer

RATE = 16000
ANNOUNCEMENTS = [
    "The washing machine has finished.",
    "Dinner is ready in ten minutes.",
    "The front door has been open for five minutes.",
    "Your train to Cambridge leaves at seven fifteen.",
    *COMMANDS,
]
LOUDER = 2.0
"""The band's RMS over the voice's active RMS at full volume (+6 dB): music played loud."""


def band(seconds: float, seed: int) -> np.ndarray:
    """Music-like sound: a bass line, chords of decaying harmonic notes and a hi-hat, 120 bpm."""
    rng = np.random.default_rng(seed)
    n = round(seconds * RATE)
    out = np.zeros(n, dtype=np.float64)
    beat = RATE // 2
    roots = [110.0, 146.8, 164.8, 123.5]  # A, D, E, B
    for k, start in enumerate(range(0, n, beat)):
        t = np.arange(min(beat, n - start)) / RATE
        root = roots[(k // 4) % 4]
        for ratio, level in ((1.0, 0.5), (1.26, 0.3), (1.5, 0.3), (2.0, 0.2), (3.0, 0.1)):
            out[start:start + len(t)] += level * np.sin(2 * np.pi * root * ratio * t) * np.exp(-3 * t)
        out[start:start + len(t)] += 0.4 * np.sin(2 * np.pi * root / 2 * t)  # bass
        hat = rng.normal(0, 0.15, len(t)) * np.exp(-40 * t)
        out[start:start + len(t)] += np.diff(hat, prepend=0.0)  # a bright click
    return out.astype(np.float32)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


@pytest.mark.slow
def test_a_ducked_announcement_over_music_is_transcribed_as_well_as_without_music(
        whisper_dir, clip_cache, piper_voice):
    whisper = WhisperOnnx.load(whisper_dir, threads=2)
    duck = SendspinSettings().duck_level
    heard: dict[str, list[str]] = {"clean": [], "ducked": [], "full music": []}
    for i, text in enumerate(ANNOUNCEMENTS):
        speech = load_16k(piper_clip(text, clip_cache, piper_voice))
        active = speech[np.abs(speech) > 0.02]
        music = band(len(speech) / RATE, seed=i)
        music *= LOUDER * rms(active) / rms(music)
        for name, gain in (("clean", 0.0), ("ducked", duck), ("full music", 1.0)):
            mixed = np.clip(speech + gain * music, -1, 1).astype(np.float32)
            heard[name].append(whisper.recognize(mixed).text)
    scores = {name: wer(ANNOUNCEMENTS, texts) for name, texts in heard.items()}
    print(f"WER at duck_level {duck}: " + ", ".join(f"{k} {v:.3f}" for k, v in scores.items()))
    # "as well as without music": within two words in a hundred (tiny.en's own slips vary
    # with any change to the audio, either way)
    assert scores["ducked"] <= scores["clean"] + 0.02, heard
