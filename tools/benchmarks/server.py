"""`bench server`: how many devices one `edge-agent serve` carries in real time, as a fleet sees it.

A real `serve` runs as a child process on loopback; each simulated device is a
real client (`ClientConnection`, our framing, its own connection) that asks for
a paragraph as one stream of sentences, all devices at the same moment. A
device plays its first chunk when it arrives, so chunk `k` is due at first
audio + the audio before it; a stream is *served in real time* when it ended
whole and every chunk arrived by its due time. Per concurrency the bench reports
those streams, first audio (p50/p95, request to first chunk), each stream's RTF
(request to last chunk over its audio), the host's CPU (all cores, and the
server process alone), GPU memory where `nvidia-smi` answers, and the voice's
model file (its variant) and providers as the server reports them.

Two server modes, side by side: *one at a time* (1 worker, every core's threads
on the one sentence) and *batched* (sentences from many streams that wait at
the same moment go out together, one worker per core, earliest playback
deadline first). The capacity of a mode is the most real-time streams at a
level whose p95 first audio is within `--first-audio-goal`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import emit, machine, percentile
from benchmarks.serveproc import ServeProcess
from edge_agent.commands.context import Context
from edge_agent.config import Endpoint
from edge_agent.errors import UsageError
from edge_agent.offload.client.connection import ClientConnection
from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.transport import OffloadError

SENTENCES = [
    "The washing machine in the basement has finished its cycle.",
    "Please move the clothes to the dryer before dinner.",
    "Dinner will be ready at half past seven in the kitchen.",
    "The front door is still open, so please close it.",
    "A parcel was delivered and is waiting on the porch.",
    "It is raining outside, so take an umbrella with you.",
    "The bus to the city centre leaves in ten minutes.",
    "Remember that the recycling goes out tonight.",
]
"""A paragraph is `--sentences` of these, starting at a different one for each device."""
PING_INTERVAL_S = 10.0
"""How often each simulated device pings its server while it waits (devices ping too)."""
MODES = {"one_at_a_time": "one at a time", "batched": "batched"}
VOICE_LINE = re.compile(r"voices: (.*?)(?:; (\d+) workers x (\d+) threads)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", default="1,2,4",
                        help="comma-separated numbers of devices asking at once (default 1,2,4; "
                             "a GPU host: 1,8,32,64,128)")
    parser.add_argument("--sentences", type=int, default=3,
                        help="sentences per device's paragraph (default 3: short on a small CPU)")
    parser.add_argument("--voice", help="server voice (default: kokoro-82m if fetched, else tts.voice)")
    parser.add_argument("--mode", choices=["both", *MODES], default="both")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                        help="batched mode's workers (default: CPU count); one at a time has 1")
    parser.add_argument("--providers", default="cpu",
                        help="the server's provider list, best first (runtime.server), e.g. cuda,cpu")
    parser.add_argument("--first-audio-goal", type=float, default=1.0,
                        help="p95 first audio (s) a level must keep to count towards capacity")
    parser.add_argument("--deadline-ms", type=int, default=None,
                        help="first-audio deadline each device sends, as a device sends "
                             "offload.first_audio_deadline_s (default: --first-audio-goal; 0: none); "
                             "a server that cannot meet it refuses the stream at once (BUSY)")
    parser.add_argument("--max-streams", type=int, default=None,
                        help="the server's server.max_streams (default: the largest level, so every "
                             "stream gets a slot); streams beyond it are refused at once, counted "
                             "apart as 'BUSY max_streams'")
    parser.add_argument("--timeout", type=float, default=300.0, help="longest one level may take (s)")


@dataclass
class _Device:
    """One device's stream, as its client saw it."""

    asked: float = 0.0
    rate: int = 0
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    """(arrival time, samples) of every AUDIO frame."""
    ended: bool = False
    error: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def sink(self, message: Any) -> None:
        now = time.perf_counter()
        if isinstance(message, m.Format):
            self.rate = message.sample_rate
        elif isinstance(message, m.Audio):
            self.arrivals.append((now, message.samples))
        elif isinstance(message, m.End):
            self.ended = not message.cancelled
            self.done.set()
        else:  # an ERROR frame, or the connection failing
            self.error = getattr(message, "name", "") or type(message).__name__
            if isinstance(message, m.Error) and "server.max_streams" in message.message:
                self.error += " max_streams"  # no slot left: apart from the refusals for a deadline
            self.done.set()

    @property
    def audio_s(self) -> float:
        return sum(n for _, n in self.arrivals) / self.rate if self.rate else 0.0

    @property
    def first_audio_s(self) -> float | None:
        return self.arrivals[0][0] - self.asked if self.arrivals else None

    @property
    def real_time(self) -> bool:
        """Whole, and every chunk arrived before the device would have played out what came before."""
        if not self.ended or not self.arrivals or not self.rate:
            return False
        start, played = self.arrivals[0][0], 0
        for when, samples in self.arrivals:
            if when > start + played / self.rate:
                return False
            played += samples
        return True

    @property
    def rtf(self) -> float | None:
        return (self.arrivals[-1][0] - self.asked) / self.audio_s if self.arrivals and self.audio_s else None


