"""`bench asr --real DIR`: our Whisper on recordings of real people, and what its retry buys there.

Each recording (FLAC or WAV, named by what is said or listed in the folder's `references.json`:
`benchmarks.turn.load_recordings`) is cut as the VAD cuts a command: from 0.2 s before the
configured VAD first hears speech to 0.3 s after the speech's level ends (`Recording.speech_end`,
found by `speech_bounds` as the recordings load). It is decoded twice, as the device decodes it
(the default variant, `asr.beam_size`, bucket padding): once in its bucket window with no retry,
once in Whisper's own 30 s window. From those two decodes every retry rule is scored without
decoding again:

- `no retry`: the bucket window's result, unless it is degenerate (a loop is always retried);
- `retry, keep the retry's` (the device's rule, `asr.whisper`): below `asr.retry_logprob` the 30 s
  result replaces it;
- `retry, keep the surer`: the 30 s result only where it is surer (its tokens' mean
  log-probability is higher): Whisper's own measure as the arbiter;
- `retry under N s`: the device's rule for commands shorter than N seconds (as cut), no retry for
  longer ones: where the retry's time goes against what it finds;
- `30 s always` (`asr.padding: full`).

Per rule: WER, words missed (the reference's words not found in the transcript: for a corpus
whose reference is the slot values of a command, such as Picovoice's speech-to-intent set, this is
the measure, since a slot reference has no word order), the share of commands decoded twice, and
decode time p50/p90/mean. `--split tune|held-out` takes the fixed quarter of file names whose
CRC-32 is 0 modulo 4 as the held-out part (`realroom.held_out`, as `bench hear --real`), so that
no rule is chosen on it.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.realroom import held_out
from benchmarks.report import emit, machine, median, percentile
from benchmarks.turn import kept, load_recordings
from edge_agent.asr.whisper import Padding, Recognition, WhisperOnnx, resolve_export_dir
from edge_agent.commands.context import Context
from edge_agent.errors import UsageError
from edge_agent.text.wer import wer
from edge_agent.vad.factory import make_classifier

log = logging.getLogger(__name__)

RATE = 16000
BEFORE_S = 0.2
"""Audio kept before the speech, as the VAD's pre-roll keeps it."""
AFTER_S = 0.3
"""Audio kept after the speech, as the VAD's tail (`vad.segmenter.TAIL_MS`, 200 ms) and its lag keep it."""
SHORTER_THAN_S = (1.5, 2.5)
"""The lengths of the `retry under N s` rules."""
RULES = ("no retry", "retry, keep the retry's", "retry, keep the surer",
         *(f"retry under {n:g} s" for n in SHORTER_THAN_S), "30 s always")
DEVICE_RULE = "retry, keep the retry's"
NEVER = -1e9
"""A retry cutoff no mean log-probability is below: the bucket window's own result."""


@dataclass(frozen=True)
class Decoded:
    """One recording decoded in its bucket window and in 30 s."""

    name: str
    reference: str
    seconds: float
    """The command as cut."""
    short: Recognition
    short_s: float
    full: Recognition
    full_s: float


def in_split(name: str, split: str) -> bool:
    """Whether the recording `name` is in `split` (all, tune, held-out: a fixed quarter by CRC-32)."""
    return split == "all" or (split == "held-out") == held_out(name)


def decode_all(ctx: Context, directory: Path, split: str, limit: int | None) -> list[Decoded]:
    settings = ctx.settings
    asr = settings.asr
    recordings = load_recordings(directory, make_classifier(settings.vad, ctx.store))
    chosen = [r for r in recordings if in_split(r.name, split)][:limit]
    if not chosen:
        raise UsageError(f"--real: no recordings of {directory} in the {split} part")
    model = WhisperOnnx.load(resolve_export_dir(asr, settings.models), asr.variant or None, asr.threads,
                             decoder_threads=asr.decoder_threads)
    short_window = Padding(asr.padding, asr.bucket_s, asr.margin_s, NEVER, asr.retry_window_s)
    decoded = []
    try:
        for i, rec in enumerate(chosen):
            cut = slice(max(0, rec.onset - round(BEFORE_S * RATE)), rec.speech_end + round(AFTER_S * RATE))
            audio = rec.audio[cut]
            started = time.perf_counter()
            short = model.recognize(audio, short_window, max_tokens=asr.max_tokens, beam_size=asr.beam_size)
            short_s = time.perf_counter() - started
            started = time.perf_counter()
            full = model.recognize(audio, Padding("full"), max_tokens=asr.max_tokens, beam_size=asr.beam_size)
            full_s = time.perf_counter() - started
            decoded.append(Decoded(rec.name, rec.text, audio.size / RATE, short, short_s, full, full_s))
            log.info("%d/%d %s: %r (%.2f) | 30 s %r (%.2f)", i + 1, len(chosen), rec.name, short.text,
                     short.avg_logprob, full.text, full.avg_logprob)
    finally:
        model.close()
    return decoded


