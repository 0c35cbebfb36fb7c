"""`edge-export vocoder`: a HiFi-GAN checkpoint -> PyTorch -> ONNX variants, measured, with a manifest.

Steps: resolve the source (catalog id or checkpoint file), load the generator into PyTorch,
compute the log-mel spectrograms of the test clips (real speech with known text), vocode
them with PyTorch (the reference), export the whole graph and its windowed form, derive
the requested variants, and measure each against PyTorch on the same mels: size, load time,
RTF of the windowed device path (`MelVocoder`) and of the whole graph, max waveform
difference, log-mel distance of the resynthesis, and the round trip — the vocoded clips
transcribed by our ASR, WER against the clips' text. The default variant is chosen by
measurement (FORMAT.md); everything goes to `manifest.json`. The steps every exported model
shares are `exporters.pipeline`'s; this module is the vocoder's own part.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clips import Clip
from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import resample
from edge_agent.errors import ModelError
from edge_agent.runtime.sessions import make_session
from edge_agent.text.wer import wer
from edge_agent.tts.melvocoder import FORMAT, MelVocoder
from exporters.manifest import MANIFEST, file_entry, io_signature, staged, write_json_atomic
from exporters.pipeline import Kind, build_variants, files_of, time_side_by_side
from exporters.progress import Progress
from exporters.quantize import Mode, quantize
from exporters.vocoder.hifigan import Config, Source
from exporters.vocoder.mel import Mels, log_mel, mel_distance
from exporters.vocoder.onnx_export import INPUT, export_generator, export_windowed

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


def _details(v: dict[str, Any]) -> str:
    return (f" (whole graph {v['rtf_whole']:.3f}), max diff {v['max_abs_diff']:.2e} (windowed "
            f"{v['window_diff']:.2e}), mel distance {v['mel_distance']:.3f}")


KIND = Kind(FORMAT, FORMAT_VERSION, VARIANTS, Path(__file__).resolve().parent, MAX_WER_DRIFT,
            "round-trip WER", _details)


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


parse_variants = KIND.parse_variants


def up_to_date(out_dir: Path, source: Source, options: ExportOptions) -> bool:
    """True if `out_dir` holds this source's export, with these variants, by this exporter code."""
    return KIND.up_to_date(out_dir, source.sha256, options.variants)


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
        **KIND.head(source.describe(), torch_exporter="torch.export (dynamo=True)"),
        "sample_rate": config.mel.sample_rate,
        "mel": config.mel.describe(),
        "opset": opset,
        "models": signature,
        "window": asdict(info),
    }
    manifest["window"]["cuts"] = [list(c) for c in info.cuts]
    variants, vocoders = build_variants(
        stage, options.variants, files=lambda name: {"whole": f"vocoder.{name}.onnx",
                                                     "windowed": f"vocoder.{name}.windowed.onnx"},
        mode=lambda name: MODES.get(name, "export"), checking="waveform", progress=progress,
        derive=lambda name, files: _derive(stage, name, files, progress),
        prepare=lambda name, files: _prepare(stage, name, files, manifest, parity=parity, options=options))
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
    import torch

    manifest |= {
        **KIND.choose(stage, variants, options.variants, progress),
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
    manifest["files"] = files_of(stage)
    return manifest


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


def _derive(stage: Path, name: str, files: dict[str, str], progress: Progress) -> None:
    """Both forms of variant `name`, quantized from fp32's."""
    for form, filename in files.items():
        with progress.step(f"{name}: {form} graph ({MODES[name]})"):
            quantize(stage / f"vocoder.fp32{'.windowed' if form == 'windowed' else ''}.onnx",
                     stage / filename, MODES[name], None)


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
    """RTF of every variant (windowed and whole) and of PyTorch, clip by clip; the windowed
    output is what the ASR hears."""
    vocoder = next(iter(vocoders.values()))
    audio_s = sum(m.shape[-1] for m in ref.mels) * vocoder.hop / vocoder.sample_rate
    wholes = {n: make_session(stage / variants[n]["files"]["whole"], options.threads) for n in vocoders}
    contenders: dict[str, Callable[[Mels], Samples]] = {"pytorch": lambda m: vocode_pytorch(generator, m)}
    for name, vocoder in vocoders.items():
        contenders[name] = vocoder.synthesize
        contenders[f"{name}:whole"] = _whole_runner(wholes[name])
    best, waves = time_side_by_side(contenders, ref.mels, options.timing_repeats)
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

