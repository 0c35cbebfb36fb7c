"""`edge-export whisper`: real weights -> PyTorch -> ONNX variants, measured, with a manifest.

Steps: resolve the source (catalog id, CTranslate2 directory or `.pt` checkpoint), load it
into openai-whisper's PyTorch module and check it transcribes the test clips, export the
fp32 encoder and decoder, derive the requested variants, measure each against PyTorch on
the same clips (size, load time, RTF, max logit difference, WER), pick the default variant
by measurement and write everything to `manifest.json` (FORMAT.md). The steps every exported
model shares are `exporters.pipeline`'s; this module is Whisper's own part.

The export is built in a staging directory beside the target and renamed into place, so
an interrupted run never leaves a half-written model directory.

torch, onnxruntime and the modules built on torch (`reference`, `onnx_export`,
`tokenizer_json`) are imported inside the steps that use them, so `edge-export --help`,
planning and an up-to-date check never load torch.
"""

from __future__ import annotations

import math
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clips import Clip
from edge_agent.errors import ModelError, UsageError
from edge_agent.models import ModelStore
from edge_agent.models.store import sha256_file
from edge_agent.text.wer import wer
from exporters.manifest import MANIFEST, check_target, io_signature, staged, write_json_atomic
from exporters.pipeline import Kind, build_variants, files_of, time_side_by_side
from exporters.progress import Progress
from exporters.quantize import Feed, Mode, quantize
from exporters.whisper.runner import DecodeConfig, OnnxWhisper

FORMAT = "edge-speech/whisper-onnx"
FORMAT_VERSION = 1
VARIANTS = ("fp32", "int8", "fp16", "int8-static", "int4")
DEFAULT_VARIANTS = ("fp32", "int8", "fp16", "int4")
MODES: dict[str, dict[str, Mode]] = {
    "int8": {"encoder": "int8-matmul", "decoder": "int8-matmul"},
    "fp16": {"encoder": "fp16", "decoder": "fp16"},
    "int8-static": {"encoder": "int8-static", "decoder": "int8-static"},
    # 4-bit blocks only in the decoder, whose per-token cost is reading its weights (the
    # 51k-word projection above all); the encoder is compute-bound, and 4-bit blocks there
    # measured slower and less accurate than per-channel int8 on tiny.en.
    "int4": {"encoder": "int8-matmul", "decoder": "int4-block"},
}
"""Quantization mode of each part, per derived variant."""
MAX_WER_DRIFT = 0.01
"""A variant may be the default only if its WER against the known text is, with 95 % confidence,
at most this much above PyTorch's (`wer_drift_bound`; a fraction like every WER here: 0.01 is one
percentage point)."""
CONFIDENCE_Z = 1.645
"""One-sided 95 % normal quantile: `wer_drift_bound` is the drift plus this many standard errors."""
WER_DIGITS = 4
"""WERs are recorded rounded to this many decimals (0.0001: a hundredth of a point)."""
PARITY_MAX_TOKENS = 48
"""Tokens per parity run: enough to cover a sentence, bounded when unpadded input makes Whisper loop."""


def _details(v: dict[str, Any]) -> str:
    return (f", max logit diff {v['max_logit_diff']:.2e}, WER vs PyTorch {v['wer']:.3f}, "
            f"sweep WER {v['sweep']['wer']:.3f} ({v['sweep']['clips_differing']} clips differ)")


KIND = Kind(FORMAT, FORMAT_VERSION, VARIANTS, Path(__file__).resolve().parent, MAX_WER_DRIFT,
            "WER against the text", _details, drift_key="wer_drift_bound")


@dataclass(frozen=True)
class Source:
    """Where the weights come from."""

    kind: str
    """`catalog`, `ct2` (a CTranslate2 directory) or `pt` (an openai-whisper checkpoint)."""
    ref: str
    """The catalog id or the path as given."""
    path: Path
    """The CTranslate2 directory or the `.pt` file."""
    sha256: str
    """Of `model.bin` or of the `.pt` file."""

    @property
    def name(self) -> str:
        """Directory name for the default export location."""
        if self.kind == "catalog":
            return self.ref
        stem = self.path.name if self.kind == "ct2" else self.path.stem
        return f"{stem}-{self.sha256[:12]}"

    def describe(self) -> dict[str, Any]:
        key = "id" if self.kind == "catalog" else "path"
        value = self.ref if self.kind == "catalog" else str(self.path.resolve())
        return {"kind": self.kind, key: value, "sha256": self.sha256}


