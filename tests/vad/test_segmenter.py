import itertools

import numpy as np
import pytest

from benchmarks.wake import music
from edge_agent.config import VadSettings
from edge_agent.errors import ModelError
from edge_agent.models import ModelStore, load_catalog
from edge_agent.vad import Segmenter, SileroClassifier, WebRtcClassifier, make_segmenter
from tests.speech_fixtures import RATE, noise, silence


def speech_bounds(x: np.ndarray) -> tuple[float, float]:
    """Where a clean clip's speech really starts and ends (10 ms energy above -40 dBFS)."""
    frames = x[: len(x) // 160 * 160].reshape(-1, 160)
    loud = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > 0.01)
    return loud[0] * 0.01, (loud[-1] + 1) * 0.01


def segment(x, classifier, block=1600, **settings):
    seg = Segmenter(classifier, VadSettings(**settings))
    out = []
    for i in range(0, len(x), block):
        out += seg.push(x[i:i + block])
    return out + seg.flush(), seg


def trimmed(x: np.ndarray) -> np.ndarray:
    on, off = speech_bounds(x)
    return x[round(on * RATE): round(off * RATE)]


@pytest.fixture(scope="module")
def speech(espeak_clips):
    """Four commands, cut to their speech (no leading or trailing silence)."""
    return [trimmed(c.audio()) for c in espeak_clips[:4]]


@pytest.fixture(params=["webrtc", "silero"])
def classifier(request, silero_model):
    if request.param == "silero":
        return SileroClassifier.load(silero_model)
    return WebRtcClassifier(2, 30)


def test_one_utterance_is_found_where_the_speech_is(speech, classifier):
    clip = speech[0]
    on, off = speech_bounds(clip)
    found, _ = segment(np.concatenate([silence(1.0), clip, silence(1.5)]), classifier)
    assert len(found) == 1
    u = found[0]
    assert on == 0.0
    assert u.start == pytest.approx(1.0 + on, abs=0.12)
    assert u.end == pytest.approx(1.0 + off, abs=0.15)
    assert u.audio_start == pytest.approx(u.start - 0.3, abs=0.04)  # pre-roll
    assert u.ended_at == pytest.approx(u.end + 0.5, abs=0.04)  # hangover
    assert not u.cut


@pytest.mark.parametrize("engine", ["webrtc", "silero"])
def test_silence_and_quiet_noise_give_no_utterance(engine, silero_model):
    def make():
        return SileroClassifier.load(silero_model) if engine == "silero" else WebRtcClassifier(2)

    assert segment(silence(10), make())[0] == []
    assert segment(noise(10, 0.01), make())[0] == []


def test_silero_ignores_loud_noise_that_webrtc_calls_speech(silero_model):
    loud = noise(5, 0.1, seed=3)
    assert segment(loud, SileroClassifier.load(silero_model))[0] == []
    found, seg = segment(loud, WebRtcClassifier(3))
    # webrtcvad's GMM takes loud white noise for speech; the ASR's no-speech check has to catch it.
    assert len(found) == 1 and seg.stats.speech_frames > 0.9 * seg.stats.frames


def test_speech_in_noise_is_still_found(speech, classifier):
    clip = speech[1]
    x = np.concatenate([silence(1.0), clip, silence(1.5)])
    x = x + noise(len(x) / RATE, 0.005, seed=1)
    found, _ = segment(x, classifier)
    assert len(found) == 1


def test_long_pause_splits_and_short_pause_joins(speech, classifier):
    a, b, c = speech[:3]
    x = np.concatenate([silence(0.5), a, silence(2.0), b, silence(0.25), c, silence(1.0)])
    found, _ = segment(x, classifier)
    assert len(found) == 2
    first, second = found
    assert first.end < 0.5 + len(a) / RATE + 0.2
    assert second.duration > (len(b) + len(c)) / RATE - 0.6


