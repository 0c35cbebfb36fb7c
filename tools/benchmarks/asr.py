"""Speech recognition: RTF and WER of every exported variant vs faster-whisper int8 and PyTorch Whisper.

All engines transcribe the same synthesized smart-speaker commands (espeak-ng and
our Piper voice, 1-4 s each) with the same thread count, without timestamps,
greedy unless `asr.beam_size` asks ours and faster-whisper for a beam. `ratio` =
our default variant's time / faster-whisper int8's time on the same CTranslate2
weights; `torch_ratio` = ours / openai-whisper fp32 (the exporter's PyTorch
reference). The references pad every input to 30 s, as Whisper
does (their real behaviour); ours uses `asr.padding`. `goals` says which of the
issue's targets this run meets (GOALS); the ratio goal counts only at a WER no
worse than faster-whisper's. Both references come with the `dev`/`export`
extras and are skipped where they are not installed. Also measured: the WER of our
default variant when every input is padded to 30 s as Whisper does (the cost of
the bucket padding), end-of-speech -> transcript latency through the VAD and the
listener, webrtcvad vs Silero on the same audio, and the peak RSS of a process with
VAD + ASR + the local voice loaded. `--real DIR` decodes recordings of real people instead and
scores the retry rules on them (`benchmarks.asrreal`).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import asrreal
from benchmarks.clips import COMMANDS, ENGINES, Clip, clip_settings, clips_dir, make_clips, sweep_set
from benchmarks.report import emit, machine, median, percentile
from edge_agent.asr.manifest import load_manifest
from edge_agent.asr.transcriber import Transcriber
from edge_agent.asr.whisper import Padding, WhisperOnnx, resolve_export_dir
from edge_agent.audio.frames import Samples
from edge_agent.commands.context import Context
from edge_agent.errors import ModelError, UsageError
from edge_agent.listen import Heard, HearingModels, hearing_loop
from edge_agent.listen.microphone import Microphone
from edge_agent.text.wer import wer
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.vad import SILERO_MODEL, Segmenter, SileroClassifier, WebRtcClassifier, make_segmenter
from edge_agent.vad.classifiers import FrameClassifier

log = logging.getLogger(__name__)

Transcribe = Callable[[Samples], str]

GOALS = {"ratio": 0.8, "torch_ratio": 0.4, "peak_rss_mb": 300.0}
"""Targets: ours / faster-whisper int8 (at equal or better WER), ours / PyTorch, MB with VAD + ASR + voice."""
REFERENCE_PADDING = "30 s (Whisper's own padding)"
REFERENCE_GROUP = "edge_speech.asr_references"
"""Entry point group of reference engines: name -> `(CTranslate2 dir, threads) -> transcribe`."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per clip and engine (median)")
    parser.add_argument("--clips", type=int, default=len(COMMANDS), help="commands per voice (at most 12)")
    parser.add_argument("--voices", default=",".join(ENGINES), help="clip voices: espeak,piper")
    parser.add_argument("--variants", default="", help="exported variants to run (default: all)")
    parser.add_argument("--no-reference", action="store_true", help="skip faster-whisper and PyTorch")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocess")
    parser.add_argument("--sweep", action="store_true",
                        help="the exporter's 176-clip sweep (several voices, speeds, a noisy room) "
                             "instead of --clips/--voices: enough words that one cannot rank two engines")
    parser.add_argument("--real", default=None, metavar="DIR",
                        help="recordings of real people instead (FLAC/WAV named by what is said, or with "
                             "a references.json): each decoded in its bucket window and in 30 s, and "
                             "every retry rule scored on them (benchmarks.asrreal)")
    parser.add_argument("--split", choices=("all", "tune", "held-out"), default="all",
                        help="with --real: the recordings to decode (held-out: a fixed quarter by name)")
    parser.add_argument("--limit", type=int, default=None, help="with --real: at most this many recordings")


