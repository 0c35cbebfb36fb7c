"""The CTranslate2 reader: real tiny.en weights, and damaged files that must fail cleanly."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from edge_agent.errors import ModelError
from exporters.whisper.ct2 import read_ct2


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_ct2(path: Path, variables: dict[str, np.ndarray], aliases: dict[str, str] | None = None,
              version: int = 6) -> None:
    codes = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}
    out = struct.pack("<I", version) + _string("WhisperSpec") + struct.pack("<II", 3, len(variables))
    for name, array in variables.items():
        out += _string(name) + struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape)
        out += struct.pack("<BI", codes[array.dtype], array.nbytes) + array.tobytes()
    aliases = aliases or {}
    out += struct.pack("<I", len(aliases))
    for alias, target in aliases.items():
        out += _string(alias) + _string(target)
    path.write_bytes(out)


def test_reads_arrays_dtypes_and_aliases(tmp_path: Path):
    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    heads = np.array(6, dtype=np.int16)
    write_ct2(tmp_path / "model.bin", {"a/weight": w, "a/heads": heads}, {"b": "a/weight"})
    model = read_ct2(tmp_path / "model.bin")
    assert model.spec == "WhisperSpec"
    np.testing.assert_array_equal(model.get("a/weight"), w)
    np.testing.assert_array_equal(model.get("b"), w)
    assert model.scalar("a/heads") == 6


def test_real_tiny_en_model_bin_has_every_whisper_tensor(tiny_en_dir: Path):
    model = read_ct2(tiny_en_dir / "model.bin")
    assert model.get("decoder/embeddings/weight").shape == (51864, 384)
    assert model.get("encoder/conv1/weight").shape == (384, 80, 3)
    assert model.scalar("encoder/num_heads") == 6
    assert model.get("decoder/projection/weight") is model.get("decoder/embeddings/weight")


@pytest.mark.parametrize("cut", [3, 20, -20, -1])
def test_truncated_file_is_a_model_error_naming_the_file(tmp_path: Path, cut: int):
    write_ct2(tmp_path / "full.bin", {"x": np.ones((4, 4), dtype=np.float32)})
    data = (tmp_path / "full.bin").read_bytes()
    bad = tmp_path / "model.bin"
    bad.write_bytes(data[:cut])
    with pytest.raises(ModelError, match=r"model\.bin.*truncated"):
        read_ct2(bad)


def test_truncated_real_model_bin_fails_before_any_big_allocation(tmp_path: Path, tiny_en_dir: Path):
    with (tiny_en_dir / "model.bin").open("rb") as fh:
        (tmp_path / "model.bin").write_bytes(fh.read(5_000_000))
    with pytest.raises(ModelError, match="truncated"):
        read_ct2(tmp_path / "model.bin")


def test_unknown_version_dtype_and_trailing_bytes_are_rejected(tmp_path: Path):
    path = tmp_path / "model.bin"
    write_ct2(path, {"x": np.ones(2, dtype=np.float32)}, version=99)
    with pytest.raises(ModelError, match="binary version 99"):
        read_ct2(path)
    write_ct2(path, {"x": np.ones(2, dtype=np.float32)})
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data) + b"junk")
    with pytest.raises(ModelError, match="trailing"):
        read_ct2(path)
    offset = data.index(b"x\0") + 2 + 1 + 4  # name, rank, one dim
    data[offset] = 77
    path.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="unknown dtype id 77"):
        read_ct2(path)


def test_random_bytes_are_not_a_model(tmp_path: Path):
    path = tmp_path / "model.bin"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(ModelError, match="not a valid CTranslate2"):
        read_ct2(path)