def resolve_source(arg: str, store: ModelStore, progress: Progress) -> Source:
    """A catalog id (fetched through the store), a CTranslate2 directory or a `.pt` file."""
    if arg in store.catalog.entries:
        entry = store.catalog.get(arg)
        if entry.task != "asr-source" or entry.runtime != "ctranslate2":
            raise UsageError(f"{arg!r} is a {entry.task} model, not a Whisper source "
                             f"(Whisper sources: {', '.join(whisper_ids(store))})")
        files = store.fetch(arg, progress=progress)
        return Source("catalog", arg, files.path("model.bin").parent, entry.file("model.bin").sha256)
    path = Path(arg).expanduser()
    if path.is_dir():
        if not (path / "model.bin").is_file():
            raise ModelError(f"{path}: not a CTranslate2 Whisper directory (no model.bin)")
        return Source("ct2", arg, path, sha256_file(path / "model.bin"))
    if path.is_file():
        return Source("pt", arg, path, sha256_file(path))
    if "/" in arg or arg.endswith((".pt", ".bin")) or path.suffix:
        raise ModelError(f"{arg}: no such file or directory")
    raise ModelError(f"unknown source {arg!r}: not a catalog id ({', '.join(whisper_ids(store))}) "
                     "nor an existing path")


def whisper_ids(store: ModelStore) -> list[str]:
    return [e.id for e in store.catalog if e.task == "asr-source" and e.runtime == "ctranslate2"]


@dataclass(frozen=True)
class ExportOptions:
    """Knobs of one export."""

    variants: tuple[str, ...] = DEFAULT_VARIANTS
    threads: int = 2
    """onnxruntime intra-op threads while measuring."""
    trim_pad_s: float = 4.0
    """Silence after each clip when measuring the unpadded ("trimmed") encoder input."""
    max_source_wer: float | None = 0.25
    """Refuse to export when PyTorch's WER on the clips against their text is above this; None skips."""
    max_tokens: int | None = None
    """Cap on decoded tokens per clip (default: Whisper's n_text_ctx // 2)."""
    parity_clips: tuple[int, ...] = (0, 2, -1)
    """Clips (by index) for the logit parity runs: the first padded to 30 s, the others unpadded."""
    load_repeats: int = 3
    timing_repeats: int = 2
    """Timed passes over the clips; the best time per clip counts."""


@dataclass
class _Context:
    """Everything the measuring steps share."""

    clips: list[Clip]
    mels: list[np.ndarray]
    trimmed: list[np.ndarray]
    ref_texts: list[str]
    parity: list[dict[str, Any]]
    parity_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    choice: list[Clip] = field(default_factory=list)
    """The clips the default variant is chosen on (the sweep; `clips` where none is given)."""


parse_variants = KIND.parse_variants


def up_to_date(out_dir: Path, source: Source, options: ExportOptions) -> bool:
    """True if `out_dir` holds this source's export, with these variants, by this exporter code."""
    return KIND.up_to_date(out_dir, source.sha256, options.variants)


def export_whisper(source: Source, out_dir: Path, clips: list[Clip], options: ExportOptions,
                   progress: Progress, *, choice: list[Clip] | None = None) -> dict[str, Any]:
    """Export, measure and write `out_dir`; returns the manifest.

    `clips` are timed and checked for parity (`EXPORT_SET`); `choice` (default: `clips`) is
    what the default variant is chosen on: the sweep (`benchmarks.clips.sweep_set`, 176 clips),
    large enough that one word does not decide it.
    """
    import torch

    from exporters.whisper import reference as ref_mod

    check_target(out_dir)
    with progress.step(f"loading {source.ref} into PyTorch"):
        model = ref_mod.load_model(source.path)
    torch.set_num_threads(options.threads)
    ref = ref_mod.Reference(model, options.max_tokens)
    ctx = _reference_pass(source, ref, clips, options, progress)
    ctx.choice = choice or clips
    with staged(out_dir) as stage:
        manifest = _export_into(stage, source, model, ref, ctx, options=options, progress=progress)
        write_json_atomic(stage / MANIFEST, manifest)
    return manifest


