"""`manifest.json`: what an export directory holds, how it was measured, and every file's hash."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edge_agent.errors import ModelError, UsageError
from edge_agent.models.jsonfile import read_json
from edge_agent.models.store import sha256_file
from edge_agent.text.wer import UNIT as WER_UNIT

MANIFEST = "manifest.json"

_WER_SCALE = {WER_UNIT: 1.0, "percent": 0.01}
"""What turns a manifest's WERs into fractions, by its `wer_unit`."""

_DTYPES = {1: "float32", 10: "float16", 7: "int64", 6: "int32", 9: "bool", 3: "int8", 2: "uint8"}


def file_entry(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "size": path.stat().st_size}


def io_signature(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Inputs and outputs of an ONNX graph: name, dtype and shape (ints or symbolic names)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def describe(values: Any) -> list[dict[str, Any]]:
        out = []
        for v in values:
            t = v.type.tensor_type
            shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
            out.append({"name": v.name, "dtype": _DTYPES.get(t.elem_type, str(t.elem_type)), "shape": shape})
        return out

    inits = {i.name for i in graph.initializer}
    return {"inputs": describe(v for v in graph.input if v.name not in inits),
            "outputs": describe(graph.output)}


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise ModelError(f"{directory}: no such directory")
    doc = read_json(path, "not an export directory")
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise ModelError(f"{path}: not an edge-export manifest (no 'files')")
    return doc


def wer_scale(doc: dict[str, Any]) -> float:
    """The factor that turns `doc`'s WERs into fractions; manifests without `wer_unit` recorded percent."""
    unit = doc.get("wer_unit", "percent")
    try:
        return _WER_SCALE[unit]
    except (KeyError, TypeError):
        raise ModelError(f"manifest: unknown wer_unit {unit!r} (known: {', '.join(_WER_SCALE)})") from None


def exporter_info(package: Path) -> dict[str, str]:
    """Library versions and a hash of an exporter's own code (`package`'s modules and the
    shared steps: the pipeline skeleton and the quantizer): a changed exporter re-exports."""
    import onnx
    import onnxruntime
    import torch

    digest = hashlib.sha256()
    shared = [Path(__file__).with_name(name) for name in ("pipeline.py", "quantize.py")]
    for path in sorted([*package.glob("*.py"), *shared]):
        digest.update(path.read_bytes())
    return {"revision": digest.hexdigest()[:16], "torch": torch.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__}


def check_target(out_dir: Path) -> None:
    """Refuse to replace anything but an earlier export directory."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise UsageError(f"--out {out_dir}: not empty and not an export directory; refusing to replace it")


@contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """A staging directory beside `out_dir`, renamed into place when the block completes.

    An interrupted export never leaves a half-written model directory: the staging
    directory is removed on any error, and the old export is replaced only at the end.
    """
    check_target(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        yield stage
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{int(time.time())}")
            out_dir.rename(old)
        stage.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def one_line(exc: BaseException) -> str:
    """An exception as one short line, for a variant that failed."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]
