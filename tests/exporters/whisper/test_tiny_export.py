"""A tiny random Whisper through the real export path: ONNX must match PyTorch numerically."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from benchmarks.clips import Clip
from edge_agent.audio.wav import WavWriter
from exporters.progress import Progress
from exporters.quantize import quantize
from exporters.verify import verify_dir
from exporters.whisper import reference as ref_mod
from exporters.whisper.onnx_export import export_decoder, export_encoder
from exporters.whisper.pipeline import ExportOptions, Source, export_whisper
from exporters.whisper.runner import DecodeConfig, OnnxWhisper


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, tiny_whisper) -> tuple[object, Path]:
    model = tiny_whisper()
    out = tmp_path_factory.mktemp("tiny")
    export_encoder(model, out / "encoder.fp32.onnx")
    export_decoder(model, out / "decoder.fp32.onnx")
    return model, out


def _config(model: object, max_tokens: int = 12) -> DecodeConfig:
    sp = ref_mod.specials(model)
    d = model.dims
    return DecodeConfig(sp.eot, sp.sot_sequence, sp.suppress_tokens, sp.begin_suppress_tokens,
                        d.n_text_layer, d.n_text_state, max_tokens)


def _mel(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.5, (80, frames)).astype(np.float32)


@pytest.mark.parametrize("frames", [3000, 400, 2])
def test_onnx_logits_match_pytorch_for_padded_and_truncated_input(tiny, frames):
    model, out = tiny
    runner = OnnxWhisper(out / "encoder.fp32.onnx", out / "decoder.fp32.onnx", _config(model))
    mel = _mel(frames)
    tokens = [*ref_mod.specials(model).sot_sequence, 400, 1000, 17, 9]
    expected = ref_mod.teacher_forced_logits(model, mel, tokens)
    got = runner.teacher_forced_logits(mel, tokens)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_encoder_returns_cross_kv_for_every_decoder_layer_at_half_the_frames(tiny):
    model, out = tiny
    runner = OnnxWhisper(out / "encoder.fp32.onnx", out / "decoder.fp32.onnx", _config(model))
    k, v = runner.encode(_mel(640))
    assert k.shape == v.shape == (2, 1, 320, 32)
    with torch.inference_mode():
        features = ref_mod.encode(model, torch.from_numpy(_mel(640))[None])
        expected = model.decoder.blocks[1].cross_attn.value(features)[0].numpy()
    np.testing.assert_allclose(v[1, 0], expected, atol=1e-4)


def test_decoder_with_empty_cache_then_one_token_equals_one_call(tiny):
    model, out = tiny
    runner = OnnxWhisper(out / "encoder.fp32.onnx", out / "decoder.fp32.onnx", _config(model))
    cross = runner.encode(_mel(200))
    empty = np.zeros((2, 1, 0, 32), dtype=np.float32)
    whole, cache = runner._step([50257, 50362, 11], (empty, empty), cross)
    _, part = runner._step([50257, 50362], (empty, empty), cross)
    last, grown = runner._step([11], part, cross)
    assert grown[0].shape == (2, 1, 3, 32)
    np.testing.assert_allclose(last[0], whole[2], atol=1e-5)
    np.testing.assert_allclose(grown[0], cache[0], atol=1e-5)


def test_the_decoder_takes_a_batch_and_each_row_equals_its_own_call(tiny):
    model, out = tiny
    runner = OnnxWhisper(out / "encoder.fp32.onnx", out / "decoder.fp32.onnx", _config(model))
    cross_k, cross_v = runner.encode(_mel(200))  # batch 1: every sequence listens to the same audio
    rng = np.random.default_rng(2)
    past_k, past_v = (rng.normal(size=(2, 5, 4, 32)).astype(np.float32) for _ in range(2))
    tokens = np.array([[5], [700], [9], [50256], [13]], dtype=np.int64)

    def run(rows: slice) -> list[np.ndarray]:
        return runner.decoder.run(None, {"tokens": tokens[rows], "self_k_in": past_k[:, rows],
                                         "self_v_in": past_v[:, rows], "cross_k": cross_k, "cross_v": cross_v,
                                         "offset": np.array(4, dtype=np.int64)})

    logits, k, v = run(slice(0, 5))
    assert logits.shape == (5, 1, 51864) and k.shape == v.shape == (2, 5, 5, 32)
    for i in range(5):
        one = run(slice(i, i + 1))
        np.testing.assert_allclose(one[0][0], logits[i], atol=1e-5)
        np.testing.assert_allclose(one[1][:, 0], k[:, i], atol=1e-6)


def test_greedy_decoding_matches_the_pytorch_reference(tiny):
    model, out = tiny
    runner = OnnxWhisper(out / "encoder.fp32.onnx", out / "decoder.fp32.onnx", _config(model))
    reference = ref_mod.Reference(model, max_tokens=12)
    mel = _mel(3000, seed=3)
    assert runner.decode(mel) == reference.decode(mel)


def test_decoder_stores_the_embedding_once(tiny):
    _, out = tiny
    graph = onnx.load(str(out / "decoder.fp32.onnx")).graph
    big = [i for i in graph.initializer if math.prod(i.dims) == 51864 * 32]
    assert len(big) == 1
    assert any(n.op_type == "Gemm" and n.input[1] == big[0].name for n in graph.node)


def test_encoder_attention_is_fused_once_per_layer(tiny):
    model, out = tiny
    ops = [n.op_type for n in onnx.load(str(out / "encoder.fp32.onnx")).graph.node]
    assert ops.count("MultiHeadAttention") == model.dims.n_audio_layer
    assert "Softmax" not in ops


# 4-bit blocks are coarse on random weights (real tiny.en: max logit diff ~7, the same words as fp32).
@pytest.mark.parametrize(("mode", "atol"), [("int8-matmul", 1.0), ("fp16", 0.05), ("int4-block", 8.0)])
def test_quantized_variants_load_and_stay_close_to_fp32(tiny, tmp_path, mode, atol):
    model, out = tiny
    for part in ("encoder", "decoder"):
        quantize(out / f"{part}.fp32.onnx", tmp_path / f"{part}.onnx", mode)
    runner = OnnxWhisper(tmp_path / "encoder.onnx", tmp_path / "decoder.onnx", _config(model))
    mel = _mel(600)
    tokens = [*ref_mod.specials(model).sot_sequence, 400, 1000]
    expected = ref_mod.teacher_forced_logits(model, mel, tokens)
    got = runner.teacher_forced_logits(mel, tokens)
    assert np.abs(got - expected).max() < atol
    assert np.corrcoef(got.ravel(), expected.ravel())[0, 1] > 0.95
    assert (tmp_path / "decoder.onnx").stat().st_size < (out / "decoder.fp32.onnx").stat().st_size * 0.6
    if mode == "int8-matmul":
        ops = {n.op_type for n in onnx.load(str(tmp_path / "encoder.onnx")).graph.node}
        assert "Conv" in ops and "ConvInteger" not in ops  # convolutions stay float
        tables = [i for i in onnx.load(str(tmp_path / "decoder.onnx")).graph.initializer
                  if math.prod(i.dims) == model.dims.n_vocab * model.dims.n_text_state]
        assert len(tables) == 1  # the lookup reads the projection's int8 table
    if mode == "int4-block":
        ops = {n.op_type for n in onnx.load(str(tmp_path / "decoder.onnx")).graph.node}
        assert {"MatMulNBits", "GatherBlockQuantized"} <= ops  # the tied embedding too


def noise_wav(path: Path, rng: np.random.Generator, seconds: int) -> Path:
    writer = WavWriter(path, 16000)
    writer.write((0.05 * rng.normal(size=16000 * seconds)).astype(np.float32))
    writer.close()
    return path


def test_whole_pipeline_writes_a_manifest_that_verifies(tmp_path, tiny_whisper):
    model = tiny_whisper(seed=1)
    checkpoint = tmp_path / "tiny.pt"
    ref_mod.save_checkpoint(model, checkpoint)
    rng = np.random.default_rng(0)
    clips = [Clip("no words here", "test", noise_wav(tmp_path / f"noise{i}.wav", rng, i + 1))
             for i in range(2)]
    source = Source("pt", str(checkpoint), checkpoint, "0" * 64)
    out = tmp_path / "export"
    options = ExportOptions(variants=("fp32", "int8", "fp16", "int4"), max_source_wer=None, max_tokens=6,
                            parity_clips=(0, 1), load_repeats=1, timing_repeats=1)
    manifest = export_whisper(source, out, clips, options, Progress(quiet=True))
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["variants"]["fp32"]["max_logit_diff"] < 1e-3
    assert manifest["default_variant"] in manifest["variants"]
    assert manifest["tokenizer"]["origin"].startswith("generated")
    assert [r["padded_to_30s"] for r in manifest["parity"]["runs"]] == [True, False]
    assert sorted(manifest["files"]) == sorted(p.name for p in out.iterdir() if p.name != "manifest.json")
    assert verify_dir(out, 1, Progress(quiet=True)) == []
    assert not list(tmp_path.glob(".export.staging-*"))