def _reference_pass(source: Source, ref: Any, clips: list[Clip], options: ExportOptions,
                    progress: Progress) -> _Context:
    """PyTorch's transcripts of the clips; refuses weights that do not transcribe them."""
    from exporters.whisper import reference as ref_mod

    n_mels = ref.model.dims.n_mels
    with progress.step(f"PyTorch reference on {len(clips)} clips"):
        mels = [ref_mod.log_mel(c.audio(), n_mels) for c in clips]
        ref_texts = [ref.text(ref.decode(mel)) for mel in mels]
    truths = [c.text for c in clips]
    ref_wer_truth = wer(truths, ref_texts)
    for clip, text in zip(clips, ref_texts, strict=True):
        progress(f"  {clip.name:<9} {text}")
    progress(f"PyTorch: WER {ref_wer_truth:.3f} against the known text")
    if options.max_source_wer is not None and ref_wer_truth > options.max_source_wer:
        worst = max(range(len(clips)), key=lambda i: wer([truths[i]], [ref_texts[i]]))
        raise ModelError(
            f"{source.ref}: the PyTorch model does not transcribe the test clips (WER {ref_wer_truth:.3f} > "
            f"{options.max_source_wer:.3f}; {clips[worst].name!r} came out as {ref_texts[worst]!r}); "
            "refusing to export")
    pad = int(options.trim_pad_s * ref_mod.SAMPLE_RATE)
    audio = [c.audio() for c in clips]
    trimmed = [ref_mod.log_mel(a, n_mels, ref_mod.frames_for(len(a) + pad)) for a in audio]
    return _Context(clips, mels, trimmed, ref_texts, [])


def _export_into(stage: Path, source: Source, model: Any, ref: Any, ctx: _Context, *,
                 options: ExportOptions, progress: Progress) -> dict[str, Any]:
    """Everything but the manifest's own file: fixtures, tokenizer, ONNX variants, measurements."""
    from exporters.whisper.onnx_export import export_decoder, export_encoder
    from exporters.whisper.tokenizer_json import build_tokenizer_json, check_tokenizer

    with progress.step("parity fixture (PyTorch logits)"):
        _parity_fixture(model, ref, ctx, options)
        arrays: dict[str, Any] = ctx.parity_arrays
        np.savez(stage / "parity.npz", **arrays)
    tokenizer_origin = _tokenizer(source, model, stage / "tokenizer.json", build_tokenizer_json)
    check_tokenizer(stage / "tokenizer.json", ref.specials)
    with progress.step("exporting encoder (fp32)"):
        export_encoder(model, stage / "encoder.fp32.onnx")
    with progress.step("exporting decoder with KV cache (fp32)"):
        export_decoder(model, stage / "decoder.fp32.onnx")
    signature = {part: io_signature(stage / f"{part}.fp32.onnx") for part in ("encoder", "decoder")}
    config = _decode_config(model, ref.specials, options)
    calibration: list[Feed] = []

    def derive(name: str, files: dict[str, str]) -> None:
        if name == "int8-static" and not calibration:
            with progress.step("collecting calibration inputs"):
                calibration.extend(_calibration(stage, config, ctx, options))
        _make_variant(stage, name, files, calibration, progress)

    variants, runners = build_variants(
        stage, options.variants, files=lambda name: {p: f"{p}.{name}.onnx" for p in ("encoder", "decoder")},
        mode=_mode_label, derive=derive, checking="logit", progress=progress,
        prepare=lambda name, files: _prepare(stage, files, config, ctx, options))
    with progress.step(f"timing {', '.join(runners)} and PyTorch side by side on {len(ctx.clips)} clips"):
        timings = _time_side_by_side(runners, ref, ctx, options)
    with progress.step(f"WER of {', '.join(runners)} and PyTorch on {len(ctx.choice)} clips"):
        swept = _sweep(runners, ref, ctx.choice, progress)
    pytorch = timings.pop("pytorch")
    pytorch["sweep"] = swept.pop("pytorch")
    for name, variant in variants.items():
        if name in timings:
            variant.update(timings[name])
            variant["wer_drift"] = round(variant["wer_truth"] - pytorch["wer_truth"], WER_DIGITS)
            variant["sweep"] = swept[name]
            variant["wer_drift_bound"] = swept[name]["drift_bound"]
    chosen = KIND.choose(stage, variants, options.variants, progress)
    return _manifest(stage, source, ref, ctx, options=options, signature=signature, chosen=chosen,
                     pytorch=pytorch, tokenizer_origin=tokenizer_origin)


