"""Wyoming servers side by side: ours against wyoming-piper and wyoming-faster-whisper.

One client, written on the `wyoming` library, drives every server the same way
Home Assistant does (a connection per request): TTS time to the first audio chunk
and to the end, for plain `synthesize` and for text streamed in as an LLM writes
it (`synthesize-start/chunk/stop`, a few words every `--word-ms`); ASR time from
`audio-stop` to `transcript`, and the WER of the transcripts. Each server is its
own process on loopback; requests alternate between the servers, median of
`--repeats`, each TTS request after `--pause` idle (piper-tts's threads spin on
after a request and slow whatever runs next; Home Assistant talks to one server).

The peers run from their own virtual environment (wyoming-piper pulls piper-tts,
GPL-3.0, which edge-speech never imports), built on first use with pip from PyPI:
wyoming-piper 2.5.2 on our voice's files, wyoming-faster-whisper 3.8.1 on the
CTranslate2 tiny.en weights our catalog fetches, int8, 2 threads, its own beam size
(5 on x86_64, 1 on ARM, where our devices run; `--peer-beam-size` sets it). Ours
decodes with `asr.beam_size` (`--set asr.beam_size=5` for a beam like the peer's).

`--wyoming-bench` also runs wyoming-bench (PyPI, MIT; installed into the peers'
environment), an independent benchmark of Wyoming servers, on the same running
servers: its TTS run (its own texts, plain and streamed) on ours and
wyoming-piper, its STT run on ours and wyoming-faster-whisper over the bench's
clips as its corpus. Its summary tables are printed as it prints them (and kept
in the JSON), so its own definitions of TTFT, RTF and WER apply to them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from benchmarks.clips import COMMANDS, Clip, clip_settings, clips_dir, make_clips
from benchmarks.loopback import stop_process
from benchmarks.peers import peers_python
from benchmarks.report import emit, machine, median
from benchmarks.tts import PAUSE_S, TEXTS
from edge_agent.asr.whisper import resolve_export_dir
from edge_agent.audio.wav import to_pcm16
from edge_agent.commands.context import Context
from edge_agent.errors import UsageError
from edge_agent.text.wer import wer
from edge_agent.tts.registry import VoiceRegistry

WYOMING_BENCH = "wyoming-bench==2026.10.0"
WYOMING_BENCH_TIMEOUT_S = 3600.0
GOAL = 0.5
"""Ours at most half the community server's time on each figure, at equal or better WER."""
TTS_GOAL = 0.8
"""... and at most 0.8 of wyoming-piper's on each TTS figure, on a quiet machine (load <= 2)."""


def goal(key: str) -> float:
    """The ratio `key` (one of `ratios`) should be at most."""
    return TTS_GOAL if key.startswith("tts_") else GOAL
