"""Measure a compressed ONNX model against its source on the same inputs, side by side.

Sample inputs come from `--inputs FILE.npz` (arrays named after the model's inputs) or are
made for the model families we know: a Piper voice (real phoneme ids for a fixed sentence,
sampling noise off so runs are comparable), Whisper's encoder and decoder, and models
whose inputs are all float. Anything else needs `--inputs`.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.errors import UsageError
from edge_agent.runtime.sessions import make_session
from edge_agent.tts.piper import PiperConfig
from exporters.quantize import Feed

PIPER_SENTENCE = ("The washing machine in the basement has finished its cycle, "
                  "and the clothes should be moved to the dryer.")


def load_inputs(path: Path, names: list[str]) -> list[Feed]:
    """Feeds from an .npz: arrays named after the inputs, or `<input>_<n>` for several feeds."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise UsageError(f"--inputs {path}: not a readable .npz ({exc})") from None
    if all(n in arrays for n in names):
        return [{n: arrays[n] for n in names}]
    feeds = []
    i = 0
    while all(f"{n}_{i}" in arrays for n in names):
        feeds.append({n: arrays[f"{n}_{i}"] for n in names})
        i += 1
    if not feeds:
        raise UsageError(f"--inputs {path}: needs arrays named {', '.join(names)}")
    return feeds


def sample_feeds(model_path: Path, session: Any) -> tuple[list[Feed], dict[str, Any]]:
    """Inputs for the known model families; raises UsageError naming what is missing."""
    inputs = {i.name: i for i in session.get_inputs()}
    names = set(inputs)
    rng = np.random.default_rng(0)
    if {"input", "input_lengths", "scales"} <= names:
        return _piper_feeds(model_path, "sid" in names)
    if names == {"mel"}:
        n_mels = inputs["mel"].shape[1]
        mel = np.clip(rng.normal(-0.2, 0.4, (1, n_mels, 3000)), -1.5, 1.5).astype(np.float32)
        return [{"mel": mel}], {"family": "whisper-encoder"}
    if {"tokens", "self_k_in", "cross_k", "offset"} <= names:
        layers, _, _, state = inputs["self_k_in"].shape
        vocab = session.get_outputs()[0].shape[2]
        cache = np.zeros((layers, 1, 0, state), dtype=np.float32)
        cross = rng.normal(0, 1, (layers, 1, 100, state)).astype(np.float32)
        tokens = rng.integers(0, vocab, (1, 4), dtype=np.int64)
        feed: Feed = {"tokens": tokens, "self_k_in": cache, "self_v_in": cache, "cross_k": cross,
                "cross_v": cross, "offset": np.array(0, dtype=np.int64)}
        return [feed], {"family": "whisper-decoder"}
    if all(i.type == "tensor(float)" for i in inputs.values()):
        feed = {n: rng.normal(0, 1, [d if isinstance(d, int) else 16 for d in i.shape]).astype(np.float32)
                for n, i in inputs.items()}
        return [feed], {"family": "generic-float"}
    others = ", ".join(f"{n} ({i.type})" for n, i in inputs.items() if i.type != "tensor(float)")
    raise UsageError(f"{model_path}: cannot make sample inputs for {others}; pass --inputs FILE.npz")


def _piper_feeds(model_path: Path, has_sid: bool) -> tuple[list[Feed], dict[str, Any]]:
    from piper_phonemize import phonemize_espeak


    config_path = model_path.with_name(model_path.name + ".json")
    if not config_path.is_file():
        raise UsageError(f"{model_path}: a Piper voice needs {config_path.name} beside it for sample inputs")
    config = PiperConfig.load(config_path)
    id_map = config.phoneme_id_map
    ids = list(id_map["^"])
    for sentence in phonemize_espeak(PIPER_SENTENCE, config.espeak_voice):
        for phoneme in sentence:
            if phoneme in id_map:
                ids += id_map[phoneme] + id_map["_"]
    ids += id_map["$"]
    feed: Feed = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        # No sampling noise: source and compressed model get comparable outputs.
        "scales": np.array([0.0, config.length_scale, 0.0], dtype=np.float32),
    }
    if has_sid:
        feed["sid"] = np.zeros(1, dtype=np.int64)
    return [feed], {"family": "piper", "sample_rate": config.sample_rate, "text": PIPER_SENTENCE}


def output_diff(ref: list[np.ndarray], got: list[np.ndarray]) -> float | None:
    """Max |difference| over the first output of every feed; None if any shape differs."""
    worst = 0.0
    for a, b in zip(ref, got, strict=True):
        if a.shape != b.shape:
            return None
        worst = max(worst, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()))
    return worst


def run_feeds(session: Any, feeds: list[Feed]) -> list[np.ndarray]:
    return [np.asarray(session.run(None, feed)[0]) for feed in feeds]


def compare(source: Path, target: Path, feeds: list[Feed], *, info: dict[str, Any], threads: int,
            repeats: int) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Load time, run time (median, interleaved), output difference; the same inputs for both.

    Returns the measurements and the source's outputs (kept as the parity fixture).
    """
    sessions, loads = {}, {}
    for key, path in (("source", source), ("target", target)):
        started = time.perf_counter()
        sessions[key] = make_session(path, threads)
        loads[key] = time.perf_counter() - started
    outputs = {k: run_feeds(s, feeds) for k, s in sessions.items()}  # also the warm-up
    times: dict[str, list[float]] = {"source": [], "target": []}
    for _ in range(repeats):
        for key, session in sessions.items():
            started = time.perf_counter()
            run_feeds(session, feeds)
            times[key].append(time.perf_counter() - started)
    run = {k: statistics.median(v) for k, v in times.items()}
    result: dict[str, Any] = {
        "size_bytes": target.stat().st_size, "source_size_bytes": source.stat().st_size,
        "load_s": round(loads["target"], 4), "source_load_s": round(loads["source"], 4),
        "run_s": round(run["target"], 5), "source_run_s": round(run["source"], 5),
        "speedup": round(run["source"] / run["target"], 3), "threads": threads, "repeats": repeats,
        "max_abs_diff": output_diff(outputs["source"], outputs["target"]),
        "output_shapes": [list(o.shape) for o in outputs["target"]],
        "source_output_shapes": [list(o.shape) for o in outputs["source"]],
        **info,
    }
    if "sample_rate" in info:
        audio_s = sum(o.size for o in outputs["source"]) / info["sample_rate"]
        result["audio_s"] = round(audio_s, 3)
        result["rtf"] = round(run["target"] / audio_s, 4)
        result["source_rtf"] = round(run["source"] / audio_s, 4)
    return result, outputs["source"]