def _manifest(stage: Path, source: Source, ref: Any, ctx: _Context, *, options: ExportOptions,
              signature: dict[str, Any], chosen: dict[str, Any], pytorch: dict[str, Any],
              tokenizer_origin: str) -> dict[str, Any]:
    import torch

    from exporters.whisper import reference as ref_mod
    from exporters.whisper.onnx_export import OPSET

    sp, model = ref.specials, ref.model
    return {
        **KIND.head(source.describe()),
        "sample_rate": ref_mod.SAMPLE_RATE,
        "dims": ref_mod.dims_dict(model),
        "multilingual": bool(model.is_multilingual),
        "special_tokens": _special_tokens(sp),
        "suppress_tokens": list(sp.suppress_tokens),
        "begin_suppress_tokens": list(sp.begin_suppress_tokens),
        "max_frames": ref_mod.FULL_FRAMES,
        "tokenizer": {"file": "tokenizer.json", "origin": tokenizer_origin},
        "opset": OPSET,
        "models": signature,
        **chosen,
        "reference": {
            "runtime": f"PyTorch {torch.__version__} (openai-whisper)", "threads": options.threads,
            "rtf": pytorch["rtf"], "wer_truth": pytorch["wer_truth"], "sweep": pytorch["sweep"],
        },
        "sweep_clips": [{"name": c.name, "text": c.text, "voice": c.engine} for c in ctx.choice],
        "clips": [
            {"name": c.name, "text": c.text, "engine": c.engine, "duration_s": round(c.duration_s, 3),
             "reference_transcript": t}
            for c, t in zip(ctx.clips, ctx.ref_texts, strict=True)
        ],
        "trim_pad_s": options.trim_pad_s,
        "parity": {"file": "parity.npz", "runs": ctx.parity},
        "files": files_of(stage),
    }


# -- steps --------------------------------------------------------------------------------------


def _tokenizer(source: Source, model: Any, dest: Path,
               build: Callable[[Any], dict[str, Any]]) -> str:
    shipped = source.path / "tokenizer.json" if source.kind != "pt" else None
    if shipped is not None and shipped.is_file():
        shutil.copyfile(shipped, dest)
        return "copied from the CTranslate2 directory"
    write_json_atomic(dest, build(model))
    return "generated from openai-whisper's tiktoken vocabulary"


def _decode_config(model: Any, sp: Any, options: ExportOptions) -> Any:
    return DecodeConfig(
        eot=sp.eot, sot_sequence=sp.sot_sequence, suppress_tokens=sp.suppress_tokens,
        begin_suppress_tokens=sp.begin_suppress_tokens, n_text_layer=model.dims.n_text_layer,
        n_text_state=model.dims.n_text_state, max_tokens=options.max_tokens or model.dims.n_text_ctx // 2,
    )