ANSWER = (
    "Sure, here is the plan for tomorrow. The forecast says light rain in the morning, so take an "
    "umbrella when you leave at eight. Your dentist appointment is at two thirty in the afternoon. "
    "In the evening the recycling goes out, and the dishwasher should be emptied before dinner."
)
"""A long answer, as a language model would write it (streamed in word by word)."""
LISTENING = re.compile(r"wyoming server on tcp://([\d.]+):(\d+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5, help="timed TTS requests per text and server")
    parser.add_argument("--clips", type=int, default=10, help="commands per voice for ASR (max 10)")
    parser.add_argument("--word-ms", type=float, default=30.0, help="streamed text: ms between words")
    parser.add_argument("--pause", type=float, default=PAUSE_S, metavar="SECONDS",
                        help=f"idle time before every timed TTS request (default {PAUSE_S}, as bench tts)")
    parser.add_argument("--peers-venv", type=Path, default=None,
                        help="virtual environment of the peers (default: <cache>/bench-peers/venv)")
    parser.add_argument("--no-peers", action="store_true", help="only our server")
    parser.add_argument("--peer-beam-size", type=int, default=0,
                        help="wyoming-faster-whisper's beam (0: its own choice, 5 on x86_64 and 1 on ARM)")
    parser.add_argument("--wyoming-bench", action="store_true",
                        help=f"also run {WYOMING_BENCH} (PyPI) on the same servers and print its summaries")
    parser.add_argument("--wyoming-bench-rounds", type=int, default=3, help="wyoming-bench's --rounds")


@dataclass
class Tts:
    first: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    audio_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {"first_audio_s": median(self.first), "total_s": median(self.total),
                "audio_s": median(self.audio_s)}


class Server:
    """A Wyoming server process on loopback."""

    def __init__(self, name: str, argv: list[str], port: int | None,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.port = port if port is not None else self._announced_port()

    def _announced_port(self) -> int:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # returns with the first line, or at exit
        match = LISTENING.search(line)
        if not match:
            self.close()
            raise UsageError(f"{self.name} did not start: {line.strip() or self._stderr()}")
        return int(match[2])

    def _stderr(self) -> str:
        return self.proc.stderr.read()[-1500:] if self.proc.stderr else ""

    async def ready(self, timeout: float) -> None:
        """Until it answers `describe` (a model may take seconds to load), bounded by `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise UsageError(f"{self.name} exited: {self._stderr()}")
            try:
                async with AsyncTcpClient("127.0.0.1", self.port) as client:
                    await client.write_event(Describe().event())
                    if await asyncio.wait_for(client.read_event(), 10) is not None:
                        return
            except (OSError, TimeoutError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise UsageError(f"{self.name} not ready after {timeout:g} s")
            await asyncio.sleep(0.2)  # the next connection attempt; the process is still starting

    def close(self) -> None:
        stop_process(self.proc, grace_s=10)


async def synthesize(port: int, text: str, voice: str | None) -> tuple[float, float, float]:
    """Plain `synthesize`: (first chunk s, total s, audio s)."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        started = time.perf_counter()
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
        return await _audio(client, started, "audio-stop")


async def synthesize_streamed(port: int, text: str, voice: str | None,
                              word_s: float) -> tuple[float, float, float]:
    """Text streamed in word by word: timed from the first word sent."""
    words = text.split(" ")
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=voice)).event())
        started = time.perf_counter()
        reader = asyncio.create_task(_audio(client, started, "synthesize-stopped"))
        for n, word in enumerate(words):
            await client.write_event(SynthesizeChunk(text=word if n == 0 else " " + word).event())
            await asyncio.sleep(word_s)  # the pace of a language model writing the answer
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
        await client.write_event(SynthesizeStop().event())
        return await asyncio.wait_for(reader, 120)


async def _audio(client: AsyncTcpClient, started: float, last: str) -> tuple[float, float, float]:
    first = 0.0
    samples = 0
    rate = 1
    while True:
        event = await asyncio.wait_for(client.read_event(), 120)
        if event is None:
            raise UsageError("server closed the connection mid-answer")
        if event.type == "error":
            raise UsageError(f"server error: {event.data}")
        if AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            first = first or time.perf_counter() - started
            samples += chunk.samples
            rate = chunk.rate
        if event.type == last:
            return first, time.perf_counter() - started, samples / rate


async def transcribe(port: int, audio: Any) -> tuple[str, float]:
    """(text, seconds from audio-stop to transcript); the audio goes as fast as the socket takes it."""
    pcm = to_pcm16(audio)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for i in range(0, len(pcm), 2048):
            chunk = AudioChunk(rate=16000, width=2, channels=1, audio=pcm[i:i + 2048])
            await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        stopped = time.perf_counter()
        while True:
            event = await asyncio.wait_for(client.read_event(), 120)
            if event is None:
                raise UsageError("server closed the connection before the transcript")
            if Transcript.is_type(event.type):
                return Transcript.from_event(event).text, time.perf_counter() - stopped


def _start(ctx: Context, args: argparse.Namespace, free: Sequence[int]) -> dict[str, Server]:
    settings = ctx.settings
    export = resolve_export_dir(settings.asr, settings.models)
    ours = [sys.executable, "-m", "edge_agent", "wyoming", "--uri", "tcp://127.0.0.1:0",
            "--set", "wyoming.zeroconf=false", "--set", f"asr.model={export}",
            "--set", f"models.cache_dir={settings.models.cache_dir}"]
    if args.config:
        ours += ["--config", args.config]
    for item in args.overrides:  # the bench's own --set (asr.variant, tts.threads, ...) reach our server
        ours += ["--set", item]
    servers = {"ours": Server("edge-agent wyoming", ours, None)}
    if args.no_peers:
        return servers
    python = str(peers_python(ctx, args))
    voice = ctx.store.fetch(settings.tts.voice)
    ct2 = ctx.store.fetch("whisper-tiny.en")
    work = settings.models.cache_dir.parent / "bench-peers" / "data"
    work.mkdir(parents=True, exist_ok=True)
    servers["wyoming-piper"] = Server("wyoming-piper", [
        python, "-m", "wyoming_piper", "--uri", f"tcp://127.0.0.1:{free[0]}", "--voice", settings.tts.voice,
        "--data-dir", str(voice.path(f"{settings.tts.voice}.onnx").parent), "--download-dir", str(work),
        "--local-files-only"], free[0])
    servers["wyoming-faster-whisper"] = Server("wyoming-faster-whisper", [
        python, "-m", "wyoming_faster_whisper", "--uri", f"tcp://127.0.0.1:{free[1]}",
        "--model", str(ct2.path("model.bin").parent), "--data-dir", str(work), "--local-files-only",
        "--stt-library", "faster-whisper", "--compute-type", "int8", "--cpu-threads", "2",
        "--language", "en", "--beam-size", str(args.peer_beam_size)], free[1])
    return servers


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


