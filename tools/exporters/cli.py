"""`edge-export`: whisper | vocoder | quantize | verify.

Exit codes: 0 ok, 2 bad usage or bad input (one line on stderr), 1 internal failure.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks.clips import clip_set, sweep_set
from edge_agent.cli import common_options, run_handler
from edge_agent.commands.context import Context
from edge_agent.errors import ModelError
from exporters.manifest import read_manifest
from exporters.progress import Progress
from exporters.quantize import MODES
from exporters.quantize_cmd import quantize_and_measure
from exporters.report import variant_table
from exporters.verify import verify_dir
from exporters.vocoder import pipeline as vocoder_pipeline
from exporters.whisper.pipeline import (
    DEFAULT_VARIANTS,
    VARIANTS,
    ExportOptions,
    export_whisper,
    parse_variants,
    resolve_source,
    up_to_date,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = common_options()
    common.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    common.add_argument("--threads", type=_positive, default=2, help="onnxruntime threads when measuring")
    parser = _Parser(prog="edge-export", description="Export real PyTorch speech models to ONNX, "
                     "quantize them by measurement and check parity.")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    w = _model_parser(sub, common, "whisper", help="Whisper weights -> measured ONNX variants",
                      description="Export a Whisper model to ONNX (encoder + KV-cached decoder), derive "
                      "quantized variants, measure them against PyTorch and write manifest.json.",
                      sources="catalog id (whisper-tiny.en, whisper-base), a CTranslate2 directory, "
                      "or an openai-whisper .pt checkpoint", variants=(DEFAULT_VARIANTS, VARIANTS))
    w.add_argument("--max-tokens", type=_positive, help="cap on decoded tokens per clip")
    w.set_defaults(handler=run_whisper)

    voc = _model_parser(sub, common, "vocoder", help="HiFi-GAN weights -> measured streaming ONNX",
                        description="Export a HiFi-GAN V1 generator to ONNX (whole and windowed), derive "
                        "variants, measure them against PyTorch (waveform, log-mel distance, RTF, and "
                        "the round trip through our ASR) and write manifest.json.",
                        sources="catalog id (hifigan-universal, hifigan-ljspeech) or a generator checkpoint "
                        "with its config.json beside it",
                        variants=(vocoder_pipeline.DEFAULT_VARIANTS, vocoder_pipeline.VARIANTS))
    voc.add_argument("--asr", type=Path, metavar="DIR",
                     help="Whisper export the round trip is transcribed with (default: "
                     "<models.cache_dir>/exported/whisper-tiny.en, made by `edge-export whisper`)")
    voc.set_defaults(handler=run_vocoder)

    q = sub.add_parser("quantize", parents=[common], help="compress one ONNX model and measure it",
                       description="Write MODEL.onnx compressed by --mode to --out, measure it side by "
                       "side with the source and record the result in manifest.json beside --out.")
    q.add_argument("model", type=Path, metavar="MODEL.onnx")
    q.add_argument("--mode", required=True, choices=MODES)
    q.add_argument("--out", required=True, type=Path, metavar="FILE")
    q.add_argument("--inputs", type=Path, metavar="FILE.npz",
                   help="sample inputs (arrays named after the model inputs); also the calibration set")
    q.add_argument("--repeats", type=_positive, default=5, help="timed runs (median)")
    q.set_defaults(handler=run_quantize)

    v = sub.add_parser("verify", parents=[common], help="re-check hashes and parity of an export dir")
    v.add_argument("dir", type=Path, metavar="DIR")
    v.set_defaults(handler=run_verify)
    return parser


def _model_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser,
                  name: str, *, help: str, description: str, sources: str,
                  variants: tuple[tuple[str, ...], tuple[str, ...]]) -> argparse.ArgumentParser:
    """The options every model export takes: --source, --out, --variants (default, choices), --force."""
    default, known = variants
    p = sub.add_parser(name, parents=[common], help=help, description=description)
    p.add_argument("--source", required=True, metavar="ID|PATH", help=sources)
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="export directory (default: <models.cache_dir>/exported/<source>)")
    p.add_argument("--variants", default=",".join(default),
                   help=f"comma-separated, from {','.join(known)} (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="export even if DIR is up to date")
    return p


def _progress(args: argparse.Namespace) -> Progress:
    return Progress(quiet=args.quiet)


def run_whisper(args: argparse.Namespace) -> int:
    progress = _progress(args)
    variants = parse_variants(args.variants)
    ctx = Context(args)
    store = ctx.store
    source = resolve_source(args.source, store, progress)
    out = args.out or store.cache_dir / "exported" / source.name
    options = ExportOptions(variants=variants, threads=args.threads, max_tokens=args.max_tokens)
    if not args.force and up_to_date(out, source, options):
        progress(f"{out}: up to date (same source sha256 and variants); --force re-exports")
        manifest = read_manifest(out)
    else:
        manifest = export_whisper(source, out, clip_set(store), options, progress, choice=sweep_set(store))
    print(variant_table(manifest))
    print(out)
    return 0


def run_vocoder(args: argparse.Namespace) -> int:
    from benchmarks.clips import clip_set
    from exporters.manifest import read_manifest
    from exporters.report import vocoder_table
    from exporters.vocoder.hifigan import load_generator, resolve_source
    from exporters.vocoder.pipeline import ExportOptions, export_vocoder, parse_variants, up_to_date
    from exporters.vocoder.transcriber import asr_for_round_trip

    progress = _progress(args)
    variants = parse_variants(args.variants)
    store = Context(args).store
    source = resolve_source(args.source, store, progress)
    out = args.out or store.cache_dir / "exported" / source.name
    options = ExportOptions(variants=variants, threads=args.threads)
    if not args.force and up_to_date(out, source, options):
        progress(f"{out}: up to date (same source sha256 and variants); --force re-exports")
        manifest = read_manifest(out)
    else:
        with progress.step(f"loading {source.ref} into PyTorch"):
            generator, config = load_generator(source)  # a bad checkpoint fails before anything else
        asr_dir = args.asr or store.cache_dir / "exported" / "whisper-tiny.en"
        transcribe, asr = asr_for_round_trip(asr_dir, args.threads)
        clips = clip_set(store)
        manifest = export_vocoder(source, out, clips, generator=generator, config=config,
                                  transcribe=transcribe, asr=asr, options=options, progress=progress)
    print(vocoder_table(manifest))
    print(out)
    return 0


def run_quantize(args: argparse.Namespace) -> int:
    summary = quantize_and_measure(args.model, args.out, args.mode, inputs=args.inputs,
                                   threads=args.threads, repeats=args.repeats, progress=_progress(args))
    print(summary)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    problems = verify_dir(args.dir, args.threads, _progress(args))
    for problem in problems:
        print(f"FAILED {problem}")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ModelError(problems[0] + more)
    print(f"{args.dir}: ok")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_handler("edge-export", build_parser().parse_args(argv))