def _parity_fixture(model: Any, ref: Any, ctx: _Context, options: ExportOptions) -> None:
    from exporters.whisper import reference as ref_mod

    seen: set[int] = set()
    for run, raw in enumerate(options.parity_clips):
        index = raw % len(ctx.clips)
        padded = run == 0
        if index in seen and not padded:
            continue
        seen.add(index)
        clip = ctx.clips[index]
        mel = ctx.mels[index] if padded else ref_mod.log_mel(clip.audio(), model.dims.n_mels, None)
        saved_max = ref.max_tokens
        ref.max_tokens = min(saved_max, PARITY_MAX_TOKENS)
        try:
            tokens = [*ref.specials.sot_sequence, *ref.decode(mel)]
        finally:
            ref.max_tokens = saved_max
        logits = ref_mod.teacher_forced_logits(model, mel, tokens)
        key = f"run{len(ctx.parity)}"
        ctx.parity_arrays |= {f"{key}_mel": mel, f"{key}_tokens": np.array(tokens, dtype=np.int64),
                              f"{key}_logits": logits.astype(np.float32)}
        ctx.parity.append({"key": key, "clip": clip.name, "n_frames": int(mel.shape[1]),
                           "padded_to_30s": padded, "n_tokens": len(tokens)})


def _mode_label(name: str) -> str:
    """`int8-matmul`, or `encoder int8-matmul, decoder int4-block` where the parts differ."""
    modes = MODES.get(name)
    if modes is None:
        return "export"
    if len(set(modes.values())) == 1:
        return next(iter(modes.values()))
    return ", ".join(f"{part} {mode}" for part, mode in modes.items())


def _make_variant(stage: Path, name: str, files: dict[str, str], calibration: list[Feed],
                  progress: Progress) -> None:
    for part, filename in files.items():
        mode = MODES[name][part]
        with progress.step(f"{name}: {part} ({mode})"):
            feeds = None
            if name == "int8-static":
                feeds = [f for f in calibration if ("mel" in f) == (part == "encoder")]
            quantize(stage / f"{part}.fp32.onnx", stage / filename, mode, feeds)