async def _measure(servers: dict[str, Server], args: argparse.Namespace, clips: list[Clip],
                   voice: str) -> dict[str, Any]:
    for server in servers.values():
        await server.ready(180)
    tts_names: list[str] = [n for n in ("ours", "wyoming-piper") if n in servers]
    asr_names: list[str] = [n for n in ("ours", "wyoming-faster-whisper") if n in servers]
    texts = {"short": TEXTS["short"], "long_first": TEXTS["long_first"], "answer": ANSWER}
    plain: dict[str, dict[str, Tts]] = {n: {t: Tts() for t in texts} for n in tts_names}
    streamed: dict[str, Tts] = {n: Tts() for n in tts_names}
    for name in tts_names:  # warm-up: first requests load voices and caches
        await synthesize(servers[name].port, "Ready.", voice)
    for rep in range(args.repeats):
        order = tts_names if rep % 2 == 0 else tts_names[::-1]
        for key, text in texts.items():
            for name in order:
                await asyncio.sleep(args.pause)  # see benchmarks.tts.PAUSE_S: the peer's threads spin on
                first, total, audio = await synthesize(servers[name].port, text, voice)
                plain[name][key].first.append(first)
                plain[name][key].total.append(total)
                plain[name][key].audio_s.append(audio)
        for name in order:
            await asyncio.sleep(args.pause)
            first, total, audio = await synthesize_streamed(servers[name].port, ANSWER, voice,
                                                            args.word_ms / 1000)
            streamed[name].first.append(first)
            streamed[name].total.append(total)
            streamed[name].audio_s.append(audio)
    heard: dict[str, list[str]] = {n: [] for n in asr_names}
    latency: dict[str, list[float]] = {n: [] for n in asr_names}
    for name in asr_names:
        await transcribe(servers[name].port, clips[0].audio())
    for n, clip in enumerate(clips):
        samples = clip.audio()
        for name in (asr_names if n % 2 == 0 else asr_names[::-1]):
            text, seconds = await transcribe(servers[name].port, samples)
            heard[name].append(text)
            latency[name].append(seconds)
    refs = [c.text for c in clips]
    return {
        "tts": {n: {**{k: v.summary() for k, v in plain[n].items()}, "streamed": streamed[n].summary()}
                for n in tts_names},
        "asr": {n: {"latency_s": median(latency[n]), "wer": wer(refs, heard[n]), "heard": heard[n]}
                for n in asr_names},
    }


def run(ctx: Context, args: argparse.Namespace) -> int:
    settings = ctx.settings
    if not (resolve_export_dir(settings.asr, settings.models) / "manifest.json").is_file():
        raise UsageError("no Whisper export for asr.model (run `edge-export whisper` or set asr.model)")
    voice = VoiceRegistry(ctx.store, clip_settings(settings.tts)).get(settings.tts.voice)
    count = max(1, min(args.clips, len(COMMANDS)))
    clips = make_clips(clips_dir(settings.models.cache_dir), COMMANDS[:count], ["piper", "espeak"], voice)
    voice.close()
    servers = _start(ctx, args, _free_ports(2))
    try:
        measured = asyncio.run(_measure(servers, args, clips, settings.tts.voice))
        if args.wyoming_bench and not args.no_peers:
            measured["wyoming_bench"] = wyoming_bench(peers_python(ctx, args), servers, clips,
                                                      args.wyoming_bench_rounds)
    finally:
        for server in servers.values():
            server.close()
    result = {"subject": "wyoming", "machine": machine(), "load": os.getloadavg()[0],
              "repeats": args.repeats, "pause_s": args.pause, "clips": len(clips), "word_ms": args.word_ms,
              "beam_size": settings.asr.beam_size, "peer_beam_size": args.peer_beam_size, **measured,
              "ratios": ratios(measured)}
    result["goals"] = {k: v <= goal(k) for k, v in result["ratios"].items() if k != "wer_delta"}
    if "wer_delta" in result["ratios"]:
        result["goals"]["wer"] = result["ratios"]["wer_delta"] <= 0.0
    emit(result, lines(result), args.json)
    return 0


