import numpy as np
import pytest

from edge_agent.asr.features import N_FRAMES, log_mel_spectrogram, mel_filters


@pytest.fixture(scope="module")
def clip(espeak_clips):
    return espeak_clips[0].audio()


def test_frames_are_samples_over_hop():
    x = np.random.default_rng(0).normal(0, 0.1, 16000 * 2 + 77).astype(np.float32)
    assert log_mel_spectrogram(x).shape == (80, 200)
    assert log_mel_spectrogram(x, 128, padding=480000).shape == (128, 200 + N_FRAMES)


def test_values_are_floored_eight_decades_below_the_peak(clip):
    mel = log_mel_spectrogram(clip, padding=16000)
    assert mel.dtype == np.float32
    assert mel.max() - mel.min() == pytest.approx(2.0, abs=1e-5)  # 8 decades, scaled by 1/4
    assert np.all(mel[:, -50:] == mel.min())  # the zero padding sits on the floor


def test_too_short_input_is_an_error():
    with pytest.raises(ValueError, match="reflect padding"):
        log_mel_spectrogram(np.zeros(180, dtype=np.float32))
    assert log_mel_spectrogram(np.zeros(100, dtype=np.float32)).shape == (80, 0)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_equal_whispers_own(n_mels):
    pytest.importorskip("whisper.audio")
    from importlib.resources import as_file, files

    with as_file(files("whisper") / "assets" / "mel_filters.npz") as path:
        reference = np.load(path)[f"mel_{n_mels}"]
    np.testing.assert_allclose(mel_filters(n_mels), reference, atol=1e-7)


@pytest.mark.parametrize("padding", [0, 16000 * 3, 480000])
def test_log_mel_equals_openai_whispers(clip, padding):
    torch = pytest.importorskip("torch")
    whisper = pytest.importorskip("whisper")
    reference = whisper.log_mel_spectrogram(torch.from_numpy(clip), 80, padding=padding).numpy()
    ours = log_mel_spectrogram(clip, 80, padding=padding)
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, atol=1e-4)
