"""The device's MelVocoder on a real export: what it refuses, with a reason, before running anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.errors import ModelError
from edge_agent.tts.melvocoder import MelVocoder


def _linked_copy(export: Path, target: Path, **changes: Any) -> Path:
    """The export's files linked into `target`, with a manifest changed by `changes`."""
    target.mkdir()
    for path in export.iterdir():
        if path.name != "manifest.json":
            (target / path.name).symlink_to(path)
    doc = json.loads((export / "manifest.json").read_text())
    doc.update(changes)
    (target / "manifest.json").write_text(json.dumps(doc))
    return target


def test_a_directory_without_a_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"manifest\.json: missing"):
        MelVocoder.load(tmp_path)


def test_a_whisper_export_is_not_a_vocoder(universal_export: Path, tmp_path: Path) -> None:
    copy = _linked_copy(universal_export, tmp_path / "v", format="edge-speech/whisper-onnx")
    with pytest.raises(ModelError, match="not a vocoder export"):
        MelVocoder.load(copy)


def test_an_unknown_variant_names_the_usable_ones(universal_export: Path) -> None:
    with pytest.raises(ModelError, match=r"no usable variant 'int4' \(usable: fp32, fp16\)"):
        MelVocoder.load(universal_export, "int4")


def test_an_altered_graph_is_refused_before_it_is_loaded(universal_export: Path, tmp_path: Path) -> None:
    copy = _linked_copy(universal_export, tmp_path / "v")
    target = copy / "vocoder.fp16.windowed.onnx"
    target.unlink()
    data = bytearray((universal_export / target.name).read_bytes())
    data[len(data) // 3] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="does not match the manifest"):
        MelVocoder.load(copy, "fp16")


def test_mels_of_the_wrong_shape_or_with_nan_are_refused(universal_export: Path) -> None:
    vocoder = MelVocoder.load(universal_export, "fp32", threads=1)
    try:
        with pytest.raises(ValueError, match=r"expected \[80, frames\]"):
            vocoder.synthesize(np.zeros((64, 10), np.float32))
        bad = np.full((80, 10), -5.0, np.float32)
        bad[3, 4] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            vocoder.synthesize(bad)
        assert vocoder.synthesize(np.zeros((80, 0), np.float32)).size == 0
        assert vocoder.synthesize(np.full((80, 3), -5.0, np.float32)).size == 3 * 256
    finally:
        vocoder.close()


def test_the_manifest_points_to_files_it_lists(universal_export: Path) -> None:
    doc = json.loads((universal_export / "manifest.json").read_text())
    for variant in doc["variants"].values():
        assert set(variant["files"].values()) <= set(doc["files"])