def ratios(m: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    tts, asr = m["tts"], m["asr"]
    if "wyoming-piper" in tts:
        for key in ("short", "long_first", "answer", "streamed"):
            for measure in ("first_audio_s", "total_s"):
                ours, theirs = tts["ours"][key][measure], tts["wyoming-piper"][key][measure]
                out[f"tts_{key}_{measure.removesuffix('_s')}"] = ours / theirs
    if "wyoming-faster-whisper" in asr:
        out["asr_latency"] = asr["ours"]["latency_s"] / asr["wyoming-faster-whisper"]["latency_s"]
        out["wer_delta"] = asr["ours"]["wer"] - asr["wyoming-faster-whisper"]["wer"]
    return out


def lines(r: dict[str, Any]) -> list[str]:
    out = [f"bench wyoming: {r['repeats']} repeats, {r['clips']} clips, load {r['load']:.2f}, "
           f"{r['pause_s']:g} s idle before each TTS request"]
    for name, figures in r["tts"].items():
        for key, f in figures.items():
            out.append(f"  tts {name:14s} {key:11s} first audio {1000 * f['first_audio_s']:7.1f} ms  "
                       f"total {1000 * f['total_s']:7.1f} ms  ({f['audio_s']:.1f} s of audio)")
    for name, f in r["asr"].items():
        out.append(f"  asr {name:22s} audio-stop -> transcript {1000 * f['latency_s']:7.1f} ms  "
                   f"WER {f['wer']:.3f}")
    for key, value in r["ratios"].items():
        met = "" if key == "wer_delta" else (
            f"  (goal <= {goal(key)}: {'met' if value <= goal(key) else 'missed'})")
        out.append(f"  {key:28s} {value:.3f}{met}")
    for kind, summary in r.get("wyoming_bench", {}).items():
        out.append(f"wyoming-bench {kind} (its summary):")
        out += [f"  {line}" for line in summary.splitlines()]
    return out


def wyoming_bench(python: Path, servers: dict[str, Server], clips: Sequence[Clip],
                  rounds: int) -> dict[str, str]:
    """wyoming-bench's TTS and STT summaries for the running servers (installed on first use)."""
    tool = python.parent / "wyoming-bench"
    if not tool.exists():
        print(f"installing {WYOMING_BENCH} into the peers' environment ...", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", WYOMING_BENCH], check=True)
    address = {name: f"127.0.0.1:{server.port}" for name, server in servers.items()}
    common = ["--rounds", str(rounds), "--warmup", "1"]
    with tempfile.TemporaryDirectory(prefix="wyoming-bench-corpus-") as corpus:
        for n, clip in enumerate(clips):  # its corpus layout: data_NN.wav beside data_NN.txt
            shutil.copy(clip.path, Path(corpus) / f"data_{n:02d}.wav")
            (Path(corpus) / f"data_{n:02d}.txt").write_text(clip.text + "\n", encoding="utf-8")
        runs = {"tts": [str(tool), "tts", address["ours"], address["wyoming-piper"], *common],
                "stt": [str(tool), "stt", address["ours"], address["wyoming-faster-whisper"],
                        "--corpus", corpus, *common]}
        return {kind: summary(_run_tool(argv)) for kind, argv in runs.items()}


def _run_tool(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=WYOMING_BENCH_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise UsageError(f"wyoming-bench did not finish within {WYOMING_BENCH_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise UsageError(f"wyoming-bench failed (exit {done.returncode}): {' / '.join(tail)}")
    return done.stdout


def summary(report: str) -> str:
    """The part of a wyoming-bench report after its 'Summary' heading (the whole report if none)."""
    lines = report.splitlines()
    for n, line in enumerate(lines):
        if line.startswith("Summary"):
            rest = lines[n + 1:]
            while rest and (not rest[0].strip() or set(rest[0].strip()) == {"="}):
                rest = rest[1:]
            return "\n".join(rest).rstrip()
    return report.rstrip()
