"""Local TTS: time to first audio, total time and RTF, ours vs piper-tts on the same voice.

The peer is piper-tts 1.8.0, what wyoming-piper 2.5.2 runs. It is GPL-3.0, so
edge-speech never imports it: it runs from the peers' environment (the one
`bench wyoming` builds) as its own command-line program, `python -m piper
--output-raw --debug`, fed one text per line on stdin. Each text is followed by
a line of "." that phonemizes to nothing; piper logs that line only once the
text's audio is all written (one sentence at a time, flushed), so the log line
marks the end of the text and the first bytes on stdout its first audio. Our
voice runs in this process, as piper-tts 1.2.0 (MIT) does where it is installed
(Python < 3.12), a second column. Timed runs are interleaved, median of
`--repeats`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import selectors
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.loopback import stop_process
from benchmarks.peers import peers_python
from benchmarks.report import emit, machine, median
from edge_agent.commands.context import Context
from edge_agent.errors import UsageError
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

PEER = "piper-tts"
END_MARK = "."
"""A line piper phonemizes to nothing (no audio): its debug log line says the text before it is done."""
PEER_TIMEOUT_S = 120.0
"""Longest wait for the peer to load and speak one text."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per text (median)")
    parser.add_argument("--no-reference", action="store_true", help="skip both piper-tts versions")
    parser.add_argument("--pause", type=float, default=PAUSE_S, metavar="SECONDS",
                        help=f"idle time before every timed run (default {PAUSE_S})")
    parser.add_argument("--peers-venv", type=Path, default=None,
                        help="virtual environment with piper-tts 1.8.0 (default: <cache>/bench-peers/venv, "
                             "built on first use as `bench wyoming` builds it)")


PAUSE_S = 0.1
"""Default idle time before every timed run. piper-tts leaves onnxruntime's threads
spinning after its run ends (its sessions allow spinning and never stop it), and
they take a core from whatever runs next: measured here, our short text took
126 ms right after a piper-tts run, 117 ms 10 ms later, 100 ms from 50 ms on, and
the same 97-109 ms at any gap after a run of ours. Every side gets the same pause,
so each starts on idle cores, as an announcement does on an idle device."""


Timing = tuple[float, float, int]
"""(first audio s, total s, samples)."""


def _time_stream(
    stream: Callable[[], Iterator[Any]], count: Callable[[Any], int], pause_s: float = 0.0
) -> Timing:
    time.sleep(pause_s)
    started = time.perf_counter()
    first = None
    samples = 0
    for item in stream():
        if first is None:
            first = time.perf_counter() - started
        samples += count(item)
    return first or 0.0, time.perf_counter() - started, samples


