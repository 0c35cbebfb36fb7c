"""`edge-export vocoder`: a HiFi-GAN checkpoint -> PyTorch -> ONNX variants, measured, with a manifest.

Steps: resolve the source (catalog id or checkpoint file), load the generator into PyTorch,
compute the log-mel spectrograms of the test clips (real speech with known text), vocode
them with PyTorch (the reference), export the whole graph and its windowed form, derive
the requested variants, and measure each against PyTorch on the same mels: size, load time,
RTF of the windowed device path (`MelVocoder`) and of the whole graph, max waveform
difference, log-mel distance of the resynthesis, and the round trip — the vocoded clips
transcribed by our ASR, WER against the clips' text. The default variant is chosen by
measurement (FORMAT.md); everything goes to `manifest.json`.
"""

from __future__ import annotations

import logging
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clips import Clip
from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import resample
from edge_agent.errors import ModelError, UsageError
from edge_agent.runtime import make_session
from edge_agent.text.wer import UNIT as WER_UNIT
from edge_agent.text.wer import wer
from edge_agent.tts.melvocoder import FORMAT, MelVocoder
from exporters.manifest import (
    MANIFEST,
    exporter_info,
    file_entry,
    io_signature,
    one_line,
    read_manifest,
    staged,
    write_json_atomic,
)
from exporters.progress import Progress
from exporters.quantize import Mode, quantize
from exporters.vocoder.hifigan import Config, Source
from exporters.vocoder.mel import Mels, log_mel, mel_distance
from exporters.vocoder.onnx_export import INPUT, export_generator, export_windowed

log = logging.getLogger(__name__)

Transcribe = Callable[[Samples], str]
"""16 kHz audio -> text: the ASR the round trip goes through."""

FORMAT_VERSION = 1
VARIANTS = ("fp32", "fp16", "int8")
DEFAULT_VARIANTS = VARIANTS
MODES: dict[str, Mode] = {"fp16": "fp16", "int8": "int8-all"}
"""Quantization of each derived variant. HiFi-GAN has no MatMul: int8 can only mean its convolutions."""
MAX_WER_DRIFT = 0.01
"""A variant may be the default only if its round-trip WER is at most this much (a fraction of the
words) above the PyTorch vocoder's."""
ASR_RATE = 16000


@dataclass(frozen=True)
class ExportOptions:
    """Knobs of one export."""

    variants: tuple[str, ...] = DEFAULT_VARIANTS
    threads: int = 2
    """Workers of the windowed vocoder, intra-op threads of the whole graph and of PyTorch."""
    parity_clips: tuple[int, ...] = (0, 1)
    """Clips (by index) whose mels and PyTorch waveforms make the parity fixture."""
    load_repeats: int = 3
    timing_repeats: int = 2
    """Timed passes over the clips; the best time per clip counts."""


@dataclass
class _Reference:
    """The clips as the vocoder sees them, and what PyTorch made of them."""

    clips: list[Clip]
    mels: list[Mels]
    waves: list[Samples] = field(default_factory=list)
    transcripts: list[str] = field(default_factory=list)
    clip_transcripts: list[str] = field(default_factory=list)