def measure(engines: dict[str, Transcribe], clips: list[Clip], audio: list[Samples],
            repeats: int) -> dict[str, dict[str, Any]]:
    """Time and score every engine on every clip, interleaved so that load drift hits all alike.

    Each engine runs once on the first clip to warm up; then, clip by clip and repeat
    by repeat, every engine in turn. A clip's time is the median of its repeats.
    """
    for fn in engines.values():
        fn(audio[0])
    times: dict[str, list[list[float]]] = {name: [[] for _ in audio] for name in engines}
    texts: dict[str, list[str]] = {name: ["" for _ in audio] for name in engines}
    for i, samples in enumerate(audio):
        for _ in range(max(1, repeats)):
            for name, fn in engines.items():
                started = time.perf_counter()
                texts[name][i] = fn(samples)
                times[name][i].append(time.perf_counter() - started)
    audio_s = sum(len(a) for a in audio) / 16000
    results = {}
    keys = [f"{c.engine}:{c.text}" for c in clips]
    for name in engines:
        seconds = [median(t) for t in times[name]]
        total = sum(seconds)
        results[name] = {"engine": name, "total_s": total, "rtf": total / audio_s,
                         "median_clip_s": median(seconds), "wer": wer([c.text for c in clips], texts[name]),
                         "texts": dict(zip(keys, texts[name], strict=True))}
        log.info("%s: %.3f s total, RTF %.3f, WER %.3f", name, total, results[name]["rtf"],
                 results[name]["wer"])
    return results


class _Ours:
    """Our runtime as a `Transcribe`, keeping each call's time per stage and decoder steps."""

    def __init__(self, model: WhisperOnnx, padding: Padding, max_tokens: int, beam_size: int = 1) -> None:
        self.model, self.padding, self.max_tokens, self.beam_size = model, padding, max_tokens, beam_size
        self.calls: list[tuple[float, float, float, int]] = []

    def __call__(self, audio: Samples) -> str:
        result = self.model.recognize(audio, self.padding, max_tokens=self.max_tokens,
                                      beam_size=self.beam_size)
        t = result.timings
        self.calls.append((t.features, t.encoder, t.decoder, len(result.tokens) + 1))
        return result.text

    def report(self, repeats: int) -> dict[str, float]:
        """Seconds per stage over the clips (each clip's median repeat, as `measure` times them)."""
        runs = np.array(self.calls[1:], dtype=np.float64)  # the first call is `measure`'s warm-up
        per_clip = np.median(runs.reshape(-1, max(1, repeats), 4), axis=1)
        features, encoder, decoder, steps = per_clip.sum(axis=0)
        return {"features": float(features), "encoder": float(encoder), "decoder": float(decoder),
                "ms_per_decoder_step": 1000 * float(decoder) / max(1.0, float(steps))}


def _source_dir(ctx: Context, manifest_source: Any) -> Path | None:
    """The CTranslate2 directory the export was made from (for faster-whisper and PyTorch)."""
    ids = []
    if isinstance(manifest_source, dict):
        ids += [str(manifest_source.get(k)) for k in ("id", "model", "catalog_id") if manifest_source.get(k)]
        if manifest_source.get("path"):
            path = Path(str(manifest_source["path"]))
            if (path / "model.bin").is_file():
                return path
    elif isinstance(manifest_source, str):
        ids.append(manifest_source)
    ids.append(ctx.settings.asr.model)
    for model_id in ids:
        try:
            found = ctx.store.locate(model_id)
        except ModelError:
            continue
        if found is not None and "model.bin" in found.paths:
            return found.paths["model.bin"].parent
    return None


def _faster_whisper(ct2_dir: Path, threads: int, beam_size: int = 1) -> Transcribe | None:
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        return None
    model = WhisperModel(str(ct2_dir), device="cpu", compute_type="int8", cpu_threads=threads)

    def run(audio: Samples) -> str:
        segments, _ = model.transcribe(audio, language="en", beam_size=beam_size, best_of=1, temperature=0.0,
                                       without_timestamps=True, condition_on_previous_text=False,
                                       vad_filter=False)
        return " ".join(s.text.strip() for s in segments).strip()

    return run


def references(entries: Iterable[EntryPoint] | None = None, beam_size: int = 1,
               ) -> dict[str, Callable[[Path, int], Transcribe | None]]:
    """Reference engines by name: faster-whisper, and those other packages offer (REFERENCE_GROUP).

    faster-whisper decodes with our `beam_size` (`asr.beam_size`); the others greedily.

    The PyTorch reference lives with the exporter, which the runtime must not import: it
    comes in through the entry point group, and is absent where the `export` extra is not
    installed (loading it fails for want of torch).
    """
    found: dict[str, Callable[[Path, int], Transcribe | None]] = {
        "faster-whisper-int8": functools.partial(_faster_whisper, beam_size=beam_size)}
    for entry in entry_points(group=REFERENCE_GROUP) if entries is None else entries:
        try:
            found[entry.name] = entry.load()
        except ImportError as exc:
            log.info("ASR reference %s is not available here: %s", entry.name, exc)
    return found


