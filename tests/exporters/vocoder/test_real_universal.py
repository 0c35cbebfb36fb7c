"""The real universal HiFi-GAN export (once per run, cached by source sha256): parity, round trip, verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.tts.melvocoder import MelVocoder
from edge_agent.tts.windowed import FIRST_FRAMES
from exporters.progress import Progress
from exporters.verify import verify_dir

SHA256 = "771eaf4876485a35e25577563d390c262e23c2421e4a8c929eacfde34a5b7a60"


@pytest.fixture(scope="module")
def manifest(universal_export: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((universal_export / "manifest.json").read_text())
    return doc


def test_manifest_records_the_source_the_analysis_and_the_window(manifest: dict[str, Any]) -> None:
    assert manifest["format"] == "edge-speech/vocoder-onnx"
    assert manifest["source"]["id"] == "hifigan-universal" and manifest["source"]["sha256"] == SHA256
    assert manifest["sample_rate"] == 22050
    assert manifest["mel"] | {"n_mels": 80, "hop": 256, "n_fft": 1024, "fmax": 8000.0} == manifest["mel"]
    window = manifest["window"]
    assert (window["channels"], window["hop"], window["latent"]) == (80, 256, "mel")
    assert 8 <= window["context"] <= 24 and len(window["cuts"]) >= 4
    assert manifest["exporter"]["torch_exporter"].startswith("torch.export")
    assert manifest["models"]["whole"]["inputs"] == [{"name": "mel", "dtype": "float32",
                                                      "shape": [1, 80, "frames"]}]


def test_every_variant_is_measured_against_pytorch(manifest: dict[str, Any]) -> None:
    for name in ("fp32", "fp16"):
        v = manifest["variants"][name]
        assert "error" not in v, v.get("error")
        assert v["size_bytes"] > 0 and v["load_s"] > 0 and v["rtf"] > 0 and v["rtf_whole"] > 0
        assert len(v["transcripts"]) == len(manifest["clips"])
    fp32, fp16 = manifest["variants"]["fp32"], manifest["variants"]["fp16"]
    assert fp32["max_abs_diff"] < 1e-4 and fp32["window_diff"] < 1e-4  # windows included
    assert 1e-4 < fp16["max_abs_diff"] < 0.5
    assert fp16["window_diff"] < 2 * fp16["max_abs_diff"]  # the device path rounds no more than the whole
    assert fp16["size_bytes"] < 0.6 * fp32["size_bytes"]
    assert manifest["default_variant"] in manifest["variants"]


def test_the_round_trip_keeps_the_words(manifest: dict[str, Any]) -> None:
    """Real speech -> mel -> our ONNX vocoder -> our ASR: the clips' text comes back."""
    assert manifest["clips_wer_truth"] <= 0.1
    assert manifest["reference"]["wer_truth"] <= 0.2
    fp32 = manifest["variants"]["fp32"]
    assert fp32["wer_drift"] <= 0.01 and fp32["wer"] <= 0.01  # the same words as PyTorch's vocoding
    assert fp32["mel_distance"] == pytest.approx(manifest["reference"]["mel_distance"], abs=0.01)
    assert fp32["mel_distance"] < 1.0  # nats: the resynthesis has the spectrum it was given


def test_verify_passes_and_names_an_altered_file(universal_export: Path, tmp_path: Path) -> None:
    assert verify_dir(universal_export, 2, Progress(quiet=True)) == []
    copy = tmp_path / "copy"
    shutil.copytree(universal_export, copy)
    target = copy / "vocoder.fp16.windowed.onnx"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    problems = verify_dir(copy, 2, Progress(quiet=True))
    assert problems and str(target) in problems[0]


def test_the_device_vocoder_streams_windows_of_the_export(universal_export: Path) -> None:
    with np.load(universal_export / "parity.npz") as data:
        mel, expected = data["run0_mel"][:, :120], data["run0_wave"]
    vocoder = MelVocoder.load(universal_export, "fp32", threads=2)
    try:
        pieces = list(vocoder.stream(mel))
        whole = vocoder.synthesize(mel)
    finally:
        vocoder.close()
    assert vocoder.sample_rate == 22050 and len(pieces) >= 2
    assert pieces[0].size == FIRST_FRAMES * 256  # playback can start after the first small window
    assert np.array_equal(np.concatenate(pieces), whole) and whole.size == 120 * 256
    # The first 120 frames alone decode like the whole clip, except near the cut edge.
    inner = 100 * 256
    assert np.abs(whole[:inner] - np.clip(expected[:inner], -1, 1)).max() < 1e-4
