"""Our numpy + onnxruntime Whisper against the exporter's PyTorch reference: the same token ids."""

import numpy as np
import pytest

from edge_agent.asr.features import N_FRAMES
from edge_agent.asr.whisper import Padding

pytestmark = pytest.mark.slow

MAX_TOKENS = 64
"""Enough for any command; bounds the cost when a short window makes Whisper loop."""


@pytest.fixture(scope="module")
def reference(shared_cache):
    pytest.importorskip("torch", reason="the PyTorch reference needs the export extra")
    from edge_agent.models import ModelStore, load_catalog
    from exporters.whisper.reference import Reference, load_model

    source = ModelStore(shared_cache, load_catalog()).fetch("whisper-tiny.en")
    return Reference(load_model(source.paths["model.bin"].parent), max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def fp32(whisper_dir):
    from edge_agent.asr.whisper import WhisperOnnx

    return WhisperOnnx.load(whisper_dir, "fp32", threads=2)


def our_tokens(model, audio, frames):
    mel = model.features(audio, frames)
    cross_k, cross_v = model.encode(mel)
    tokens, _, _ = model.decode(cross_k, cross_v, model.prompt("en"), max_tokens=MAX_TOKENS)
    return tuple(tokens)


def test_log_mel_matches_the_references(fp32, espeak_clips):
    from exporters.whisper.reference import log_mel

    audio = espeak_clips[2].audio()
    for frames in (N_FRAMES, Padding().frames(audio.size)):
        np.testing.assert_allclose(fp32.features(audio, frames), log_mel(audio, 80, frames), atol=1e-4)


@pytest.mark.parametrize("padding", ["full", "bucket"])
def test_token_ids_equal_pytorch_on_the_test_clips(fp32, reference, espeak_clips, piper_clips, padding):
    clips = espeak_clips[:4] + piper_clips[:4]
    for clip in clips:
        audio = clip.audio()
        frames = Padding(padding).frames(audio.size)
        theirs = reference.transcribe(audio, n_frames=frames)
        assert our_tokens(fp32, audio, frames) == theirs.tokens, clip.text
        assert fp32.tokenizer.decode(theirs.tokens).strip() == theirs.text


def test_prompt_and_suppression_come_from_the_manifest(fp32, reference):
    sp = reference.specials
    assert fp32.prompt("en") == list(sp.sot_sequence)
    assert set(sp.suppress_tokens) <= set(fp32._suppress.tolist())
    assert set(sp.begin_suppress_tokens) == set(fp32._blank.tolist())


def test_beam_search_equals_openai_whispers_on_the_test_clips(fp32, reference, espeak_clips, piper_clips):
    import torch
    import whisper

    from exporters.whisper.reference import log_mel

    options = whisper.DecodingOptions(language="en", beam_size=5, without_timestamps=True, fp16=False,
                                      sample_len=MAX_TOKENS)
    for clip in espeak_clips[:4] + piper_clips[:4]:
        audio = clip.audio()
        mel = log_mel(audio, 80, N_FRAMES)
        with torch.inference_mode():
            theirs = whisper.decode(reference.model, torch.from_numpy(mel), options)
        cross_k, cross_v = fp32.encode(fp32.features(audio, N_FRAMES))
        tokens, _, _ = fp32.decode_beam(cross_k, cross_v, fp32.prompt("en"), MAX_TOKENS, beam_size=5)
        assert fp32.tokenizer.decode(tokens).strip() == theirs.text, clip.text
        assert tuple(tokens) == tuple(theirs.tokens), clip.text