def latency(model: WhisperOnnx, ctx: Context, audio: list[Samples]) -> dict[str, Any]:
    """End of speech -> transcript through VAD + listener, for input arriving in real time.

    Each clip is framed by silence and streamed through the configured VAD; the
    latency is the hangover the VAD waits (stream time) plus the measured ASR time.
    """
    settings = ctx.settings
    values, asr = [], []
    for samples in audio:
        x = np.concatenate([np.zeros(8000, np.float32), samples, np.zeros(24000, np.float32)])
        source = _ArraySource(x)
        models = HearingModels(make_segmenter(settings.vad, ctx.store), Transcriber(model, settings.asr))
        listener = hearing_loop("always", settings.listen, models, Microphone(source, source))
        for t in (e.transcript for e in listener if isinstance(e, Heard)):
            values.append(t.latency_s)
            asr.append(t.asr_s)
    return {"engine": settings.vad.engine, "hangover_s": settings.vad.hangover_ms / 1000,
            "median_s": median(values), "p90_s": percentile(values, 90), "asr_median_s": median(asr),
            "utterances": len(values), "clips": len(audio)}


class _ArraySource:
    """A finished recording as an `AudioSource`, in 100 ms blocks."""

    live = False
    sample_rate = 16000

    def __init__(self, samples: Samples) -> None:
        self._samples = samples

    def blocks(self) -> Any:
        for i in range(0, len(self._samples), 1600):
            yield self._samples[i:i + 1600]

    def close(self) -> None:
        pass


def vad_compare(ctx: Context, audio: list[Samples]) -> dict[str, Any]:
    """webrtcvad and Silero on the same stream: commands separated by 1.5 s, then 5 s of noise."""
    rng = np.random.default_rng(0)
    gap = np.zeros(24000, np.float32)
    speech = np.concatenate([p for a in audio for p in (gap, a)] + [gap])
    noisy = rng.normal(0, 0.05, 5 * 16000).astype(np.float32)
    settings = ctx.settings.vad
    engines: dict[str, Callable[[], FrameClassifier]] = {
        "webrtc": lambda: WebRtcClassifier(settings.aggressiveness, settings.frame_ms)}
    silero = ctx.store.locate(SILERO_MODEL)
    if silero is not None:
        engines["silero"] = lambda: SileroClassifier.load(silero.path("silero_vad.onnx"),
                                                          settings.silero_threshold)
    out: dict[str, Any] = {"expected_utterances": len(audio), "speech_s": len(speech) / 16000}
    for name, make in engines.items():
        seg = Segmenter(make(), settings)
        started = time.perf_counter()
        found = seg.push(speech) + seg.flush()
        spent = time.perf_counter() - started
        noise_seg = Segmenter(make(), settings)
        false_alarms = noise_seg.push(noisy) + noise_seg.flush()
        out[name] = {"utterances": len(found), "us_per_frame": 1e6 * spent / max(1, seg.stats.frames),
                     "frame_ms": seg.frame_ms, "noise_utterances": len(false_alarms),
                     "noise_speech_fraction": noise_seg.stats.speech_frames / max(1, noise_seg.stats.frames)}
    if silero is None:
        out["silero"] = None
    return out


def peak_rss(args: argparse.Namespace, clip: Path) -> dict[str, Any] | None:
    cmd = [sys.executable, "-m", "benchmarks.rss", str(clip)]
    if args.config:
        cmd += ["--config", args.config]
    for item in args.overrides:
        cmd += ["--set", item]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        log.warning("peak RSS run failed: %s", (result.stderr.strip().splitlines() or ["?"])[-1])
        return None
    doc: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return doc


