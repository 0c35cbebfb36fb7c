"""`edge-export quantize`: compress, measure side by side, record in the manifest beside the output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.errors import UsageError
from edge_agent.models.store import sha256_file
from edge_agent.runtime.sessions import make_session
from exporters.compare import compare, load_inputs, sample_feeds
from exporters.manifest import MANIFEST, file_entry, read_manifest, write_json_atomic
from exporters.progress import Progress
from exporters.quantize import MODES, load_onnx, quantize


def quantize_and_measure(model: Path, out: Path, mode: str, *, inputs: Path | None, threads: int,
                         repeats: int, progress: Progress) -> str:
    if mode not in MODES:
        raise UsageError(f"--mode {mode!r}: choose from {', '.join(MODES)}")
    if out.suffix != ".onnx":
        raise UsageError(f"--out {out}: must end in .onnx")
    if out.exists() and out.resolve() == model.resolve():
        raise UsageError(f"--out {out}: would overwrite the source model")
    if out.is_dir():
        raise UsageError(f"--out {out}: is a directory")
    load_onnx(model)  # a missing, truncated or foreign file fails here, before anything is written
    session = make_session(model, threads)
    names = [i.name for i in session.get_inputs()]
    if inputs is not None:
        feeds, info = load_inputs(inputs, names), {"family": "given", "inputs_file": str(inputs)}
    else:
        feeds, info = sample_feeds(model, session)
    del session
    with progress.step(f"quantizing {model.name} ({mode})"):
        quantize(model, out, mode, feeds)
    try:
        with progress.step(f"measuring {out.name} against {model.name}"):
            result, reference = compare(model, out, feeds, info=info, threads=threads, repeats=repeats)
    except BaseException:
        out.unlink(missing_ok=True)  # a model that does not run is not left behind
        raise
    fixture = out.with_name(out.stem + ".parity.npz")
    arrays: dict[str, Any] = {"count": np.array(len(feeds))}
    for i, feed in enumerate(feeds):
        arrays |= {f"in_{n}_{i}": a for n, a in feed.items()}
        arrays[f"ref_{i}"] = reference[i]
    np.savez(fixture, **arrays)
    _record(out, fixture, model, mode=mode, names=names, result=result)
    return _summary(out.name, mode, result)


def _record(out: Path, fixture: Path, model: Path, *, mode: str, names: list[str],
            result: dict[str, Any]) -> None:
    directory = out.parent
    doc: dict[str, Any]
    if (directory / MANIFEST).is_file():
        doc = read_manifest(directory)
    else:
        doc = {"format": "edge-speech/onnx", "format_version": 1, "files": {}}
    doc.setdefault("quantized", {})[out.name] = {
        "mode": mode,
        "source": {"path": str(model.resolve()), "sha256": sha256_file(model)},
        "inputs": names, "fixture": fixture.name, **result,
    }
    doc["files"][out.name] = file_entry(out)
    doc["files"][fixture.name] = file_entry(fixture)
    write_json_atomic(directory / MANIFEST, doc)


def _summary(name: str, mode: str, r: dict[str, Any]) -> str:
    diff = "output length differs" if r["max_abs_diff"] is None else f"max |diff| {r['max_abs_diff']:.3g}"
    line = (f"{name} ({mode}): {r['size_bytes'] / 1e6:.1f} MB "
            f"(source {r['source_size_bytes'] / 1e6:.1f} MB); "
            f"load {r['load_s']:.2f} s (source {r['source_load_s']:.2f} s); "
            f"run {r['run_s'] * 1000:.0f} ms vs {r['source_run_s'] * 1000:.0f} ms "
            f"(x{r['speedup']:.2f}, {r['threads']} threads, median of {r['repeats']}); {diff}")
    if "rtf" in r:
        line += f"; RTF {r['rtf']:.3f} vs {r['source_rtf']:.3f} on {r['audio_s']:.2f} s of audio"
    return line