def paragraph(device: int, sentences: int) -> tuple[str, ...]:
    return tuple(SENTENCES[(device + i) % len(SENTENCES)] for i in range(sentences))


class CpuMeter:
    """Host CPU (all cores) and one process's CPU between `start` and `stop`, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._host = (0, 0)
        self._proc = 0.0
        self._wall = 0.0

    @staticmethod
    def _host_ticks() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields) - idle, sum(fields)

    def _proc_s(self) -> float:
        stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        self._host, self._proc, self._wall = self._host_ticks(), self._proc_s(), time.monotonic()

    def stop(self) -> dict[str, float]:
        busy, total = self._host_ticks()
        wall = time.monotonic() - self._wall
        host = (busy - self._host[0]) / max(total - self._host[1], 1)
        return {"host_cpu_pct": round(100 * host, 1),
                "server_cpu_cores": round((self._proc_s() - self._proc) / wall, 2) if wall > 0 else 0.0}


def gpu_memory_mib() -> float | None:
    """GPU memory in use (MiB, all processes) where `nvidia-smi` answers; None without a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return float(sum(float(x) for x in out.split()))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


async def _level(port: int, psk: bytes, voice: str, devices: int, *, sentences: int,
                 timeout: float, deadline_ms: int = 0) -> list[_Device]:
    endpoint = Endpoint("tcp", "127.0.0.1", port)
    conns = await asyncio.gather(*(ClientConnection.open(endpoint, psk, timeout=30) for _ in range(devices)))
    try:
        streams = [_Device() for _ in range(devices)]

        async def ask(conn: ClientConnection, device: _Device, n: int) -> None:
            device.asked = time.perf_counter()
            await conn.request(device.sink, paragraph(n, sentences), voice, m.Codec.PCM16,
                               deadline_ms=deadline_ms)

        async def keep_alive(conn: ClientConnection) -> None:
            # As a device does: a server closes a connection that sends nothing for its idle timeout.
            while True:
                await asyncio.sleep(PING_INTERVAL_S)
                with contextlib.suppress(OffloadError):
                    await conn.ping(PING_INTERVAL_S)

        pingers = [asyncio.create_task(keep_alive(c)) for c in conns]
        try:
            await asyncio.gather(*(ask(c, d, n) for n, (c, d) in enumerate(zip(conns, streams, strict=True))))
            await asyncio.wait_for(asyncio.gather(*(d.done.wait() for d in streams)), timeout)
        finally:
            for task in pingers:
                task.cancel()
            await asyncio.gather(*pingers, return_exceptions=True)
        return streams
    finally:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


def _summary(streams: list[_Device], cpu: dict[str, float], wall: float) -> dict[str, Any]:
    first = [s.first_audio_s for s in streams if s.first_audio_s is not None]
    rtf = [s.rtf for s in streams if s.rtf is not None]
    refused: dict[str, int] = {}
    for s in streams:
        if s.error:
            refused[s.error] = refused.get(s.error, 0) + 1
    return {
        "devices": len(streams),
        "real_time": sum(s.real_time for s in streams),
        "ended": sum(s.ended for s in streams),
        "errors": refused,
        "first_audio_p50_s": round(percentile(first, 50), 3) if first else None,
        "first_audio_p95_s": round(percentile(first, 95), 3) if first else None,
        "rtf_p50": round(percentile(rtf, 50), 3) if rtf else None,
        "rtf_p95": round(percentile(rtf, 95), 3) if rtf else None,
        "audio_s": round(sum(s.audio_s for s in streams), 2),
        "audio_s_per_s": round(sum(s.audio_s for s in streams) / wall, 2) if wall > 0 else 0.0,
        **cpu,
        "gpu_memory_mib": gpu_memory_mib(),
    }