def _clips(ctx: Context, args: argparse.Namespace) -> list[Clip]:
    if args.sweep:
        return sweep_set(ctx.store)
    voices = [v for v in args.voices.split(",") if v]
    count = max(1, min(args.clips, len(COMMANDS)))
    voice = None
    if "piper" in voices:
        voice = VoiceRegistry(ctx.store, clip_settings(ctx.settings.tts)).get(ctx.settings.tts.voice)
    return make_clips(clips_dir(ctx.settings.models.cache_dir), COMMANDS[:count], voices, voice)


def run(ctx: Context, args: argparse.Namespace) -> int:
    if args.real is not None:
        return asrreal.run(ctx, args)
    settings = ctx.settings
    asr = settings.asr
    export_dir = resolve_export_dir(asr, settings.models)
    manifest = load_manifest(export_dir)
    wanted = [v for v in args.variants.split(",") if v] or list(manifest.variants)
    unknown = [v for v in wanted if v not in manifest.variants]
    if unknown:
        have = ", ".join(manifest.variants)
        raise UsageError(f"--variants: {', '.join(unknown)} not exported (have {have})")
    default = asr.variant or manifest.default_variant
    clips = _clips(ctx, args)
    audio = [c.audio() for c in clips]
    padding = Padding.from_settings(asr)
    engines: dict[str, Transcribe] = {}
    ours_engines: dict[str, _Ours] = {}
    sizes: dict[str, float] = {}
    default_model: WhisperOnnx | None = None
    for variant in wanted:
        model = WhisperOnnx.load(export_dir, variant, asr.threads, decoder_threads=asr.decoder_threads)
        ours_engines[variant] = _Ours(model, padding, asr.max_tokens, asr.beam_size)
        engines[f"ours-{variant}"] = ours_engines[variant]
        files = manifest.variants[variant]
        sizes[variant] = sum((export_dir / f).stat().st_size for f in (files.encoder, files.decoder)) / 1e6
        if variant == default:
            default_model = model
            engines[f"ours-{variant}-full30s"] = _Ours(model, Padding("full"), asr.max_tokens,
                                                               asr.beam_size)
    ct2_dir = None if args.no_reference else _source_dir(ctx, manifest.source)
    if ct2_dir is not None:
        for name, make in references(beam_size=asr.beam_size).items():
            fn = make(ct2_dir, asr.threads)
            if fn is not None:
                engines[name] = fn
    results = measure(engines, clips, audio, args.repeats)
    for variant, size in sizes.items():
        results[f"ours-{variant}"]["size_mb"] = size
        results[f"ours-{variant}"]["stages_s"] = ours_engines[variant].report(args.repeats)
    ours = results.get(f"ours-{default}")
    fw, pt = results.get("faster-whisper-int8"), results.get("torch-fp32")
    summary: dict[str, Any] = {
        "model": asr.model, "default_variant": default, "threads": asr.threads,
        "padding": {"policy": padding.policy, "bucket_s": padding.bucket_s, "margin_s": padding.margin_s},
        "reference_padding": REFERENCE_PADDING, "decoder_threads": asr.decoder_threads,
        "clips": len(clips), "audio_s": sum(len(a) for a in audio) / 16000, "repeats": args.repeats,
        "engines": {k: {x: y for x, y in v.items() if x != "texts"} for k, v in results.items()},
        "ratio": ours["total_s"] / fw["total_s"] if ours and fw else None,
        "torch_ratio": ours["total_s"] / pt["total_s"] if ours and pt else None,
        "wer_drift_vs_full30s": (ours["wer"] - results[f"ours-{default}-full30s"]["wer"]) if ours else None,
        "per_variant": {v: _versus(results[f"ours-{v}"], fw, pt) for v in wanted},
        "machine": machine(),
    }
    if default_model is not None:
        summary["latency"] = latency(default_model, ctx, audio)
    summary["vad"] = vad_compare(ctx, audio)
    summary["rss"] = None if args.no_rss else peak_rss(args, clips[0].path)
    summary["peak_rss_mb"] = summary["rss"]["peak_rss_mb"] if summary["rss"] else None
    summary["goals"] = goals(summary)
    emit(summary, _lines(summary, results), args.json)
    return 0


def _versus(ours: dict[str, Any], fw: dict[str, Any] | None, pt: dict[str, Any] | None) -> dict[str, Any]:
    """One variant against the references: time ratios, and whether its WER is at least as good."""
    return {
        "ratio": ours["total_s"] / fw["total_s"] if fw else None,
        "torch_ratio": ours["total_s"] / pt["total_s"] if pt else None,
        "wer": ours["wer"],
        "wer_le_faster_whisper": ours["wer"] <= fw["wer"] if fw else None,
    }


