"""`edge-export` as a user meets it: exit codes, one-line errors, quantize and verify round trips."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from exporters.cli import main
from exporters.torch_onnx import quiet
from tests.exporters.cli_support import fails_with


class ConvNet(nn.Module):
    """Conv front end and linear head: what int8-matmul must treat differently."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.head = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).transpose(1, 2))


@pytest.fixture
def conv_model(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "src" / "net.onnx"
    path.parent.mkdir()
    with quiet():
        torch.onnx.export(ConvNet().eval(), (torch.randn(1, 8, 20),), str(path), dynamo=True,
                          external_data=False, input_names=["x"], output_names=["y"],
                          dynamic_shapes=({2: torch.export.Dim("t")},), opset_version=18, verbose=False)
    return path


def test_unknown_source_id_is_one_line_and_exit_2(capsys):
    fails_with(capsys, ["whisper", "--source", "whisper-huge"], "unknown source 'whisper-huge'",
               "whisper-tiny.en")


def test_a_voice_id_is_not_a_whisper_source(capsys):
    fails_with(capsys, ["whisper", "--source", "en_US-joe-medium"], "not a Whisper source")


def test_missing_path_is_named(capsys, tmp_path):
    fails_with(capsys, ["whisper", "--source", str(tmp_path / "nope.pt")], "nope.pt: no such file")


def test_directory_without_model_bin_is_the_wrong_format(capsys, tmp_path):
    fails_with(capsys, ["whisper", "--source", str(tmp_path)], "not a CTranslate2 Whisper directory")


def test_text_file_as_checkpoint_is_the_wrong_format(capsys, tmp_path):
    fake = tmp_path / "model.pt"
    fake.write_text("hello")
    fails_with(capsys, ["whisper", "--source", str(fake), "--out", str(tmp_path / "out")],
               "not a PyTorch checkpoint")
    assert not (tmp_path / "out").exists()


def test_truncated_model_bin_is_reported_and_nothing_is_written(capsys, tmp_path, tiny_en_dir):
    src = tmp_path / "ct2"
    src.mkdir()
    with (tiny_en_dir / "model.bin").open("rb") as fh:
        (src / "model.bin").write_bytes(fh.read(1_000_000))
    fails_with(capsys, ["whisper", "--source", str(src), "--out", str(tmp_path / "out"), "-q"],
               "model.bin", "truncated")
    assert not (tmp_path / "out").exists()


def test_unknown_variant_is_a_usage_error(capsys):
    fails_with(capsys, ["whisper", "--source", "whisper-tiny.en", "--variants", "fp32,int2"], "int2")


def test_out_dir_with_foreign_files_is_not_replaced(capsys, tmp_path, tiny_whisper):
    from exporters.whisper.reference import save_checkpoint

    save_checkpoint(tiny_whisper(), tmp_path / "tiny.pt")
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    fails_with(capsys, ["whisper", "--source", str(tmp_path / "tiny.pt"), "--out", str(out), "-q"],
               "refusing to replace")
    assert (out / "notes.txt").read_text() == "mine"


def test_quantize_rejects_a_file_that_is_not_onnx(capsys, tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    fails_with(capsys, ["quantize", str(bad), "--mode", "fp16", "--out", str(tmp_path / "o.onnx")],
               "not a valid ONNX model")
    assert not (tmp_path / "o.onnx").exists()


def test_quantize_of_a_missing_file_and_a_bad_out_name(capsys, tmp_path, conv_model):
    fails_with(capsys, ["quantize", str(tmp_path / "x.onnx"), "--mode", "fp16", "--out",
                        str(tmp_path / "o.onnx")], "no such file")
    fails_with(capsys, ["quantize", str(conv_model), "--mode", "fp16", "--out", str(tmp_path / "o.bin")],
               "must end in .onnx")


def test_verify_without_a_manifest_is_exit_2(capsys, tmp_path):
    fails_with(capsys, ["verify", str(tmp_path)], "manifest.json: missing")
    fails_with(capsys, ["verify", str(tmp_path / "nope")], "no such directory")


def test_int8_matmul_quantizes_the_linear_layer_and_leaves_the_conv_float(capsys, tmp_path, conv_model):
    out = tmp_path / "out" / "net.int8.onnx"
    assert main(["quantize", str(conv_model), "--mode", "int8-matmul", "--out", str(out), "-q",
                 "--repeats", "1"]) == 0
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "Conv" in ops and "ConvInteger" not in ops
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
    record = json.loads((out.parent / "manifest.json").read_text())["quantized"]["net.int8.onnx"]
    assert record["mode"] == "int8-matmul" and record["max_abs_diff"] < 0.1
    assert "net.int8.onnx" in capsys.readouterr().out


def test_quantized_model_verifies_until_it_is_altered(capsys, tmp_path, conv_model):
    out = tmp_path / "out" / "net.fp16.onnx"
    argv = ["quantize", str(conv_model), "--mode", "fp16", "--out", str(out), "-q", "--repeats", "1"]
    assert main(argv) == 0
    assert main(["verify", str(out.parent), "-q"]) == 0
    capsys.readouterr()
    model = onnx.load(str(out))
    model.graph.initializer[0].raw_data = np.zeros_like(
        onnx.numpy_helper.to_array(model.graph.initializer[0])).tobytes()
    onnx.save(model, str(out))
    fails_with(capsys, ["verify", str(out.parent), "-q"], "net.fp16.onnx", "altered")


def test_piper_voice_fp16_loads_and_stays_close(capsys, tmp_path, store):
    voice = store.require("en_US-joe-medium").path("en_US-joe-medium.onnx")
    out = tmp_path / "joe.fp16.onnx"
    assert main(["quantize", str(voice), "--mode", "fp16", "--out", str(out), "-q", "--repeats", "1"]) == 0
    record = json.loads((tmp_path / "manifest.json").read_text())["quantized"]["joe.fp16.onnx"]
    assert record["family"] == "piper" and record["rtf"] > 0
    assert record["max_abs_diff"] is not None and record["max_abs_diff"] < 0.5
    assert main(["verify", str(tmp_path), "-q"]) == 0


def test_console_entry_point_exits_2_with_one_line():
    result = subprocess.run([sys.executable, "-m", "exporters", "verify", "/nonexistent/dir"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["edge-export: error: /nonexistent/dir: no such directory"]
