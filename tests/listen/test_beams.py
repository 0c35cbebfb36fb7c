"""The wake word on every fixed beam of a board (`audio.steering: wake`, `listen.beams`): one
detection a wake word, bad boards still heard. Real people's speech."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.audio.settings import AudioSettings
from edge_agent.listen.beams import WakeBank, heard_by
from edge_agent.listen.microphone import open_microphone
from edge_agent.wake import WakeEngine
from edge_agent.wake.settings import WakeSettings
from tests.speech_fixtures import RATE, silence, write_wav

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
TALKER = REAL / "wake" / "alexa" / "0.flac"
COMMAND = REAL / "commands" / "what time is it.flac"


def real(path: Path) -> np.ndarray:
    import soundfile

    x, rate = soundfile.read(str(path), dtype="float32")
    assert rate == RATE
    return (x * 0.05 / np.sqrt(np.mean(x ** 2))).astype(np.float32)


def board(tmp_path: Path, *, dead: bool = False, channels: int = 2, step: int = 2) -> Path:
    """A real person saying "Alexa", then another asking the time, on a board's microphones: the
    talker reaches each `step` samples later than the one before (2: off to one side; more than a
    58 mm pair allows: channels out of step), a little noise on each."""
    x = np.concatenate([silence(0.5), real(TALKER), silence(0.4), real(COMMAND), silence(1.0)])
    rng = np.random.default_rng(3)
    late = [np.concatenate([np.zeros(step * c, np.float32), x[:x.size - step * c]]) for c in range(channels)]
    frames = np.stack(late, axis=1) + rng.standard_normal((x.size, channels)).astype(np.float32) * 0.002
    if dead:
        frames[:, 1] = 0.0
    return write_wav(tmp_path / "board.wav", frames, channels=channels)


def hear(path: Path, geometry: str, channels: int = 2, steering: str = "wake",
         ) -> tuple[list[float], WakeEngine | WakeBank, object]:
    """The file heard as `listen --input F --front-end` hears it: the detections' times, the wake
    words as the loop hears them and the beamformer."""
    audio = AudioSettings(input_file=path, input_channels=channels, mic_geometry=geometry,
                          steering=steering)
    microphone = open_microphone(audio)
    wake = heard_by(WakeEngine.load(WakeSettings(models=("alexa",))), microphone)
    times = [d.time for block in microphone.source.blocks() for d in wake.feed(block)]
    microphone.source.close()
    return times, wake, microphone.beamformer


def test_one_wake_word_heard_on_several_beams_is_one_detection(tmp_path):
    path = board(tmp_path)
    times, wake, _ = hear(path, "respeaker_2mic")
    assert isinstance(wake, WakeBank)
    tracked, _, _ = hear(path, "respeaker_2mic", steering="track")
    assert len(times) == 1 and times[0] == pytest.approx(tracked[0], abs=0.1), (times, tracked)
    assert sum(engine.stats.detections for engine in wake._beams) >= 2  # heard on several, woken once
    assert sum(wake.by_beam) == 1
    assert wake.stats.detections == 1 and wake.stats.peak["alexa"] > 0.85


def test_tracked_steering_keeps_one_engine_and_steers(tmp_path):
    times, wake, beamformer = hear(board(tmp_path), "respeaker_2mic", steering="track")
    assert isinstance(wake, WakeEngine) and len(times) == 1
    assert beamformer is not None and beamformer.tap is None


def test_with_a_dead_channel_the_bank_hears_the_live_one(tmp_path):
    times, wake, beamformer = hear(board(tmp_path, dead=True), "respeaker_2mic")
    assert isinstance(wake, WakeBank) and len(times) == 1
    assert beamformer is not None and "channel 1 is dead" in str(beamformer.problem)


def test_channels_out_of_step_still_wake_once(tmp_path):
    # Six samples: no fixed beam points that way (a 58 mm pair's sound arrives at most 2.7 apart), the
    # steered output aligns them.
    times, wake, beamformer = hear(board(tmp_path, step=6), "respeaker_2mic")
    assert isinstance(wake, WakeBank) and len(times) == 1
    assert beamformer is not None and beamformer.problem is None


def test_a_channel_count_the_geometry_lacks_has_no_bank_and_still_wakes(tmp_path):
    times, wake, beamformer = hear(board(tmp_path, channels=3), "respeaker_4mic", channels=3)
    assert isinstance(wake, WakeEngine) and len(times) == 1
    assert beamformer is not None and "3 channel(s) but the geometry has 4" in str(beamformer.problem)


def test_refused_steering_is_a_clear_error():
    with pytest.raises(ValueError, match="steering: 'beam' is not track or wake"):
        AudioSettings(mic_geometry="respeaker_2mic", steering="beam")


def test_a_loop_steered_alone_takes_the_tap_off_a_bank_left_on_a_kept_source(tmp_path):
    from edge_agent.audio.sources import WavFileSource
    from edge_agent.listen.microphone import Microphone

    source = WavFileSource(board(tmp_path), mic_geometry="respeaker_2mic")
    engine = WakeEngine.load(WakeSettings(models=("alexa",)))
    bank = heard_by(engine, Microphone(source, source, steer_by_wake=True))
    assert isinstance(bank, WakeBank) and source.mixer is not None and source.mixer.tap == bank.hear
    assert heard_by(engine, Microphone(source, source, steer_by_wake=False)) is engine
    assert source.mixer.tap is None
    source.close()