class PiperCli:
    """piper-tts's own command line in another environment: a text per line in, raw s16le audio out."""

    def __init__(self, python: Path, model: Path, config: Path) -> None:
        self.version = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('piper-tts'))"],
            capture_output=True, text=True, check=False, timeout=60).stdout.strip()
        if not self.version:
            raise UsageError(f"piper-tts is not installed in {python.parent.parent}")
        self.proc = subprocess.Popen(
            [str(python), "-m", "piper", "-m", str(model), "-c", str(config), "--output-raw", "--debug"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self._stdin = self.proc.stdin
        self._audio, self._log = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        self._select = selectors.DefaultSelector()
        self._select.register(self._audio, selectors.EVENT_READ)
        self._select.register(self._log, selectors.EVENT_READ)
        self._logged = b""
        self._mark = f"text={END_MARK}, phonemes=".encode()

    @property
    def name(self) -> str:
        return f"{PEER} {self.version}"

    def synthesize(self, text: str, pause_s: float = 0.0) -> Timing:
        """One text, timed from the moment it is written to the moment piper moves past it."""
        time.sleep(pause_s)
        started = time.perf_counter()
        self._stdin.write(f"{' '.join(text.split())}\n{END_MARK}\n".encode())
        self._stdin.flush()
        first = ended = None
        size = 0
        deadline = started + PEER_TIMEOUT_S
        while ended is None:
            ready = self._select.select(max(0.0, deadline - time.perf_counter()))
            if not ready:
                raise UsageError(f"{self.name} spoke nothing for {PEER_TIMEOUT_S:g} s")
            for key, _ in ready:
                got = self._read(key.fd)
                if key.fd == self._audio:
                    first = first if first is not None else time.perf_counter() - started
                    size += got
                elif self._mark in self._logged:
                    ended = time.perf_counter() - started
                    self._logged = self._logged[self._logged.index(self._mark) + len(self._mark):]
        # Each sentence's audio is flushed before the mark is logged: the rest is already in the pipe.
        while any(key.fd == self._audio for key, _ in self._select.select(0)):
            size += self._read(self._audio)
        return (ended if first is None else first), ended, size // 2

    def _read(self, fd: int) -> int:
        data = os.read(fd, 1 << 16)
        if not data:
            tail = self._logged.decode(errors="replace").strip().splitlines()[-3:]
            raise UsageError(f"{self.name} exited: {' / '.join(tail)}")
        if fd == self._log:
            self._logged = (self._logged + data)[-4096:]
        return len(data)

    def close(self) -> None:
        self._stdin.close()
        stop_process(self.proc, grace_s=10)
        self._select.close()


def _peer(ctx: Context, args: argparse.Namespace, voice_id: str) -> PiperCli:
    files = ctx.store.require(voice_id)
    model = files.entry.files[0].name
    return PiperCli(peers_python(ctx, args), files.path(model), files.path(f"{model}.json"))


def _piper_1_2(ctx: Context, voice_id: str) -> Any:
    """piper-tts 1.2.0 in this process, if that is the version installed here (never a GPL one)."""
    try:
        if not importlib.metadata.version("piper-tts").startswith("1.2."):
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    from piper import PiperVoice

    files = ctx.store.require(voice_id)
    model = files.entry.files[0].name
    return PiperVoice.load(str(files.path(model)), str(files.path(f"{model}.json")))


def run(ctx: Context, args: argparse.Namespace) -> int:
    settings = ctx.settings
    voice_id = settings.tts.voice
    voice = VoiceRegistry(ctx.store, settings.tts).get(voice_id)
    old = None if args.no_reference else _piper_1_2(ctx, voice_id)
    peer = None if args.no_reference else _peer(ctx, args, voice_id)
    try:
        per_text = _measure(voice, peer, old, args)
    finally:
        if peer is not None:
            peer.close()
        voice.close()
    result = {"voice": voice_id, "threads": settings.tts.threads, "repeats": args.repeats,
              "pause_s": args.pause, "load": os.getloadavg()[0], "machine": machine(),
              **_figures(per_text, peer.name if peer else None, old is not None)}
    emit(result, _lines(result), args.json)
    return 0


def _measure(voice: Any, peer: PiperCli | None, old: Any,
             args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Medians per text: `ttfa`/`total` ours, `ref_...` the peer's, `ref12_...` piper-tts 1.2.0's."""
    def ours(text: str, pause: float) -> Timing:
        return _time_stream(lambda: synthesize(voice, text), lambda c: len(c.samples), pause)

    sides: dict[str, Callable[[str, float], Timing]] = {"": ours}
    if peer is not None:
        sides["ref_"] = peer.synthesize
    if old is not None:
        sides["ref12_"] = lambda text, pause: _time_stream(lambda: iter(old.synthesize_stream_raw(text)),
                                                           lambda b: len(b) // 2, pause)
    per_text: dict[str, dict[str, float]] = {}
    for name, text in TEXTS.items():
        for side in sides.values():  # warm-up
            side(text, 0.0)
        runs: dict[str, list[float]] = {f"{s}{k}": [] for s in sides for k in ("ttfa", "total")}
        audio_s = 0.0
        for rep in range(args.repeats):  # interleaved, each side first in turn, so drift hits all alike
            order = list(sides)[rep % len(sides):] + list(sides)[:rep % len(sides)]
            for prefix in order:
                ttfa, total, samples = sides[prefix](text, args.pause)
                runs[f"{prefix}ttfa"].append(ttfa)
                runs[f"{prefix}total"].append(total)
                if not prefix:
                    audio_s = samples / voice.sample_rate
        per_text[name] = {k: median(v) for k, v in runs.items()} | {"audio_s": audio_s}
    return per_text


def _figures(per_text: dict[str, dict[str, float]], peer: str | None, old: bool) -> dict[str, Any]:
    """Totals over the texts (first audio averaged) and the ratios, ours over each reference's."""
    def summed(key: str) -> float:
        return sum(t[key] for t in per_text.values())

    ttfa, total, audio = summed("ttfa") / len(per_text), summed("total"), summed("audio_s")
    result: dict[str, Any] = {
        "ttfa_s": ttfa, "total_s": total, "rtf": total / audio, "texts": per_text,
        "reference": peer, "reference_total_s": None, "reference_ttfa_s": None, "reference_rtf": None,
        "ratio": None, "ttfa_ratio": None, "reference_1_2": None,
    }
    if peer is not None:
        ref_total, ref_ttfa = summed("ref_total"), summed("ref_ttfa") / len(per_text)
        result |= {"reference_total_s": ref_total, "reference_ttfa_s": ref_ttfa,
                   "reference_rtf": ref_total / audio,
                   "ratio": total / ref_total, "ttfa_ratio": ttfa / ref_ttfa}
    if old:
        old_total, old_ttfa = summed("ref12_total"), summed("ref12_ttfa") / len(per_text)
        result["reference_1_2"] = {"name": f"{PEER} 1.2.0", "total_s": old_total, "ttfa_s": old_ttfa,
                                   "ratio": total / old_total, "ttfa_ratio": ttfa / old_ttfa}
    return result


def _lines(r: dict[str, Any]) -> list[str]:
    lines = [f"voice {r['voice']}, {r['threads']} threads, median of {r['repeats']} runs, "
             f"{r['pause_s']:g} s idle before each, load {r['load']:.2f}"]
    columns = [("ours", "")] + ([(r["reference"], "ref_")] if r["reference"] else []) + (
        [(r["reference_1_2"]["name"], "ref12_")] if r["reference_1_2"] else [])
    for name, t in r["texts"].items():
        cells = [f"{label}: {1000 * t[p + 'ttfa']:6.1f} / {1000 * t[p + 'total']:6.1f} ms"
                 for label, p in columns]
        lines.append(f"  {name:<11} first audio / total  {' | '.join(cells)}  ({t['audio_s']:.2f} s audio)")
    if r["reference"]:
        lines.append(f"vs {r['reference']}: ratio (total) {r['ratio']:.3f}, "
                     f"ttfa_ratio {r['ttfa_ratio']:.3f}; "
                     f"RTF ours {r['rtf']:.3f}, theirs {r['reference_rtf']:.3f}")
    else:
        lines.append(f"RTF {r['rtf']:.3f} (no reference)")
    if r["reference_1_2"]:
        old = r["reference_1_2"]
        lines.append(f"vs {old['name']}: ratio (total) {old['ratio']:.3f}, "
                     f"ttfa_ratio {old['ttfa_ratio']:.3f}")
    return lines
