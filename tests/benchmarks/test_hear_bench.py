"""`bench hear`'s building blocks: the mixtures it measures on and the facts it chose by."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.echo import erle_windows
from benchmarks.hear import NOISES, mixed, ours, padded, speex_gain
from benchmarks.wake import music, speech_rms


def test_each_noise_is_mixed_at_the_snr_asked_for():
    rng = np.random.default_rng(0)
    t = np.arange(32000) / 16000
    clean = (0.2 * np.sin(2 * np.pi * 300 * t) * ((t % 0.5) < 0.3)).astype(np.float32)
    pool = [clean[::-1].copy(), np.roll(clean, 1234)]
    for kind in NOISES:
        out = mixed(clean, 10.0, kind, pool, rng)
        added = out - padded(clean)
        snr = 20 * np.log10(speech_rms(clean) / np.sqrt(np.mean(added ** 2)))
        assert abs(snr - 10.0) < 0.5, kind


def test_music_is_tonal_not_noise():
    tones = music(16000, np.random.default_rng(1))
    spectrum = np.abs(np.fft.rfft(tones)) ** 2
    assert np.sort(spectrum)[-40:].sum() > 0.5 * spectrum.sum()  # energy sits in a few partials


def test_pyspeex_noise_own_gain_control_returns_silence_which_is_why_the_gain_is_ours():
    pytest.importorskip("pyspeex_noise")
    t = np.arange(16000) / 16000
    speechlike = (0.05 * np.sin(2 * np.pi * 440 * t) * ((t % 0.4) < 0.2)).astype(np.float32)
    theirs = speex_gain(4000)()
    out = np.concatenate([theirs(speechlike[i:i + 160]) for i in range(0, speechlike.size, 160)])
    assert np.abs(out).max() <= 2 / 32768  # one bit at most: speech at -26 dBFS comes out as silence
    mine = ours(0, 10)()
    longer = np.tile(speechlike, 8)  # our gain rises 2 dB a second of speech: 8 s, half of it speech
    lifted = np.concatenate([mine(longer[i:i + 160]) for i in range(0, longer.size, 160)])
    assert np.abs(lifted[-16000:]).max() > 1.5 * np.abs(speechlike).max()


def test_erle_is_measured_per_window():
    mic = np.ones(64000, dtype=np.float32)
    assert erle_windows(mic, 0.1 * mic) == [20.0, 20.0]