def test_short_burst_is_dropped_below_min_utterance(speech):
    burst = speech[0][RATE // 2: RATE // 2 + 1600]  # 100 ms of speech
    found, seg = segment(np.concatenate([silence(1), burst, silence(1)]), WebRtcClassifier(2),
                         min_utterance_ms=250)
    assert found == [] and seg.stats.dropped_short == 1


def test_long_speech_is_cut_at_max_utterance_and_continues(speech):
    x = np.concatenate([silence(0.5), *speech[:3], *speech[:3], silence(1)])
    found, seg = segment(x, WebRtcClassifier(1), max_utterance_s=3.0)
    assert len(found) >= 3 and seg.stats.cuts >= 2
    assert all(u.end - u.audio_start <= 3.0 + 0.31 for u in found)
    cut = [u for u in found if u.cut]
    assert cut and all(later.start >= earlier.end for earlier, later in itertools.pairwise(found))


@pytest.mark.parametrize("block", [1, 160, 777, 48000])
def test_block_size_does_not_change_the_segmentation(speech, block):
    x = np.concatenate([silence(0.7), speech[2], silence(1.0), speech[3], silence(1.0)])
    reference, _ = segment(x, WebRtcClassifier(2), block=len(x))
    found, _ = segment(x, WebRtcClassifier(2), block=block)
    assert [(u.start, u.end, len(u.samples)) for u in found] == \
        [(u.start, u.end, len(u.samples)) for u in reference]


@pytest.mark.parametrize("frame_ms", [10, 20, 30])
def test_every_webrtc_frame_length_finds_the_utterance(speech, frame_ms):
    found, seg = segment(np.concatenate([silence(1), speech[0], silence(1)]), WebRtcClassifier(2, frame_ms))
    assert len(found) == 1 and seg.frame == RATE * frame_ms // 1000


def test_webrtc_and_silero_agree_on_the_same_audio(speech, silero_model):
    x = np.concatenate([silence(1), speech[0], silence(2), speech[1], silence(2), speech[2], silence(1)])
    web, _ = segment(x, WebRtcClassifier(2))
    sil, _ = segment(x, SileroClassifier.load(silero_model))
    assert len(web) == len(sil) == 3
    for w, s in zip(web, sil, strict=True):
        assert abs(w.start - s.start) < 0.2 and abs(w.end - s.end) < 0.25


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="frame_ms"):
        VadSettings(frame_ms=25)
    with pytest.raises(ValueError, match="aggressiveness"):
        VadSettings(aggressiveness=4)
    with pytest.raises(ValueError, match="max_utterance_s"):
        VadSettings(max_utterance_s=45)


def test_silero_ends_a_command_over_music_that_webrtc_takes_for_speech(speech, silero_model):
    """Music 10 dB under the speech (plucked notes, `bench hear`'s music), going on after it: the
    default VAD must end the utterance, or a turn waits for `listen.command_timeout_s` (webrtcvad did,
    in `bench hear --room`)."""
    clip = speech[2]
    x = np.concatenate([silence(1.0), clip, silence(4.0)])
    tones = music(x.size, np.random.default_rng(5))
    level = np.sqrt(np.mean(clip ** 2)) / 10 ** (10 / 20)
    x = (x + level * tones).astype(np.float32)
    speech_end = 1.0 + clip.size / RATE
    found, _ = segment(x, SileroClassifier.load(silero_model))
    # Silero takes a note for speech now and then (measured over 8 clips and 2 tunes: its end 0.0-0.7 s
    # after the speech's, decided 0.5-1.2 s after it).
    assert found and found[-1].end <= speech_end + 0.8 and found[-1].ended_at <= speech_end + 1.3
    found, _ = segment(x, WebRtcClassifier(2, 30))
    # webrtcvad hears the notes as speech to the end of the stream: its utterance never ends by itself.
    assert found[-1].end > speech_end + 3.0


def test_the_default_vad_without_its_model_says_how_to_fetch_it_or_what_to_use_instead(tmp_path):
    store = ModelStore(tmp_path, load_catalog())
    with pytest.raises(ModelError, match=r"models fetch silero-vad`.*or set vad.engine: webrtc"):
        make_segmenter(VadSettings(), store)
    assert make_segmenter(VadSettings(engine="webrtc"), store).frame == 480
