"""The real tiny.en export (made once per run, cached by source sha256): format, parity, transcripts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clips import Clip
from edge_agent.text.wer import edit_distance, wer, words
from exporters.progress import Progress
from exporters.verify import verify_dir
from exporters.whisper import reference as ref_mod
from exporters.whisper.pipeline import MAX_WER_DRIFT, WER_DIGITS, ExportOptions
from exporters.whisper.runner import DecodeConfig, OnnxWhisper
from exporters.whisper.tokenizer_json import build_tokenizer_json

DIMS = {"n_mels", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
        "n_text_state", "n_text_head", "n_text_layer", "n_vocab"}


@pytest.fixture(scope="module")
def manifest(tiny_en_export: Path) -> dict:
    return json.loads((tiny_en_export / "manifest.json").read_text())


def test_pytorch_model_from_ct2_transcribes_the_clips(tiny_en_model, clips: list[Clip]):
    ref = ref_mod.Reference(tiny_en_model)
    picked = [clips[0], clips[2]]
    heard = [ref.transcribe(c.audio()).text for c in picked]
    assert wer([picked[0].text], heard[:1]) == 0.0
    # tiny.en hears espeak's "Set a timer" as "Santa timer": within what the exporter accepts
    assert wer([c.text for c in picked], heard) <= ExportOptions().max_source_wer


def test_pt_checkpoint_round_trip_gives_the_same_model(tiny_en_model, tmp_path: Path, clips: list[Clip]):
    path = tmp_path / "tiny.en.pt"
    ref_mod.save_checkpoint(tiny_en_model, path)
    loaded = ref_mod.load_model(path)
    mel = ref_mod.log_mel(clips[1].audio(), 80)
    assert ref_mod.Reference(loaded).decode(mel) == ref_mod.Reference(tiny_en_model).decode(mel)


def test_generated_tokenizer_matches_the_shipped_one(tiny_en_model, tiny_en_dir: Path):
    shipped = json.loads((tiny_en_dir / "tokenizer.json").read_text())["model"]
    built = build_tokenizer_json(tiny_en_model)["model"]
    assert built["vocab"] == shipped["vocab"]
    assert built["merges"] == [" ".join(m) if isinstance(m, list) else m for m in shipped["merges"]]


def test_manifest_holds_what_the_runtime_needs(manifest: dict, tiny_en_export: Path):
    assert set(manifest["dims"]) == DIMS and manifest["dims"]["n_vocab"] == 51864
    assert manifest["multilingual"] is False and manifest["sample_rate"] == 16000
    tokens = manifest["special_tokens"]
    assert tokens["sot_sequence"] == [tokens["sot"], tokens["no_timestamps"]] == [50257, 50362]
    assert tokens["eot"] == 50256 and tokens["languages"] == {}
    assert tokens["eot"] in manifest["begin_suppress_tokens"] and 220 in manifest["begin_suppress_tokens"]
    assert tokens["no_speech"] in manifest["suppress_tokens"]
    sha = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
    assert manifest["source"] == {"kind": "catalog", "id": "whisper-tiny.en", "sha256": sha}
    enc, dec = manifest["models"]["encoder"], manifest["models"]["decoder"]
    assert enc["inputs"] == [{"name": "mel", "dtype": "float32", "shape": [1, 80, "n_frames"]}]
    assert [o["shape"] for o in enc["outputs"]] == [[4, 1, "n_audio_frames", 384]] * 2
    assert [i["name"] for i in dec["inputs"]] == ["tokens", "self_k_in", "self_v_in", "cross_k", "cross_v",
                                                 "offset"]
    assert [o["name"] for o in dec["outputs"]] == ["logits", "self_k_out", "self_v_out"]
    assert set(manifest["variants"]) == {"fp32", "int8", "fp16", "int4"}
    assert manifest["variants"]["int4"]["mode"] == "encoder int8-matmul, decoder int4-block"
    for name, v in manifest["variants"].items():
        assert {"files", "size_bytes", "load_s", "rtf", "max_logit_diff", "wer"} <= set(v), name
        for f in v["files"].values():
            assert f in manifest["files"]
    assert "tokenizer.json" in manifest["files"]


def test_parity_is_measured_on_padded_and_unpadded_input(manifest: dict):
    runs = manifest["parity"]["runs"]
    assert any(r["padded_to_30s"] and r["n_frames"] == 3000 for r in runs)
    assert any(not r["padded_to_30s"] and r["n_frames"] < 3000 for r in runs)
    assert manifest["variants"]["fp32"]["max_logit_diff"] < 1e-3
    assert manifest["variants"]["fp16"]["max_logit_diff"] < 0.5


def test_fp32_export_transcribes_exactly_like_pytorch(manifest: dict):
    fp32 = manifest["variants"]["fp32"]
    assert fp32["wer"] == 0.0
    assert fp32["transcripts"] == [c["reference_transcript"] for c in manifest["clips"]]


def test_default_variant_is_the_fastest_surely_within_one_wer_point_on_the_sweep(manifest: dict):
    assert manifest["wer_unit"] == "fraction" and MAX_WER_DRIFT == 0.01
    pytorch = manifest["reference"]["wer_truth"]
    for v in manifest["variants"].values():
        assert v["wer_drift"] == pytorch_drift(v, pytorch)
        assert v["wer_drift_bound"] == v["sweep"]["drift_bound"] >= v["sweep"]["drift"]
    ok = {n: v for n, v in manifest["variants"].items()
          if "error" not in v and v["wer_drift_bound"] <= MAX_WER_DRIFT}
    assert manifest["default_variant"] == min(ok, key=lambda n: ok[n]["rtf"])
    assert manifest["default_rule"] == f"lowest rtf among variants with wer_drift_bound <= {MAX_WER_DRIFT}"


def test_the_default_is_chosen_on_over_a_hundred_clips_of_several_voices_speeds_and_a_room(manifest: dict):
    clips = manifest["sweep_clips"]
    voices = {c["voice"] for c in clips}
    assert len(clips) >= 100
    assert {"piper@0.8", "piper@1.0", "piper@1.25", "room:piper@1.0"} <= voices
    assert len([v for v in voices if v.startswith("espeak:")]) >= 4


def test_the_drift_bound_is_the_paired_per_clip_difference_from_pytorch(manifest: dict):
    """Recomputed from the recorded transcripts: edits clip by clip, variant minus PyTorch."""
    truths = [words(c["text"]) for c in manifest["sweep_clips"]]
    n_words = sum(len(t) for t in truths)

    def edits(texts: list[str]) -> np.ndarray:
        return np.array([edit_distance(t, words(h)) for t, h in zip(truths, texts, strict=True)], dtype=float)

    reference = edits(manifest["reference"]["sweep"]["transcripts"])
    assert manifest["reference"]["sweep"]["wer"] == pytest.approx(reference.sum() / n_words, abs=1e-4)
    for name, v in manifest["variants"].items():
        diff = edits(v["sweep"]["transcripts"]) - reference
        se = np.sqrt(diff.size) * diff.std(ddof=1) / n_words
        assert v["sweep"]["drift"] == pytest.approx(diff.sum() / n_words, abs=1e-4), name
        assert v["sweep"]["drift_bound"] == pytest.approx(diff.sum() / n_words + 1.645 * se, abs=2e-4), name
    assert manifest["variants"]["fp32"]["sweep"]["clips_differing"] <= 2  # the export equals PyTorch


def pytorch_drift(variant: dict, pytorch: float) -> float:
    return round(variant["wer_truth"] - pytorch, WER_DIGITS)


def test_exported_decoder_decodes_a_short_unpadded_clip(tiny_en_export: Path, manifest: dict,
                                                        clips: list[Clip], tiny_en_model):
    files = manifest["variants"]["fp32"]["files"]
    runner = OnnxWhisper(tiny_en_export / files["encoder"], tiny_en_export / files["decoder"],
                         DecodeConfig.from_manifest(manifest, max_tokens=30))
    audio = np.concatenate([clips[0].audio(), np.zeros(4 * 16000, dtype=np.float32)])  # Whisper needs a tail
    mel = ref_mod.log_mel(audio, 80, None)
    assert mel.shape[1] < 1000
    tokens = runner.decode(mel)
    assert wer([clips[0].text], [ref_mod.Reference(tiny_en_model).text(tokens)]) == 0.0


def test_verify_accepts_the_export(tiny_en_export: Path):
    assert verify_dir(tiny_en_export, 2, Progress(quiet=True)) == []


def test_verify_names_an_altered_file(tiny_en_export: Path, tmp_path: Path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_en_export, copy)
    target = copy / "decoder.fp16.onnx"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    problems = verify_dir(copy, 2, Progress(quiet=True))
    assert problems == [f"{target}: sha256 differs from the manifest (altered)"]


def test_variant_table_lists_every_variant_and_marks_the_default(manifest: dict):
    from exporters.report import variant_table

    table = variant_table(manifest)
    assert f"| {manifest['default_variant']} (default) |" in table
    assert all(f"| {name}" in table for name in manifest["variants"])
    assert "| PyTorch (reference) |" in table
