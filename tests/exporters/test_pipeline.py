"""The skeleton both exporters follow (`exporters.pipeline`): variants, their failures, the default."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from edge_agent.errors import ModelError, UsageError
from exporters.pipeline import Kind, build_variants, time_side_by_side
from exporters.progress import Progress

KIND = Kind("edge-speech/test", 1, ("fp32", "int8", "fp16"), Path(__file__).parent, 0.01, "round-trip WER",
            lambda v: f" (whole graph {v['rtf_whole']:.3f})")


def measured(rtf: float, drift: float) -> dict[str, Any]:
    return {"rtf": rtf, "wer_drift": drift}


def test_variants_are_parsed_once_each_in_order_and_unknown_ones_are_named():
    assert KIND.parse_variants(" int8,fp32,int8 ") == ("int8", "fp32")
    with pytest.raises(UsageError, match=r"unknown int2 \(choose from fp32, int8, fp16\)"):
        KIND.parse_variants("fp32,int2")
    with pytest.raises(UsageError, match="unknown empty list"):
        KIND.parse_variants(" , ")


def test_the_default_is_the_fastest_variant_within_the_drift_and_failures_never_count():
    variants = {"fp32": measured(0.30, 0.0), "int8": measured(0.10, 0.02), "fp16": measured(0.20, 0.01),
                "int4": {"error": "RuntimeError: no kernel"}}
    assert KIND.pick_default(variants) == "fp16"
    with pytest.raises(ModelError, match=r"no variant keeps the round-trip WER within \+0.01"):
        KIND.pick_default({"int8": measured(0.1, 0.02), "int4": {"error": "x"}})


def test_a_kind_may_judge_a_bound_on_the_drift_rather_than_the_drift():
    bounded = Kind("edge-speech/test", 1, ("fp32", "int8"), Path(__file__).parent, 0.01, "WER",
                   lambda v: "", drift_key="wer_drift_bound")
    variants = {"fp32": {"rtf": 0.3, "wer_drift": 0.0, "wer_drift_bound": 0.0},
                "int8": {"rtf": 0.1, "wer_drift": 0.005, "wer_drift_bound": 0.02}}
    assert KIND.pick_default(variants) == "int8"
    assert bounded.pick_default(variants) == "fp32"  # a drift within 0.01 but not surely so
    assert bounded.default_rule == "lowest rtf among variants with wer_drift_bound <= 0.01"


def test_a_failing_variant_is_recorded_with_its_files_removed_and_the_others_load(tmp_path: Path):
    def derive(name: str, files: dict[str, str]) -> None:
        for f in files.values():
            (tmp_path / f).write_bytes(b"onnx")
        if name == "int8":
            raise RuntimeError("quantizer refused\nsecond line")

    def prepare(name: str, files: dict[str, str]) -> tuple[str, dict[str, Any]]:
        return f"session {name}", {"size_bytes": 4}

    (tmp_path / "m.fp32.onnx").write_bytes(b"onnx")
    variants, loaded = build_variants(
        tmp_path, ("int8", "fp16"), files=lambda name: {"whole": f"m.{name}.onnx"}, mode=lambda name: name,
        derive=derive, prepare=prepare, checking="waveform", progress=Progress(quiet=True))
    assert list(variants) == ["fp32", "int8", "fp16"]  # fp32 first: the others derive from it
    assert variants["int8"] == {"files": {}, "mode": "int8", "error": "RuntimeError: quantizer refused"}
    assert not (tmp_path / "m.int8.onnx").exists() and (tmp_path / "m.fp16.onnx").exists()
    assert loaded == {"fp32": "session fp32", "fp16": "session fp16"}
    assert variants["fp16"] == {"files": {"whole": "m.fp16.onnx"}, "mode": "fp16", "size_bytes": 4}


def test_fp32_that_does_not_run_stops_the_export(tmp_path: Path):
    def prepare(name: str, files: dict[str, str]) -> tuple[str, dict[str, Any]]:
        raise ValueError("graph is invalid")

    with pytest.raises(ModelError, match="fp32 export does not run: ValueError: graph is invalid"):
        build_variants(tmp_path, ("fp32",), files=lambda name: {"whole": f"m.{name}.onnx"},
                       mode=lambda name: name, derive=lambda name, files: None, prepare=prepare,
                       checking="waveform", progress=Progress(quiet=True))


def test_timing_interleaves_keeps_every_output_and_runs_pytorch_in_the_first_pass_only():
    calls: list[tuple[str, int]] = []

    def contender(name: str) -> Any:
        def run(item: int) -> str:
            calls.append((name, item))
            return f"{name}:{item}"
        return run

    best, outputs = time_side_by_side({"int8": contender("int8"), "pytorch": contender("pytorch")},
                                      [1, 2], repeats=3)
    assert calls[:4] == [("int8", 1), ("pytorch", 1), ("int8", 2), ("pytorch", 2)]
    assert calls.count(("pytorch", 1)) == 1 and calls.count(("int8", 1)) == 3
    assert outputs == {"int8": ["int8:1", "int8:2"], "pytorch": ["pytorch:1", "pytorch:2"]}
    assert all(len(times) == 2 and all(0 <= t < float("inf") for t in times) for times in best.values())


def test_a_report_line_names_the_model_s_own_figures_and_its_drift():
    progress = Progress(io.StringIO())
    KIND.report(progress, "fp16", {"size_bytes": 2.5e6, "load_s": 0.25, "rtf": 0.1, "rtf_whole": 0.2,
                                   "wer_truth": 0.05, "wer_drift": 0.01})
    KIND.report(progress, "int8", {"error": "RuntimeError: no kernel"})
    err = progress.stream.getvalue()
    assert ("  fp16: 2.5 MB, load 0.25 s, RTF 0.100 (whole graph 0.200), round-trip WER 0.050 "
            "(drift +0.010)") in err
    assert "  int8: FAILED: RuntimeError: no kernel" in err