def run_mode(mode: str, voice: str, levels: list[int], args: argparse.Namespace, *, psk: bytes,
             passed: dict[str, Any]) -> dict[str, Any]:
    cores = os.cpu_count() or 2
    deadline_ms = round(1000 * args.first_audio_goal) if args.deadline_ms is None else args.deadline_ms
    workers, threads = (1, cores) if mode == "one_at_a_time" else (args.workers, 1)
    most = max(levels)
    sets = {"server.voices": f"[{voice}]", "server.workers": workers, "server.threads": threads,
            "server.max_streams": args.max_streams or most, "server.max_connections": most + 8,
            "server.metrics_interval_s": 0, "runtime.server": f"[{args.providers}]",
            "server.shutdown_grace_s": 2, **passed}
    extra = [x for key, value in sets.items()
             for x in ((key, str(value)) if key.startswith("--") else ("--set", f"{key}={value}"))]
    proc = ServeProcess(extra, {"EDGE_OFFLOAD_PSK": psk.decode()}, timeout=300)
    try:
        described = VOICE_LINE.search(proc.line)
        result: dict[str, Any] = {"config": f"{workers} worker{'s' if workers > 1 else ''} x {threads} "
                                            f"thread{'s' if threads > 1 else ''}",
                                  "voices": described[1] if described else proc.line.strip(),
                                  "providers": args.providers, "levels": []}
        # Warm-up, untimed: the first runs of a session plan its memory.
        asyncio.run(_level(proc.port, psk, voice, 1, sentences=1, timeout=args.timeout))
        meter = CpuMeter(proc.proc.pid)
        for devices in levels:
            meter.start()
            started = time.monotonic()
            try:
                streams = asyncio.run(_level(proc.port, psk, voice, devices, sentences=args.sentences,
                                             timeout=args.timeout, deadline_ms=deadline_ms))
            except TimeoutError:
                result["levels"].append({"devices": devices, "timed_out": True, **meter.stop()})
                break
            result["levels"].append(_summary(streams, meter.stop(), time.monotonic() - started))
        good = [lv["real_time"] for lv in result["levels"]
                if not lv.get("timed_out") and lv["first_audio_p95_s"] is not None
                and lv["first_audio_p95_s"] <= args.first_audio_goal]
        result["capacity"] = max(good, default=0)
        return result
    finally:
        proc.terminate()
        proc.close()


def run(ctx: Context, args: argparse.Namespace) -> int:
    try:
        levels = sorted({int(x) for x in args.concurrency.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--concurrency: not a list of numbers: {args.concurrency!r}") from None
    if not levels or levels[0] < 1 or args.sentences < 1:
        raise UsageError("--concurrency needs numbers >= 1 and --sentences at least 1")
    if args.max_streams is not None and args.max_streams < 1:
        raise UsageError(f"--max-streams: {args.max_streams} is below 1")
    store = ctx.store
    voice = args.voice or ("kokoro-82m" if store.locate("kokoro-82m") else ctx.settings.tts.voice)
    store.require(voice.partition(":")[0])  # missing: says how to fetch it, before a server starts
    psk = secrets.token_hex(16).encode()
    load_before = os.getloadavg()
    modes = list(MODES) if args.mode == "both" else [args.mode]
    # The server reads the same model store and configuration as this command.
    passed: dict[str, Any] = {"models.cache_dir": ctx.settings.models.cache_dir}
    if getattr(args, "config", None):
        passed["--config"] = args.config
    result: dict[str, Any] = {"voice": voice, "sentences": args.sentences, "concurrency": levels,
                              "machine": machine(), "modes": {}}
    for mode in modes:
        result["modes"][mode] = run_mode(mode, voice, levels, args, psk=psk, passed=passed)
    result["loadavg_before"] = [round(x, 2) for x in load_before]
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    deadline = round(1000 * args.first_audio_goal) if args.deadline_ms is None else args.deadline_ms
    result["deadline_ms"] = deadline
    result["max_streams"] = args.max_streams or max(levels)
    lines = [f"bench server: {voice}, paragraphs of {args.sentences} sentences, PCM16, one connection per "
             f"device, first-audio deadline {deadline} ms, server.max_streams {result['max_streams']}, "
             f"{os.cpu_count()} CPUs, providers {args.providers}"]
    for mode, res in result["modes"].items():
        lines.append(f"{MODES[mode]} ({res['config']}; voices: {res['voices']}):")
        lines.append("  devices  real-time  ended  first audio p50/p95 s  RTF p50/p95  audio s/s  "
                     "host CPU %  server cores  GPU MiB")
        for lv in res["levels"]:
            if lv.get("timed_out"):
                lines.append(f"  {lv['devices']:>7}  timed out after {args.timeout:g} s")
                continue
            errors = f"  errors {lv['errors']}" if lv["errors"] else ""
            lines.append(f"  {lv['devices']:>7}  {lv['real_time']:>9}  {lv['ended']:>5}  "
                         f"{_num(lv['first_audio_p50_s'])} / {_num(lv['first_audio_p95_s'])}"
                         f"{'':>9}{_num(lv['rtf_p50'])} / {_num(lv['rtf_p95'])}  "
                         f"{lv['audio_s_per_s']:>9.2f}  "
                         f"{lv['host_cpu_pct']:>10.1f}  {lv['server_cpu_cores']:>12.2f}  "
                         f"{_num(lv['gpu_memory_mib'])}{errors}")
        lines.append(f"  capacity: {res['capacity']} real-time streams at p95 first audio <= "
                     f"{args.first_audio_goal:g} s")
    if len(result["modes"]) == 2:
        one = result["modes"]["one_at_a_time"]["capacity"]
        batched = result["modes"]["batched"]["capacity"]
        result["capacity_ratio"] = round(batched / one, 2) if one else None
        lines.append(f"batched / one at a time: {batched} / {one} real-time streams"
                     + (f" = {batched / one:.2f}x (goal >= 1.5x)" if one else ""))
    lines.append(f"load average before {result['loadavg_before'][0]:.2f}, after "
                 f"{result['loadavg_after'][0]:.2f} (1 min) on {os.cpu_count()} CPUs")
    emit(result, lines, args.json)
    return 0


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
