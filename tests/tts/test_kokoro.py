"""The Kokoro-82M voice on its real int8 weights (fetched once into the test cache)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge_agent.errors import ModelError
from edge_agent.models import ModelStore, load_catalog
from edge_agent.tts.kokoro import KokoroVoice, load_styles, load_vocab, loader

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def kokoro_files(shared_cache):
    return ModelStore(shared_cache, load_catalog()).fetch("kokoro-82m")


@pytest.fixture(scope="session")
def kokoro(kokoro_files, shared_cache):
    return loader(ModelStore(shared_cache, load_catalog()), speaker="jf_alpha", threads=1)("kokoro-82m")


def test_kokoro_speaks_a_sentence_at_24_khz(kokoro):
    assert kokoro.sample_rate == 24000
    (sentence,) = kokoro.sentences("The front door is open.")
    audio = np.concatenate(list(kokoro.synthesize_sentence(sentence)))
    seconds = len(audio) / 24000
    assert 0.8 < seconds < 4.0
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0
    assert np.sqrt(np.mean(audio ** 2)) > 0.02


def test_phonemes_map_through_the_vocabulary(kokoro):
    (ids,) = kokoro.phoneme_ids("Hello there.")
    assert ids and all(i in set(kokoro.vocab.values()) for i in ids)
    assert ids[-1] == kokoro.vocab["."]


def test_long_text_is_cut_into_model_sized_calls(kokoro):
    text = ", ".join(["the quick brown fox jumps over the lazy dog"] * 20) + "."
    calls = kokoro.phoneme_ids(text)
    assert len(calls) >= 2
    assert all(0 < len(c) <= kokoro.max_tokens for c in calls)


def test_model_takes_one_sequence_per_call(kokoro_files):
    """Why the server runs Kokoro sentences concurrently rather than batched."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(kokoro_files.path("kokoro-v1.0.int8.onnx")),
                                   providers=["CPUExecutionProvider"])
    shapes = {i.name: i.shape for i in session.get_inputs()}
    assert shapes["tokens"][0] == 1 and shapes["style"] == [1, 256]


def test_unknown_speaker_lists_the_known_ones(kokoro_files):
    with pytest.raises(ModelError, match=r"no speaker 'af_heart' \(known: jf_alpha"):
        load_styles(kokoro_files.path("voices_ja.npz"), "af_heart")


def test_broken_vocabulary_is_a_model_error(tmp_path):
    bad = tmp_path / "vocab.json"
    bad.write_text(json.dumps({"vocab": ["not", "a", "map"]}))
    with pytest.raises(ModelError, match="not a Kokoro vocabulary"):
        load_vocab(bad)
    bad.write_text("{}")
    with pytest.raises(ModelError, match="empty"):
        load_vocab(bad)


def test_too_many_tokens_for_one_call_is_refused(kokoro):
    with pytest.raises(ValueError, match="Kokoro takes"):
        kokoro.synthesize_ids([16] * (kokoro.max_tokens + 1))


def test_kokoro_is_a_voice(kokoro):
    assert isinstance(kokoro, KokoroVoice)
    assert kokoro.sentences("One. Two!") == ["One.", "Two!"]


def test_the_variant_follows_the_providers(caplog):
    from edge_agent.runtime.providers import CPU, Accelerator
    from edge_agent.tts.kokoro import variant_for

    every = ["kokoro-v1.0.int8.onnx", "kokoro-v1.0.fp16.onnx", "kokoro-v1.0.fp32.onnx"]
    assert variant_for(every, CPU) == "kokoro-v1.0.int8.onnx"
    assert variant_for(every, Accelerator("server", ("cuda", "cpu"))) == "kokoro-v1.0.fp16.onnx"
    trt = Accelerator("server", ("tensorrt", "cuda", "cpu"))
    assert variant_for(every[::2], trt) == "kokoro-v1.0.fp32.onnx"
    assert variant_for(every[1:], CPU) == "kokoro-v1.0.fp32.onnx"
    assert variant_for(every[:1], Accelerator("server", ("cuda", "cpu"))) == "kokoro-v1.0.int8.onnx"
    assert "no fp16 or fp32 variant" in caplog.text


def test_the_loaded_voice_names_its_variant_and_runs_through_io_binding(kokoro, kokoro_files):
    """The IO-bound run (what `synthesize_ids` does) gives the samples of a plain `run`."""
    import onnxruntime as ort

    assert kokoro.variant == "kokoro-v1.0.int8.onnx"
    (ids,) = kokoro.phoneme_ids("The front door is open.")
    bound = kokoro.synthesize_ids(ids)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    plain_session = ort.InferenceSession(str(kokoro_files.path("kokoro-v1.0.int8.onnx")), opts,
                                         providers=["CPUExecutionProvider"])
    plain = plain_session.run(None, {"tokens": np.array([[0, *ids, 0]], dtype=np.int64),
                                     "style": kokoro._styles[len(ids)], "speed": kokoro._speed})[0]
    np.testing.assert_allclose(bound, np.clip(plain.reshape(-1), -1, 1), atol=1e-5)
