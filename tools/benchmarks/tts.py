"""Local TTS: time to first audio, total time and RTF, ours vs piper-tts 1.2.0 on the same voice."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.report import emit, machine, median
from edge_agent.audio.frames import AudioChunk
from edge_agent.commands.context import Context
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import synthesize

TEXTS = {
    "short": "Dinner is ready. The front door is open. Please close it before you leave.",
    "long_first": (
        "The washing machine in the basement has finished its cycle and the clothes should be "
        "moved to the dryer right away so that they do not start to smell before tomorrow morning. "
        "Thank you."
    ),
}
"""Fixed announcement texts: three short sentences, and one whose first sentence has 30 words."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per text (median)")
    parser.add_argument("--no-reference", action="store_true", help="skip piper-tts")
    parser.add_argument("--pause", type=float, default=PAUSE_S, metavar="SECONDS",
                        help=f"idle time before every timed run (default {PAUSE_S})")


PAUSE_S = 0.1
"""Default idle time before every timed run. piper-tts leaves onnxruntime's threads
spinning after its run ends (its sessions allow spinning and never stop it), and
they take a core from whatever runs next: measured here, our short text took
126 ms right after a piper-tts run, 117 ms 10 ms later, 100 ms from 50 ms on, and
the same 97-109 ms at any gap after a run of ours. Both sides get the same pause,
so each starts on idle cores, as an announcement does on an idle device."""


def _time_stream(
    stream: Callable[[], Iterator[Any]], count: Callable[[Any], int], pause_s: float = 0.0
) -> tuple[float, float, int]:
    time.sleep(pause_s)
    started = time.perf_counter()
    first = None
    samples = 0
    for item in stream():
        if first is None:
            first = time.perf_counter() - started
        samples += count(item)
    return first or 0.0, time.perf_counter() - started, samples


def _reference(ctx: Context, voice_id: str) -> Any:
    try:
        from piper import PiperVoice
    except ImportError:
        return None
    files = ctx.store.require(voice_id)
    model = files.entry.files[0].name
    return PiperVoice.load(str(files.path(model)), str(files.path(f"{model}.json")))


def run(ctx: Context, args: argparse.Namespace) -> int:
    settings = ctx.settings
    voice_id = settings.tts.voice
    voice = VoiceRegistry(ctx.store, settings.tts).get(voice_id)
    ref: Any = None if args.no_reference else _reference(ctx, voice_id)

    def ours(text: str) -> Callable[[], Iterator[AudioChunk]]:
        return lambda: synthesize(voice, text)

    def theirs(text: str) -> Callable[[], Iterator[bytes]]:
        return lambda: iter(ref.synthesize_stream_raw(text))

    per_text: dict[str, dict[str, float]] = {}
    for name, text in TEXTS.items():
        _time_stream(ours(text), lambda c: len(c.samples))  # warm-up
        if ref is not None:
            _time_stream(theirs(text), len)
        runs: dict[str, list[float]] = {k: [] for k in ("ttfa", "total", "ref_ttfa", "ref_total")}
        audio_s = 0.0
        for _ in range(args.repeats):  # interleaved, so drift hits both sides alike
            ttfa, total, frames = _time_stream(ours(text), lambda c: len(c.samples), args.pause)
            runs["ttfa"].append(ttfa)
            runs["total"].append(total)
            audio_s = frames / voice.sample_rate
            if ref is not None:
                r_ttfa, r_total, _ = _time_stream(theirs(text), len, args.pause)
                runs["ref_ttfa"].append(r_ttfa)
                runs["ref_total"].append(r_total)
        per_text[name] = {k: median(v) for k, v in runs.items() if v} | {"audio_s": audio_s}

    ttfa = sum(t["ttfa"] for t in per_text.values())
    total = sum(t["total"] for t in per_text.values())
    audio = sum(t["audio_s"] for t in per_text.values())
    result: dict[str, Any] = {
        "voice": voice_id, "threads": settings.tts.threads, "repeats": args.repeats, "pause_s": args.pause,
        "ttfa_s": ttfa / len(per_text), "total_s": total, "rtf": total / audio,
        "texts": per_text, "machine": machine(),
    }
    lines = [f"voice {voice_id}, {settings.tts.threads} threads, median of {args.repeats} runs, "
             f"{args.pause:g} s idle before each"]
    for name, t in per_text.items():
        line = f"  {name:<11} ours: first audio {t['ttfa'] * 1000:6.1f} ms, total {t['total'] * 1000:6.1f} ms"
        if "ref_total" in t:
            line += f" | piper-tts: {t['ref_ttfa'] * 1000:6.1f} ms, {t['ref_total'] * 1000:6.1f} ms"
        lines.append(line + f" ({t['audio_s']:.2f} s audio)")
    if ref is not None:
        ref_ttfa = sum(t["ref_ttfa"] for t in per_text.values())
        ref_total = sum(t["ref_total"] for t in per_text.values())
        result |= {"reference": "piper-tts 1.2.0", "reference_total_s": ref_total,
                   "reference_ttfa_s": ref_ttfa / len(per_text), "reference_rtf": ref_total / audio,
                   "ratio": total / ref_total, "ttfa_ratio": ttfa / ref_ttfa}
        lines.append(f"ratio (total, ours/ref) {result['ratio']:.3f}; "
                     f"ttfa_ratio {result['ttfa_ratio']:.3f}; RTF ours {result['rtf']:.3f}, "
                     f"ref {result['reference_rtf']:.3f}")
    else:
        result |= {"reference": None, "reference_total_s": None, "ratio": None, "ttfa_ratio": None}
        lines.append(f"RTF {result['rtf']:.3f} (piper-tts not installed: no reference)")
    emit(result, lines, args.json)
    return 0
