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


def _full_stft(audio, n_mels, padding):
    """The reference computation: every frame of the zero-padded signal through the STFT."""
    from edge_agent.asr.features import HOP_LENGTH, N_FFT, _window

    signal = np.concatenate([audio, np.zeros(padding, np.float32)])
    padded = np.pad(signal, (N_FFT // 2, N_FFT // 2), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH][:signal.size // HOP_LENGTH]
    spectrum = np.fft.rfft(frames * _window(), axis=-1)
    mel = mel_filters(n_mels) @ (np.abs(spectrum) ** 2).T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    return (np.maximum(log_spec, log_spec.max() - 8.0) + 4.0) / 4.0


@pytest.mark.parametrize("n_samples", [201, 399, 16000, 16001, 40123])
@pytest.mark.parametrize("padding", [0, 1, 199, 361, 5000, 480000 - 40123])
def test_padding_frames_skip_the_stft_but_equal_the_full_computation(n_samples, padding):
    audio = np.random.default_rng(n_samples).normal(0, 0.1, n_samples).astype(np.float32)
    ours = log_mel_spectrogram(audio, 80, padding=padding)
    np.testing.assert_allclose(ours, _full_stft(audio, 80, padding), atol=2e-5)


def test_short_audio_in_long_padding_reflects_the_padding_too():
    audio = np.random.default_rng(1).normal(0, 0.1, 120).astype(np.float32)
    np.testing.assert_allclose(log_mel_spectrogram(audio, 80, padding=3000),
                               _full_stft(audio, 80, 3000), atol=2e-5)