def parse_variants(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise UsageError(f"--variants: unknown {', '.join(unknown) or 'empty list'} "
                         f"(choose from {', '.join(VARIANTS)})")
    return names


def revision() -> dict[str, str]:
    return exporter_info(Path(__file__).resolve().parent)


def up_to_date(out_dir: Path, source: Source, options: ExportOptions) -> bool:
    """True if `out_dir` holds this source's export, with these variants, by this exporter code."""
    try:
        doc = read_manifest(out_dir)
    except ModelError:
        return False
    return (doc.get("format") == FORMAT and doc.get("format_version") == FORMAT_VERSION
            and doc.get("source", {}).get("sha256") == source.sha256
            and doc.get("exporter", {}).get("revision") == revision()["revision"]
            and set(doc.get("variants", {})) == set(options.variants))


def export_vocoder(source: Source, out_dir: Path, clips: list[Clip], *, generator: Any, config: Config,
                   transcribe: Transcribe, asr: dict[str, Any], options: ExportOptions,
                   progress: Progress) -> dict[str, Any]:
    """Export `generator` (loaded from `source`), measure and write `out_dir`; returns the manifest.

    `asr` describes `transcribe`.
    """
    import torch

    torch.set_num_threads(options.threads)
    ref = _reference(generator, config, clips, transcribe, progress)
    with staged(out_dir) as stage:
        manifest = _export_into(stage, source, generator, config, ref, transcribe=transcribe, options=options,
                                progress=progress)
        manifest["asr"] = asr
        write_json_atomic(stage / MANIFEST, manifest)
    return manifest


def vocode_pytorch(generator: Any, mel: Mels) -> Samples:
    """PyTorch's waveform for `mel` [n_mels, frames] (the reference every variant is held to)."""
    import torch

    with torch.inference_mode():
        out: Samples = generator(torch.from_numpy(mel)[None]).numpy().reshape(-1)
    return out


def _reference(generator: Any, config: Config, clips: list[Clip], transcribe: Transcribe,
               progress: Progress) -> _Reference:
    """Mels of the clips, PyTorch's resynthesis, and what the ASR hears in both."""
    rate = config.mel.sample_rate
    mels = [log_mel(resample(c.audio(), ASR_RATE, rate), config.mel) for c in clips]
    ref = _Reference(clips, mels)
    with progress.step(f"ASR on the {len(clips)} original clips"):
        ref.clip_transcripts = [transcribe(c.audio()) for c in clips]
    with progress.step(f"PyTorch vocoder on {len(clips)} clips"):
        ref.waves = [vocode_pytorch(generator, m) for m in mels]
        ref.transcripts = [transcribe(resample(w, rate, ASR_RATE)) for w in ref.waves]
    truths = [c.text for c in clips]
    progress(f"ASR WER: original clips {_wer(truths, ref.clip_transcripts):.3f}, "
             f"PyTorch-vocoded {_wer(truths, ref.transcripts):.3f}")
    return ref


def _wer(references: list[str], hypotheses: list[str]) -> float:
    return round(wer(references, hypotheses), 4)


def _export_into(stage: Path, source: Source, generator: Any, config: Config, ref: _Reference, *,
                 transcribe: Transcribe, options: ExportOptions, progress: Progress) -> dict[str, Any]:
    parity = _parity_fixture(stage, ref, options)
    with progress.step("exporting the generator (torch.export-based exporter)"):
        opset = export_generator(generator, config.mel.n_mels, stage / "vocoder.fp32.onnx")
    with progress.step("deriving the windowed graph"):
        info = export_windowed(stage / "vocoder.fp32.onnx", stage / "vocoder.fp32.windowed.onnx")
    progress(f"  hop {info.hop}, context {info.context} frames, {len(info.cuts)} cuts")
    signature = {"whole": io_signature(stage / "vocoder.fp32.onnx"),
                 "windowed": io_signature(stage / "vocoder.fp32.windowed.onnx")}
    manifest: dict[str, Any] = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "exporter": {**revision(), "torch_exporter": "torch.export (dynamo=True)"},
        "source": source.describe(),
        "sample_rate": config.mel.sample_rate,
        "mel": config.mel.describe(),
        "opset": opset,
        "models": signature,
        "window": asdict(info),
    }
    manifest["window"]["cuts"] = [list(c) for c in info.cuts]
    variants, vocoders = _build_variants(stage, manifest, parity, options=options, progress=progress)
    with progress.step(f"timing {', '.join(vocoders)} and PyTorch side by side on {len(ref.clips)} clips"):
        timings = _time_side_by_side(stage, vocoders, variants, generator, ref, options=options)
    for vocoder in vocoders.values():
        vocoder.close()
    pytorch = timings.pop("pytorch")
    truths = [c.text for c in ref.clips]
    pytorch_wer = _wer(truths, ref.transcripts)
    for name, variant in variants.items():
        if name in timings:
            waves = timings[name].pop("waves")
            heard = [transcribe(resample(w, config.mel.sample_rate, ASR_RATE)) for w in waves]
            wer_truth = _wer(truths, heard)
            variant.update(timings[name], mel_distance=_mel_distance(waves, ref.mels, config),
                           wer_truth=wer_truth, wer=_wer(ref.transcripts, heard),
                           wer_drift=round(wer_truth - pytorch_wer, 4), transcripts=heard)
        _report(progress, name, variant)
    if "fp32" not in options.variants:
        for f in variants.pop("fp32")["files"].values():
            (stage / f).unlink()
    default = pick_default(variants)
    progress(f"default variant: {default} (fastest with round-trip WER drift <= +{MAX_WER_DRIFT})")
    import torch

    manifest |= {
        "variants": variants,
        "default_variant": default,
        "default_rule": f"lowest rtf among variants with wer_drift <= {MAX_WER_DRIFT}",
        "wer_unit": WER_UNIT,
        "reference": {
            "runtime": f"PyTorch {torch.__version__}", "threads": options.threads, "rtf": pytorch["rtf"],
            "mel_distance": _mel_distance(ref.waves, ref.mels, config), "wer_truth": pytorch_wer,
            "transcripts": ref.transcripts,
        },
        "clips": [
            {"name": c.name, "text": c.text, "engine": c.engine, "duration_s": round(c.duration_s, 3),
             "frames": int(m.shape[-1]), "asr_transcript": t}
            for c, m, t in zip(ref.clips, ref.mels, ref.clip_transcripts, strict=True)
        ],
        "clips_wer_truth": _wer(truths, ref.clip_transcripts),
        "parity": parity,
    }
    manifest["files"] = {p.name: file_entry(p) for p in sorted(stage.iterdir()) if p.name != MANIFEST}
    return manifest


