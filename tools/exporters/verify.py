"""`edge-export verify DIR`: every file's hash, then the parity the manifest recorded, re-measured.

Hashes are checked first and nothing is loaded into onnxruntime unless they all hold: a
damaged ONNX file can crash the runtime's process, an altered one must not be trusted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.models.store import sha256_file
from edge_agent.runtime.sessions import make_session
from edge_agent.tts.melvocoder import FORMAT as VOCODER_FORMAT
from exporters.manifest import MANIFEST, read_manifest
from exporters.progress import Progress
from exporters.whisper.runner import DecodeConfig, OnnxWhisper

_MODEL_SUFFIXES = (".onnx", ".data", ".npz", ".onnx_data")


def tolerance(recorded: float) -> float:
    """How far a re-measured difference may drift from the recorded one (threads, BLAS paths)."""
    return max(2.0 * recorded, recorded + 1e-3)


def check_files(directory: Path, doc: dict[str, Any]) -> list[str]:
    problems = []
    for name, entry in sorted(doc["files"].items()):
        path = directory / name
        if Path(name).name != name or name == MANIFEST:
            problems.append(f"{directory / MANIFEST}: bad file name {name!r}")
        elif not path.is_file():
            problems.append(f"{path}: missing")
        elif (size := path.stat().st_size) != entry.get("size"):
            problems.append(f"{path}: {size} bytes, the manifest says {entry.get('size')} "
                            "(truncated or altered)")
        elif sha256_file(path) != entry.get("sha256"):
            problems.append(f"{path}: sha256 differs from the manifest (altered)")
    for path in sorted(directory.iterdir()):
        if path.suffix in _MODEL_SUFFIXES and path.name not in doc["files"]:
            problems.append(f"{path}: not in the manifest")
    return problems


def verify_dir(directory: Path, threads: int, progress: Progress) -> list[str]:
    """Problems found (empty when everything holds); each names the offending file."""
    doc = read_manifest(directory)
    problems = check_files(directory, doc)
    progress(f"{directory}: {len(doc['files'])} files, hashes {'ok' if not problems else 'FAILED'}")
    if problems:
        return problems
    if doc.get("format") == VOCODER_FORMAT:
        problems += _vocoder(directory, doc, threads, progress)
    elif "variants" in doc and "parity" in doc:
        problems += _whisper(directory, doc, threads, progress)
    for name, record in doc.get("quantized", {}).items():
        problems += _quantized(directory, name, record, threads, progress)
    return problems


def _whisper(directory: Path, doc: dict[str, Any], threads: int, progress: Progress) -> list[str]:
    problems = []
    config = DecodeConfig.from_manifest(doc)
    with np.load(directory / doc["parity"]["file"]) as data:
        arrays = {k: data[k] for k in data.files}
    for name, variant in doc["variants"].items():
        if "error" in variant:
            continue
        files = variant["files"]
        runner = OnnxWhisper(directory / files["encoder"], directory / files["decoder"], config, threads)
        worst = 0.0
        for run in doc["parity"]["runs"]:
            key = run["key"]
            got = runner.teacher_forced_logits(arrays[f"{key}_mel"], arrays[f"{key}_tokens"].tolist())
            worst = max(worst, float(np.abs(got - arrays[f"{key}_logits"]).max()))
        recorded = float(variant["max_logit_diff"])
        ok = worst <= tolerance(recorded)
        progress(f"  {name}: max logit diff {worst:.3g} (recorded {recorded:.3g}) {'ok' if ok else 'FAILED'}")
        if not ok:
            problems.append(f"{directory / files['decoder']}: logits differ from PyTorch by {worst:.3g}, "
                            f"the manifest recorded {recorded:.3g} ({name})")
    return problems


def _vocoder(directory: Path, doc: dict[str, Any], threads: int, progress: Progress) -> list[str]:
    """Each variant's whole graph and windowed device path against PyTorch's waveforms."""
    from edge_agent.runtime.sessions import make_session
    from edge_agent.tts.melvocoder import MelVocoder
    from exporters.vocoder.pipeline import parity_diffs

    problems = []
    for name, variant in doc["variants"].items():
        if "error" in variant:
            continue
        files = variant["files"]
        vocoder = MelVocoder.load(directory, name, threads)
        try:
            diffs = parity_diffs(directory, doc["parity"], make_session(directory / files["whole"], threads),
                                 vocoder)
        finally:
            vocoder.close()
        for key, file in (("max_abs_diff", files["whole"]), ("window_diff", files["windowed"])):
            worst, recorded = diffs[key], float(variant[key])
            ok = worst <= tolerance(recorded)
            verdict = "ok" if ok else "FAILED"
            progress(f"  {file}: max waveform diff {worst:.3g} (recorded {recorded:.3g}) {verdict}")
            if not ok:
                problems.append(f"{directory / file}: waveform differs from PyTorch by {worst:.3g}, "
                                f"the manifest recorded {recorded:.3g} ({name})")
    return problems


def _quantized(directory: Path, name: str, record: dict[str, Any], threads: int,
               progress: Progress) -> list[str]:
    from exporters.compare import output_diff, run_feeds  # onnx: only the quantized check needs it

    fixture = record.get("fixture")
    if not fixture:
        progress(f"  {name}: no parity fixture recorded (hash only)")
        return []
    with np.load(directory / fixture) as data:
        arrays = {k: data[k] for k in data.files}
    count = int(arrays["count"])
    inputs = [n for n in record["inputs"]]
    feeds = [{n: arrays[f"in_{n}_{i}"] for n in inputs} for i in range(count)]
    expected = [arrays[f"ref_{i}"] for i in range(count)]
    got = run_feeds(make_session(directory / name, threads), feeds)
    diff = output_diff(expected, got)
    recorded = record.get("max_abs_diff")
    if recorded is None:
        ok = [list(g.shape) for g in got] == record["output_shapes"]
        detail = "output length differs from the source, as recorded" if ok else "output shapes changed"
    else:
        ok = diff is not None and diff <= tolerance(float(recorded))
        detail = f"max abs diff {diff if diff is None else f'{diff:.3g}'} (recorded {float(recorded):.3g})"
    progress(f"  {name}: {detail} {'ok' if ok else 'FAILED'}")
    return [] if ok else [f"{directory / name}: {detail}"]