def _calibration(stage: Path, config: Any, ctx: _Context, options: ExportOptions) -> list[Feed]:
    """Encoder inputs (padded and unpadded mels) and decoder inputs seen while decoding with fp32."""
    runner = OnnxWhisper(stage / "encoder.fp32.onnx", stage / "decoder.fp32.onnx", config, options.threads)
    feeds: list[Feed] = [{"mel": m[None]} for m in (*ctx.mels, *ctx.trimmed)]
    recorded: list[Feed] = []
    runner.record = recorded
    for mel in ctx.mels[:4]:
        runner.decode(mel)
    step = max(1, len(recorded) // 48)
    return feeds + recorded[::step]


def _prepare(stage: Path, files: dict[str, str], config: Any, ctx: _Context,
             options: ExportOptions) -> tuple[Any, dict[str, Any]]:
    """Load a variant (timed), measure logit parity against PyTorch, warm it up."""
    enc, dec = stage / files["encoder"], stage / files["decoder"]
    loads = []
    for _ in range(options.load_repeats):
        runner = OnnxWhisper(enc, dec, config, options.threads)
        loads.append(runner.load_s)
    diffs = []
    for run in ctx.parity:
        arrays, key = ctx.parity_arrays, run["key"]
        got = runner.teacher_forced_logits(arrays[f"{key}_mel"], arrays[f"{key}_tokens"].tolist())
        diffs.append(float(np.abs(got - arrays[f"{key}_logits"]).max()))
    runner.decode(ctx.mels[0])  # warm-up: first-run allocations are not the steady state
    return runner, {
        "size_bytes": enc.stat().st_size + dec.stat().st_size,
        "load_s": round(statistics.median(loads), 4),
        "max_logit_diff": max(diffs),
        "parity_diffs": diffs,
        "threads": options.threads,
    }


def _time_side_by_side(runners: dict[str, Any], ref: Any, ctx: _Context,
                       options: ExportOptions) -> dict[str, dict[str, Any]]:
    """RTF and WER of every variant and of PyTorch (the padded pass only: it is slow), clip by clip."""
    audio_s = sum(c.duration_s for c in ctx.clips)
    truths = [c.text for c in ctx.clips]
    result: dict[str, dict[str, Any]] = {}
    for label, mels in (("", ctx.mels), ("trimmed", ctx.trimmed)):
        decoders = runners if label else {**runners, "pytorch": ref}
        contenders = {name: runner.decode for name, runner in decoders.items()}
        best, tokens = time_side_by_side(contenders, mels, options.timing_repeats)
        for name in contenders:
            texts = [ref.text(t) for t in tokens[name]]
            measured = {"rtf": round(sum(best[name]) / audio_s, 4),
                        "wer": round(wer(ctx.ref_texts, texts), WER_DIGITS),
                        "wer_truth": round(wer(truths, texts), WER_DIGITS),
                        "transcripts": texts}
            if label:
                result[name][label] = measured
            else:
                result[name] = measured
    return result


def _sweep(runners: dict[str, Any], ref: Any, clips: list[Clip], progress: Progress,
           ) -> dict[str, dict[str, Any]]:
    """Each variant's and PyTorch's WER on `clips`, and each variant's drift from PyTorch with its
    one-sided 95 % upper bound (a paired comparison).

    The drift is the sum over clips of (variant's word edits - PyTorch's) over all words; its
    standard error comes from the spread of those per-clip differences, so a variant whose words
    differ from PyTorch's here and there, as often for the better as for the worse, is not
    ranked by a word or two, while one that loses words steadily is. Every clip is padded to
    Whisper's 30 s window, where the reference is defined: at the device's short (bucket)
    window greedy decoding without the runtime's retry loops on many clips (sweep WER 0.78 for
    fp32 and PyTorch alike), which measures the padding, not the variant. Decoding stops at the
    runtime's token budget for the clip's length, so a loop costs little.
    """
    from edge_agent.asr.whisper import token_budget
    from edge_agent.text.wer import edit_distance, words
    from exporters.whisper import reference as ref_mod

    decoders = {**{n: r.decode for n, r in runners.items()}, "pytorch": ref.decode}
    truths = [words(c.text) for c in clips]
    n_words = sum(len(t) for t in truths)
    texts: dict[str, list[str]] = {name: [] for name in decoders}
    edits: dict[str, list[int]] = {name: [] for name in decoders}
    for done, (clip, truth) in enumerate(zip(clips, truths, strict=True)):
        if done and done % 40 == 0:
            progress(f"  {done}/{len(clips)} clips")
        audio = clip.audio()
        mel = ref_mod.log_mel(audio, ref.model.dims.n_mels)
        budget = token_budget(audio.size / ref_mod.SAMPLE_RATE)
        for name, decode in decoders.items():
            text = ref.text(decode(mel, budget))
            texts[name].append(text)
            edits[name].append(edit_distance(truth, words(text)))
    base = np.array(edits["pytorch"], dtype=np.float64)
    out: dict[str, dict[str, Any]] = {}
    for name in decoders:
        mine = np.array(edits[name], dtype=np.float64)
        entry: dict[str, Any] = {"clips": len(clips), "words": n_words,
                                 "wer": round(float(mine.sum()) / n_words, WER_DIGITS)}
        if name != "pytorch":
            diff = mine - base
            se = math.sqrt(len(diff)) * float(diff.std(ddof=1)) / n_words if len(diff) > 1 else 0.0
            drift = float(diff.sum()) / n_words
            entry |= {"drift": round(drift, WER_DIGITS), "drift_se": round(se, WER_DIGITS),
                      "drift_bound": round(drift + CONFIDENCE_Z * se, WER_DIGITS),
                      "clips_differing": int(np.count_nonzero(diff))}
        out[name] = entry | {"transcripts": texts[name]}
    return out


def _special_tokens(sp: Any) -> dict[str, Any]:
    return {
        "sot": sp.sot, "eot": sp.eot, "transcribe": sp.transcribe, "translate": sp.translate,
        "no_timestamps": sp.no_timestamps, "no_speech": sp.no_speech, "sot_prev": sp.sot_prev,
        "sot_lm": sp.sot_lm, "timestamp_begin": sp.timestamp_begin,
        "sot_sequence": list(sp.sot_sequence), "languages": dict(sp.languages),
    }