def pick_default(variants: dict[str, dict[str, Any]]) -> str:
    """The fastest variant whose round-trip WER is at most MAX_WER_DRIFT above the PyTorch vocoder's."""
    usable = {n: v for n, v in variants.items() if "error" not in v and v["wer_drift"] <= MAX_WER_DRIFT}
    if not usable:
        raise ModelError(f"no variant keeps the round-trip WER within {MAX_WER_DRIFT} of PyTorch's: "
                         "see the measurements above")
    return min(usable, key=lambda n: usable[n]["rtf"])


def _parity_fixture(stage: Path, ref: _Reference, options: ExportOptions) -> dict[str, Any]:
    arrays: dict[str, Any] = {}
    runs = []
    picked = dict.fromkeys(i % len(ref.clips) for i in options.parity_clips)
    for n, index in enumerate(picked):
        key = f"run{n}"
        arrays[f"{key}_mel"], arrays[f"{key}_wave"] = ref.mels[index], ref.waves[index]
        runs.append({"key": key, "clip": ref.clips[index].name, "frames": int(ref.mels[index].shape[-1])})
    np.savez(stage / "parity.npz", **arrays)
    return {"file": "parity.npz", "runs": runs}


def parity_diffs(directory: Path, parity: dict[str, Any], whole: Any,
                 vocoder: MelVocoder) -> dict[str, float]:
    """Max |waveform - PyTorch's| of the whole graph and the windowed device path over the parity runs."""
    worst = {"max_abs_diff": 0.0, "window_diff": 0.0}
    with np.load(directory / parity["file"]) as data:
        for run in parity["runs"]:
            mel, expected = data[f"{run['key']}_mel"], data[f"{run['key']}_wave"]
            got = np.asarray(whole.run(None, {INPUT: mel[None]})[0]).reshape(-1)
            windowed = vocoder.synthesize(mel)
            worst["max_abs_diff"] = max(worst["max_abs_diff"], _diff(got, expected))
            worst["window_diff"] = max(worst["window_diff"], _diff(windowed, np.clip(expected, -1, 1)))
    return worst


def _diff(a: Samples, b: Samples) -> float:
    if a.shape != b.shape:
        raise ModelError(f"output of {a.shape[0]} samples, PyTorch gave {b.shape[0]}")
    return float(np.abs(a.astype(np.float64) - b).max())


def _build_variants(stage: Path, manifest: dict[str, Any], parity: dict[str, Any], *,
                    options: ExportOptions, progress: Progress,
                    ) -> tuple[dict[str, dict[str, Any]], dict[str, MelVocoder]]:
    """Derive each variant from fp32, load it and check its parity; a failing variant is recorded."""
    variants: dict[str, dict[str, Any]] = {}
    vocoders: dict[str, MelVocoder] = {}
    for name in ("fp32", *[v for v in options.variants if v != "fp32"]):
        files = {"whole": f"vocoder.{name}.onnx", "windowed": f"vocoder.{name}.windowed.onnx"}
        variants[name] = {"files": files, "mode": MODES.get(name, "export")}
        try:
            if name != "fp32":
                for form, filename in files.items():
                    with progress.step(f"{name}: {form} graph ({MODES[name]})"):
                        quantize(stage / f"vocoder.fp32{'.windowed' if form == 'windowed' else ''}.onnx",
                                 stage / filename, MODES[name], None)
            with progress.step(f"loading {name} and checking waveform parity"):
                vocoders[name], measured = _prepare(stage, name, files, manifest, parity=parity,
                                                    options=options)
            variants[name] |= measured
        except Exception as exc:  # a variant that fails is recorded, not fatal
            log.debug("variant %s failed:\n%s", name, traceback.format_exc())
            variants[name] |= {"files": {}, "error": one_line(exc)}
            for f in files.values():
                (stage / f).unlink(missing_ok=True)
            if name == "fp32":
                raise ModelError(f"fp32 export does not run: {one_line(exc)}") from exc
    return variants, vocoders


