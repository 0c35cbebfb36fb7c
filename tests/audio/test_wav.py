import os
import stat
import wave

import numpy as np
import pytest

from edge_agent.audio.wav import WavWriter, read_wav
from edge_agent.errors import AudioError


def write_pcm(path, data: bytes, rate=16000, channels=1, width=2):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data)


def test_writer_round_trips_and_renames_into_place(tmp_path):
    path = tmp_path / "out.wav"
    tone = (0.5 * np.sin(np.arange(8000) / 10)).astype(np.float32)
    writer = WavWriter(path, 16000)
    writer.write(tone)
    assert not path.exists(), "nothing at the target until close"
    writer.close()
    audio = read_wav(path)
    assert audio.sample_rate == 16000 and audio.channels == 1
    np.testing.assert_allclose(audio.samples, tone, atol=1 / 16000)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, umask, mode):
    """A WAV is for a player or a colleague to read: mode 0666 less the umask, as `cp` makes it
    (mkstemp's 0600 hid it from them)."""
    path = tmp_path / "out.wav"
    old = os.umask(umask)
    try:
        writer = WavWriter(path, 16000)
        writer.write(np.zeros(100, dtype=np.float32))
        writer.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_a_writer_beside_a_leftover_temp_file_does_not_touch_it(tmp_path):
    leftover = tmp_path / ".out.wav.1234abcd.part"
    leftover.write_bytes(b"from a killed run")
    writer = WavWriter(tmp_path / "out.wav", 16000)
    writer.close()
    assert leftover.read_bytes() == b"from a killed run"
    assert sorted(p.name for p in tmp_path.iterdir()) == [leftover.name, "out.wav"]


def test_aborted_writer_leaves_nothing(tmp_path):
    writer = WavWriter(tmp_path / "out.wav", 16000)
    writer.write(np.zeros(100, dtype=np.float32))
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_stereo_is_mixed_to_mono(tmp_path):
    left = np.full(100, 16384, dtype="<i2")
    right = np.zeros(100, dtype="<i2")
    write_pcm(tmp_path / "s.wav", np.stack([left, right], axis=1).tobytes(), channels=2)
    audio = read_wav(tmp_path / "s.wav")
    assert audio.channels == 2
    np.testing.assert_allclose(audio.samples, 0.25)


def test_24_bit_is_decoded(tmp_path):
    value = -(1 << 22)  # -0.5 full scale
    raw = (value & 0xFFFFFF).to_bytes(3, "little") * 10
    write_pcm(tmp_path / "p.wav", raw, width=3)
    np.testing.assert_allclose(read_wav(tmp_path / "p.wav").samples, -0.5)


def test_truncated_wav_is_a_clear_error(tmp_path):
    path = tmp_path / "t.wav"
    write_pcm(path, b"\x01\x00" * 16000)
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(AudioError, match="truncated"):
        read_wav(path)


@pytest.mark.parametrize("content", [b"", b"not a wav at all", b"RIFF\x00\x00"])
def test_non_wav_is_a_clear_error(tmp_path, content):
    path = tmp_path / "x.wav"
    path.write_bytes(content)
    with pytest.raises(AudioError, match="not a PCM WAV file"):
        read_wav(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(AudioError, match="no such file"):
        read_wav(tmp_path / "absent.wav")


def float_wav(path, frames: np.ndarray, rate=16000):
    """IEEE float32 WAV (format tag 3), which the `wave` module cannot read."""
    import struct

    channels = frames.shape[1]
    data = frames.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", len(data)) + data)
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


def test_whole_file_and_block_reader_decode_the_same_float_stereo_file(tmp_path):
    from edge_agent.audio.sources import WavFileSource

    left = (0.5 * np.sin(np.arange(4000) / 7)).astype(np.float32)
    path = float_wav(tmp_path / "f.wav", np.stack([left, -0.5 * left], axis=1))
    audio = read_wav(path)
    assert (audio.sample_rate, audio.channels) == (16000, 2)
    np.testing.assert_allclose(audio.samples, 0.25 * left, atol=1e-6)
    streamed = np.concatenate(list(WavFileSource(path, block_s=0.05).blocks()))
    np.testing.assert_array_equal(streamed, audio.samples)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2])
def test_encoded_raw_pcm_decodes_to_the_same_signal(width, channels):
    from pathlib import Path

    from edge_agent.audio.wav import decode, encode_pcm

    signal = (0.7 * np.sin(np.arange(999) / 7)).astype(np.float32)
    signal[:2] = (1.5, -1.5)  # clipped, not wrapped
    data = encode_pcm(signal, width, channels)
    assert len(data) == 999 * width * channels
    back = decode(data, "pcm", width, channels, Path("raw"))
    np.testing.assert_allclose(back, np.clip(signal, -1, 1), atol=0.01 if width == 1 else 1e-4)
