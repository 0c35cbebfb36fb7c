import numpy as np

from edge_agent.announce.audiofiles import AudioFiles, pieces
from edge_agent.audio.wav import read_wav


def ramp(frames):
    return (np.arange(frames, dtype=np.float32) / frames - 0.5).astype(np.float32)


def test_a_saved_file_is_a_mono_16_bit_wav_and_no_temp_file_stays(tmp_path):
    files = AudioFiles(tmp_path / "audio")
    path = files.save("a", ramp(1000), 16000)
    assert path == tmp_path / "audio" / "a.wav"
    wav = read_wav(path)
    assert wav.sample_rate == 16000 and wav.channels == 1
    np.testing.assert_allclose(wav.samples, ramp(1000), atol=1e-4)
    assert [p.name for p in (tmp_path / "audio").iterdir()] == ["a.wav"]
    assert files.problem(str(path)) is None


def test_pieces_are_one_second_sentences_from_any_start(tmp_path):
    samples = ramp(8000 * 2 + 300)
    path = AudioFiles(tmp_path).save("a", samples, 8000)
    chunks = list(pieces(path))
    assert [(c.sentence, len(c.samples), c.last, c.engine) for c in chunks] == [
        (0, 8000, True, "audio"), (1, 8000, True, "audio"), (2, 300, True, "audio")]
    later = list(pieces(path, first=1))
    assert [c.sentence for c in later] == [1, 2]
    np.testing.assert_allclose(np.concatenate([c.samples for c in later]), samples[8000:], atol=1e-4)


def test_only_files_of_its_own_directory_are_read_or_removed(tmp_path):
    files = AudioFiles(tmp_path / "audio")
    outside = tmp_path / "precious.wav"
    AudioFiles(tmp_path).save("precious", ramp(100), 8000)
    assert "outside" in files.problem(str(outside))
    files.remove(str(outside))
    assert outside.exists()


def test_the_sweep_keeps_what_is_named_and_removes_the_rest(tmp_path):
    files = AudioFiles(tmp_path)
    keep = files.save("keep", ramp(100), 8000)
    files.save("orphan", ramp(100), 8000)
    (tmp_path / ".half.wav.x.part").write_bytes(b"half")
    assert files.sweep([str(keep)]) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["keep.wav"]