def _prepare(stage: Path, name: str, files: dict[str, str], manifest: dict[str, Any], *,
             parity: dict[str, Any], options: ExportOptions) -> tuple[MelVocoder, dict[str, Any]]:
    """Load a variant (timed: the device's windowed session), measure its parity, warm it up."""
    from edge_agent.tts.melvocoder import VocoderExport
    from edge_agent.tts.windowed import VocoderInfo

    export = VocoderExport(stage, manifest["sample_rate"], manifest["mel"],
                           VocoderInfo.from_json(manifest["window"]), {name: {"files": files}},
                           {f: file_entry(stage / f) for f in files.values()}, name)
    loads = []
    for _ in range(options.load_repeats):
        started = time.perf_counter()
        vocoder = MelVocoder.load_export(export, name, options.threads)
        loads.append(time.perf_counter() - started)
        if len(loads) < options.load_repeats:
            vocoder.close()
    whole = make_session(stage / files["whole"], options.threads)
    diffs = parity_diffs(stage, parity, whole, vocoder)
    return vocoder, {
        "size_bytes": (stage / files["windowed"]).stat().st_size,
        "whole_size_bytes": (stage / files["whole"]).stat().st_size,
        "load_s": round(statistics.median(loads), 4),
        **diffs,
        "threads": options.threads,
    }


def _time_side_by_side(stage: Path, vocoders: dict[str, MelVocoder], variants: dict[str, dict[str, Any]],
                       generator: Any, ref: _Reference, *, options: ExportOptions,
                       ) -> dict[str, dict[str, Any]]:
    """RTF of every variant (windowed and whole) and of PyTorch, interleaved clip by clip.

    The machine may be shared: interleaving spreads any slowdown over all contenders alike,
    and the best of `timing_repeats` runs per clip discards one-off stalls. PyTorch (slow) is
    timed in the first pass only. The windowed output is what the ASR hears.
    """
    vocoder = next(iter(vocoders.values()))
    audio_s = sum(m.shape[-1] for m in ref.mels) * vocoder.hop / vocoder.sample_rate
    wholes = {n: make_session(stage / variants[n]["files"]["whole"], options.threads) for n in vocoders}
    contenders: dict[str, Callable[[Mels], Samples]] = {"pytorch": lambda m: vocode_pytorch(generator, m)}
    for name, vocoder in vocoders.items():
        contenders[name] = vocoder.synthesize
        contenders[f"{name}:whole"] = _whole_runner(wholes[name])
    best = {n: [float("inf")] * len(ref.mels) for n in contenders}
    waves: dict[str, list[Samples]] = {n: [np.zeros(0, np.float32)] * len(ref.mels) for n in vocoders}
    for repeat in range(options.timing_repeats):
        for i, mel in enumerate(ref.mels):
            for name, run in contenders.items():
                if name == "pytorch" and repeat > 0:
                    continue
                started = time.perf_counter()
                out = run(mel)
                best[name][i] = min(best[name][i], time.perf_counter() - started)
                if name in waves:
                    waves[name][i] = out
    result: dict[str, dict[str, Any]] = {"pytorch": {"rtf": round(sum(best["pytorch"]) / audio_s, 4)}}
    for name in vocoders:
        result[name] = {"rtf": round(sum(best[name]) / audio_s, 4),
                        "rtf_whole": round(sum(best[f"{name}:whole"]) / audio_s, 4), "waves": waves[name]}
    return result


def _whole_runner(session: Any) -> Callable[[Mels], Samples]:
    def run(mel: Mels) -> Samples:
        out: Samples = np.asarray(session.run(None, {INPUT: mel[None]})[0]).reshape(-1)
        return out
    return run


def _mel_distance(waves: list[Samples], mels: list[Mels], config: Config) -> float:
    """Mean over the clips of the log-mel distance between the resynthesis and its input (nats)."""
    return round(statistics.fmean(mel_distance(log_mel(w, config.mel), m) for w, m in zip(waves, mels,
                                                                                          strict=True)), 4)


def _report(progress: Progress, name: str, v: dict[str, Any]) -> None:
    if "error" in v:
        progress(f"  {name}: FAILED: {v['error']}")
        return
    progress(f"  {name}: {v['size_bytes'] / 1e6:.1f} MB, load {v['load_s']:.2f} s, RTF {v['rtf']:.3f} "
             f"(whole graph {v['rtf_whole']:.3f}), max diff {v['max_abs_diff']:.2e} (windowed "
             f"{v['window_diff']:.2e}), mel distance {v['mel_distance']:.3f}, round-trip WER "
             f"{v['wer_truth']:.3f} (drift {v['wer_drift']:+.3f})")
