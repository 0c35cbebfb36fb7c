"""Every ONNX export goes through torch's `torch.export`-based exporter, never the TorchScript one."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _export_calls() -> list[tuple[Path, ast.Call]]:
    calls = []
    for folder in ("tools/exporters", "tools/benchmarks", "edge_agent", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "export" and ast.unparse(node.func.value) == "torch.onnx"):
                    calls.append((path, node))
    return calls


def test_every_torch_onnx_export_passes_dynamo_true() -> None:
    calls = _export_calls()
    assert len(calls) >= 4  # whisper encoder and decoder, the vocoder, the test nets
    for path, call in calls:
        dynamo = {k.arg: ast.unparse(k.value) for k in call.keywords}.get("dynamo")
        assert dynamo == "True", (f"{path.relative_to(REPO)}:{call.lineno}: torch.onnx.export without "
                                  "dynamo=True uses the deprecated TorchScript exporter")