def outcome(d: Decoded, rule: str, cutoff: float) -> tuple[str, float, bool]:
    """What `rule` would have given for `d`: (transcript, decode seconds, decoded twice)."""
    if rule == "30 s always":
        return d.full.text, d.full_s, False
    if d.short.fallback:  # degenerate: every rule but the 30 s window retried it already
        return d.short.text, d.short_s, True
    unsure = d.short.avg_logprob < cutoff
    if rule.startswith("retry under "):
        unsure = unsure and d.seconds < float(rule.split()[2])
    if rule == "no retry" or not unsure:
        return d.short.text, d.short_s, False
    both = d.short_s + d.full_s
    if rule == "retry, keep the surer" and d.short.avg_logprob > d.full.avg_logprob:
        return d.short.text, both, True
    return d.full.text, both, True


def score(decoded: list[Decoded], cutoff: float) -> dict[str, dict[str, Any]]:
    references = [d.reference for d in decoded]
    rules = {}
    for rule in RULES:
        texts, seconds, twice = [], [], 0
        for d in decoded:
            text, spent, retried = outcome(d, rule, cutoff)
            texts.append(text)
            seconds.append(spent)
            twice += retried
        found = [kept(ref, text) for ref, text in zip(references, texts, strict=True)]
        words = sum(total for _, total in found)
        rules[rule] = {
            "wer": wer(references, texts),
            "words_missed": 1 - sum(n for n, _ in found) / words if words else 0.0,
            "decoded_twice": twice / len(decoded),
            "decode_p50_s": median(seconds), "decode_p90_s": percentile(seconds, 90),
            "decode_mean_s": sum(seconds) / len(seconds),
        }
    return rules


def run(ctx: Context, args: argparse.Namespace) -> int:
    decoded = decode_all(ctx, Path(args.real), args.split, args.limit)
    asr = ctx.settings.asr
    loops = sum(d.short.fallback for d in decoded)  # with no unsure retry, only a loop is decoded twice
    result = {"bench": "asr-real", "recordings": len(decoded), "folder": args.real, "split": args.split,
              "retry_logprob": asr.retry_logprob, "device_rule": DEVICE_RULE, "degenerate": loops,
              "rules": score(decoded, asr.retry_logprob), "machine": machine(),
              "texts": {d.name: {"reference": d.reference, "short": d.short.text,
                                 "short_logprob": d.short.avg_logprob, "full": d.full.text,
                                 "full_logprob": d.full.avg_logprob} for d in decoded}}
    emit(result, report(result), args.json)
    return 0


def report(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['recordings']} real recordings ({result['split']}) of {result['folder']}; "
             f"asr.retry_logprob {result['retry_logprob']}; {result['degenerate']} degenerate in "
             f"their bucket window (always retried)",
             f"  {'rule':<24} {'WER':>6} {'missed':>7} {'twice':>6} {'p50':>7} {'p90':>7} {'mean':>7}"]
    for rule, r in result["rules"].items():
        mark = "  (the device's)" if rule == result["device_rule"] else ""
        lines.append(f"  {rule:<24} {r['wer']:6.3f} {r['words_missed']:7.3f} {r['decoded_twice']:6.2f} "
                     f"{r['decode_p50_s']:6.3f}s {r['decode_p90_s']:6.3f}s {r['decode_mean_s']:6.3f}s{mark}")
    return lines
