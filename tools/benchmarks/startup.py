"""Start-up: `edge-agent say TEXT --out x.wav` in a fresh process vs piper-tts 1.2.0's `piper` CLI.

Both speak the same text with the same voice file into a WAV file, each in a new
process, interleaved run by run (the order alternates), after one untimed run of
each (model cache prepared, files in the page cache). Wall time and peak RSS
(the child's `ru_maxrss`) are taken per process; the medians and our/piper
ratios are reported, with CPU time (user + system), which a busy machine
disturbs less than wall time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import wave
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.report import emit, machine, median
from edge_agent.commands.context import Context
from edge_agent.errors import UsageError

TEXT = "Short sentence."
REFERENCE = "piper-tts==1.2.0"
TIMEOUT_S = 120.0
"""Longest a single run may take before the bench gives up on it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each program (median)")
    parser.add_argument("--text", default=TEXT, help=f"what both say (default {TEXT!r})")
    parser.add_argument("--no-reference", action="store_true", help="skip piper-tts's CLI")


def run(ctx: Context, args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    settings = ctx.settings
    files = ctx.store.require(settings.tts.voice)
    model = files.path(files.entry.files[0].name)
    piper = None if args.no_reference else _piper_cli()
    with tempfile.TemporaryDirectory(prefix="edge-bench-startup-") as tmp:
        ours_cmd = [sys.executable, "-m", "edge_agent", "say", args.text, "--out", f"{tmp}/ours.wav",
                    *_passed_on(args)]
        sides: dict[str, tuple[list[str], str | None, Path]] = {
            "ours": (ours_cmd, None, Path(tmp) / "ours.wav")}
        if piper is not None:
            sides["piper"] = ([piper, "--model", str(model), "--output_file", f"{tmp}/piper.wav"],
                              args.text, Path(tmp) / "piper.wav")
        for cmd, stdin, out in sides.values():  # untimed: prepared split, page cache
            _run(cmd, stdin, out)
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
        for n in range(args.repeats):
            order = list(sides) if n % 2 == 0 else list(reversed(sides))
            for name in order:
                runs[name].append(_run(*sides[name]))
    result: dict[str, Any] = {"bench": "startup", "text": args.text, "voice": settings.tts.voice,
                              "repeats": args.repeats, "machine": machine(), "load_avg": os.getloadavg()[0]}
    lines = [f"`edge-agent say {args.text!r} --out x.wav`, fresh process, median of {args.repeats}; "
             f"load average {result['load_avg']:.2f}"]
    for name, samples in runs.items():
        wall, cpu, rss = (median([sample[i] for sample in samples]) for i in range(3))
        result[name] = {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": rss,
                        "wall_runs_s": [sample[0] for sample in samples]}
        label = "ours" if name == "ours" else f"piper CLI ({REFERENCE})"
        lines.append(f"  {label:<28} {wall:6.3f} s wall  {cpu:6.3f} s CPU  peak RSS {rss:6.1f} MB")
    if "piper" in runs:
        ratio = result["ours"]["wall_s"] / result["piper"]["wall_s"]
        rss_ratio = result["ours"]["peak_rss_mb"] / result["piper"]["peak_rss_mb"]
        cpu_ratio = result["ours"]["cpu_s"] / result["piper"]["cpu_s"]
        result |= {"ratio": ratio, "cpu_ratio": cpu_ratio, "rss_ratio": rss_ratio,
                   "goal_met": ratio <= 1.0 and rss_ratio <= 1.0}
        lines.append(f"  ratio {ratio:.2f} (goal <= 1.0; CPU time {cpu_ratio:.2f}), peak RSS ratio "
                     f"{rss_ratio:.2f} (goal <= 1.0): {'met' if result['goal_met'] else 'NOT met'}")
    else:
        result["reference"] = f"not run ({REFERENCE} CLI not installed or skipped)"
        lines.append(f"  {result['reference']}")
    emit(result, lines, args.json)
    return 0


def _piper_cli() -> str | None:
    """The `piper` program of piper-tts 1.2.0 beside this Python, if that is what is installed."""
    try:
        if f"piper-tts=={metadata.version('piper-tts')}" != REFERENCE:
            return None
    except metadata.PackageNotFoundError:
        return None
    beside = Path(sys.executable).parent / "piper"
    return str(beside) if beside.is_file() else shutil.which("piper")


def _passed_on(args: argparse.Namespace) -> list[str]:
    """Our config and overrides, so `say` runs as configured."""
    passed = ["--config", args.config] if args.config else []
    for item in args.overrides:
        passed += ["--set", item]
    return passed


def _run(cmd: list[str], stdin: str | None, out: Path) -> tuple[float, float, float]:
    """`(wall seconds, CPU seconds, peak RSS MB)` of one run; the WAV it wrote must hold audio."""
    out.unlink(missing_ok=True)
    with tempfile.TemporaryFile("w+") as errors:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=errors, text=True)
        killer = threading.Timer(TIMEOUT_S, proc.kill)  # bounds the wait below
        killer.start()
        try:
            if proc.stdin is not None:
                proc.stdin.write(stdin or "")
                proc.stdin.close()
            # wait4, not wait: it returns this child's own peak RSS (ru_maxrss, KiB on Linux).
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(cmd[0]).name} {' '.join(cmd[1:4])}: exit {proc.returncode}: "
                               f"{errors.read().strip()[-300:]}")
    with wave.open(str(out), "rb") as wav:
        if wav.getnframes() < wav.getframerate() // 10:
            raise RuntimeError(f"{out.name}: less than 0.1 s of audio")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