def goals(summary: dict[str, Any]) -> dict[str, Any]:
    """Each target of GOALS with the measured value and whether it is met (None: not measured)."""
    default = summary["per_variant"].get(summary["default_variant"], {})
    wer_ok = default.get("wer_le_faster_whisper")
    out: dict[str, Any] = {}
    for key, target in GOALS.items():
        value = summary.get(key)
        met = None if value is None else value <= target
        out[key] = {"value": value, "target": target, "met": met}
    out["ratio"]["wer_le_faster_whisper"] = wer_ok
    if out["ratio"]["met"] is not None:
        out["ratio"]["met"] = bool(out["ratio"]["met"] and wer_ok)
    return out


def _lines(summary: dict[str, Any], results: dict[str, Any]) -> list[str]:
    pad = summary["padding"]
    ours_pad = (f"bucket (speech + {pad['margin_s']:g} s, rounded up to {pad['bucket_s']:g} s)"
                if pad["policy"] == "bucket" else "30 s")
    lines = [f"{summary['clips']} clips, {summary['audio_s']:.1f} s of speech, {summary['threads']} threads "
             f"(decoder {summary['decoder_threads']}); padding: ours {ours_pad}, "
             f"references {summary['reference_padding']}"]
    for name, r in results.items():
        lines.append(f"  {name:<24} total {r['total_s']:7.3f} s  RTF {r['rtf']:.3f}  "
                     f"median/clip {r['median_clip_s'] * 1000:6.1f} ms  WER {r['wer']:.3f}")
        st = r.get("stages_s")
        if st:
            lines.append(f"  {'':<24} features {st['features']:.3f} s, encoder {st['encoder']:.3f} s, "
                         f"decoder {st['decoder']:.3f} s ({st['ms_per_decoder_step']:.2f} ms/step)")
    if summary["ratio"] is not None:
        lines.append(f"ratio (ours {summary['default_variant']} / faster-whisper int8): "
                     f"{summary['ratio']:.3f}")
    if summary["torch_ratio"] is not None:
        lines.append(f"torch_ratio (ours / PyTorch fp32): {summary['torch_ratio']:.3f}")
    for variant, v in summary["per_variant"].items():
        if v["ratio"] is not None:
            same = "WER <= faster-whisper" if v["wer_le_faster_whisper"] else "WER above faster-whisper"
            lines.append(f"  {variant:<12} ratio {v['ratio']:.3f}  ({same})")
    if summary["wer_drift_vs_full30s"] is not None:
        lines.append(f"WER drift, bucket padding vs 30 s: {summary['wer_drift_vs_full30s']:+.3f}")
    lat = summary.get("latency")
    if lat:
        lines.append(f"end of speech -> transcript: median {lat['median_s']:.3f} s, p90 {lat['p90_s']:.3f} s "
                     f"(hangover {lat['hangover_s']:.2f} s + ASR {lat['asr_median_s']:.3f} s)")
    for name in ("webrtc", "silero"):
        v = summary["vad"].get(name)
        if v:
            expected = summary["vad"]["expected_utterances"]
            lines.append(f"vad {name:<7} {v['utterances']}/{expected} utterances, "
                         f"{v['us_per_frame']:.1f} us/frame, {v['noise_utterances']} on 5 s of noise")
    if summary["peak_rss_mb"] is not None:
        lines.append(f"peak RSS with VAD + ASR + voice: {summary['peak_rss_mb']:.0f} MB")
    lines.extend(_goal_lines(summary))
    return lines


def _goal_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    for key, g in summary["goals"].items():
        if g["value"] is None:
            lines.append(f"goal {key} <= {g['target']:g}: not measured")
            continue
        verdict = "met" if g["met"] else "NOT met"
        extra = ""
        if key == "ratio":
            wer_ok = g["wer_le_faster_whisper"]
            extra = (f" (default variant {summary['default_variant']}: WER "
                     f"{'<=' if wer_ok else 'above'} faster-whisper's)")
        lines.append(f"goal {key} <= {g['target']:g}: {g['value']:.3f} {verdict}{extra}")
    return lines
