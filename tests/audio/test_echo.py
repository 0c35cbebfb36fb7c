"""The echo canceller on real signals: our voice played through a simulated room, measured by ERLE."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.clips import COMMANDS, load_16k, piper_clip
from edge_agent.audio.echo import FRAME, DelayEstimator, EchoCanceller, speexdsp
from tests.speech_fixtures import noise, room_impulse, through_room

try:
    speexdsp()
except Exception as exc:  # pragma: no cover - a machine without libspeexdsp1
    pytest.skip(f"no libspeexdsp: {exc}", allow_module_level=True)


@pytest.fixture(scope="module")
def speech(clip_cache, piper_voice) -> np.ndarray:
    """About 25 s of our voice (several commands back to back), peak 0.5."""
    audio = np.concatenate([load_16k(piper_clip(text, clip_cache, piper_voice)) for text in COMMANDS[:8]])
    return (0.5 * audio / np.abs(audio).max()).astype(np.float32)


def erle_db(mic: np.ndarray, out: np.ndarray) -> float:
    """Echo return loss enhancement: how much quieter the echo is after cancelling."""
    return float(10 * np.log10(np.sum(mic.astype(np.float64) ** 2) / np.sum(out.astype(np.float64) ** 2)))


def cancel(canceller: EchoCanceller, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
    out = np.zeros_like(mic)
    for i in range(0, mic.size - FRAME + 1, FRAME):
        out[i:i + FRAME] = canceller.process(mic[i:i + FRAME], ref[i:i + FRAME])
    return out


def test_our_voice_through_a_room_with_a_delay_is_reduced_by_20_db(speech):
    impulse = room_impulse(delay_s=0.12)
    mic = through_room(speech, impulse) + noise(speech.size / 16000, 1e-3)
    canceller = EchoCanceller(tail_ms=200, max_delay_ms=500)
    out = cancel(canceller, mic, speech)
    settled = 6 * 16000  # the filter learns the room in the first seconds
    assert abs(canceller.delay - round(0.12 * 16000)) <= 8  # GCC-PHAT found the card + air delay
    assert erle_db(mic[settled:], out[settled:]) >= 20.0


def test_without_alignment_a_delay_beyond_the_filter_is_not_cancelled(speech):
    """The delay estimate is what makes it work: the same filter, the reference left where it is."""
    impulse = room_impulse(delay_s=0.3)
    mic = through_room(speech, impulse)
    canceller = EchoCanceller(tail_ms=200, max_delay_ms=500)
    canceller.estimator.max_lag = 0  # never moves the reference
    out = cancel(canceller, mic, speech)
    assert erle_db(mic[48000:], out[48000:]) < 6.0


def test_a_voice_over_our_playback_survives_the_canceller(speech, clip_cache, piper_voice):
    user = load_16k(piper_clip("Okay Nabu, turn on the kitchen lights.", clip_cache, piper_voice))
    echo = through_room(speech, room_impulse(delay_s=0.08))
    start = 5 * 16000  # the user talks once the filter has learnt the room
    near = np.zeros_like(echo)
    near[start:start + user.size] = 0.3 * user
    out = cancel(EchoCanceller(), echo + near, speech)
    # The residual echo suppressor hands its frames out one frame (10 ms) late.
    heard, said = out[start + FRAME:start + FRAME + user.size], near[start:start + user.size]
    error_db = 10 * np.log10(np.sum((heard - said) ** 2) / np.sum(said ** 2))
    echo_db = 10 * np.log10(np.sum(echo[start:start + user.size] ** 2) / np.sum(said ** 2))
    assert echo_db > 5  # the playback was louder than the user at the microphone...
    assert error_db < -6  # ...and after cancelling, what differs from the user is 6 dB below them
    assert np.corrcoef(heard, said)[0, 1] > 0.85


def test_nothing_played_leaves_the_microphone_untouched():
    canceller = EchoCanceller()
    mic = noise(1.0, 0.05)
    out = cancel(canceller, mic, np.zeros_like(mic))
    assert np.array_equal(out, mic) and canceller.cancelled == 0


def test_the_delay_estimator_finds_the_delay_of_a_noisy_echo(speech):
    estimator = DelayEstimator(max_lag=8000)
    mic = np.roll(0.3 * speech, 2345) + noise(speech.size / 16000, 0.02)
    verdicts = [estimator.push(mic[i:i + 1600], speech[i:i + 1600]) for i in range(0, speech.size, 1600)]
    assert any(v is not None for v in verdicts) and estimator.lag == 2345
