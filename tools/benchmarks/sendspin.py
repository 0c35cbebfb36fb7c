"""Sendspin: how soon a stream plays and how close several players play it, from their output timelines.

A real `aiosendspin` server runs in this process on loopback as Music Assistant would: it
dials each player (the device's `edge_agent.sendspin.player`, writing its output to WAV
files), approves it, groups them and streams seeded noise as 48 kHz stereo PCM. Each
player's output is one contiguous timeline (sample k of a segment plays at the segment's
start plus k / rate on the local clock), so where the noise lies in each file says when
every source sample played. Reported per round: the first sample's delay after the server
started the stream, and the spread between the players of the time one common sample played.
On one machine the players share a clock: the spread is the clock filter's and the
placement's error, not two sound cards'. Needs Python 3.12+ with `aiosendspin[server]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.report import emit, machine, median
from edge_agent.audio.sinks import Sink, WavSink
from edge_agent.audio.wav import read_wav
from edge_agent.commands.context import Context
from edge_agent.errors import UsageError
from edge_agent.sendspin.player import SendspinPlayer, now_us, sendspin_missing
from edge_agent.sendspin.settings import SendspinSettings

RATE = 48000
BLOCK = RATE // 50
"""20 ms per commit, as Music Assistant sends."""

Audio = npt.NDArray[np.float32]


async def until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """The first truthy `predicate()`, polled on the loop; `TimeoutError` naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


def wav_opener(out_dir: Path) -> Callable[[int, str], Sink]:
    """The `--out-dir` sink: `<out_dir>/<segment>.wav`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return lambda rate, name: WavSink(out_dir / f"{name}.wav", rate)


def make_player(tmp: Path, name: str, **settings: Any) -> SendspinPlayer:
    """A player on loopback (a free port, no advertisement) writing to `<tmp>/<name>/out`."""
    fields = {"enabled": True, "host": "127.0.0.1", "port": 0, "zeroconf": False, **settings}
    return SendspinPlayer(SendspinSettings(**fields), name, wav_opener(tmp / name / "out"),
                          tmp / name / "state")


class MusicServer:
    """Music Assistant's side: dials players, approves them, streams PCM to a group."""

    def __init__(self, name: str = "bench-server") -> None:
        from aiosendspin.noise.keys import Identity
        from aiosendspin.noise.trust_store import InMemoryServerPairingStore
        from aiosendspin.server import SendspinServer

        self.server = SendspinServer(asyncio.get_running_loop(), Identity.generate(), name,
                                     pairing_store=InMemoryServerPairingStore())

    async def join(self, player: SendspinPlayer) -> Any:
        """Connect to `player` (as after discovering it) and approve it; its server-side client."""
        await asyncio.wait_for(self.server.connect_to_client_and_wait(
            f"ws://127.0.0.1:{player.port}{player.settings.path}"), 10)
        client = await until(lambda: self.server.get_client(player.client_id or ""), 10, "the client")
        await self.server.trust_unpaired(client.client_id)
        await until(lambda: client.roles_by_family("player"), 10, "the player role")
        return client

    async def stream(self, clients: list[Any], source: Audio, *, lead_s: float = 0.5,
                     on_block: Callable[[int], Awaitable[bool]] | None = None) -> tuple[int, Any]:
        """Play mono `source` (as stereo 16-bit at `RATE`) to `clients` grouped; the local µs the
        stream started and the stream. `on_block(i)` may stop it early (returns True)."""
        from aiosendspin.server import AudioFormat

        group = clients[0].group
        for other in clients[1:]:
            await group.add_client(other)
        stream = group.start_stream()
        started = now_us()
        fmt = AudioFormat(RATE, 16, 2)
        for i in range(0, len(source) - BLOCK + 1, BLOCK):
            if on_block is not None and await on_block(i // BLOCK):
                break
            block = np.round(np.clip(source[i:i + BLOCK], -1, 1) * 32767).astype("<i2")
            stream.prepare_audio(np.repeat(block[:, None], 2, axis=1).tobytes(), fmt)
            await stream.commit_audio()
            await stream.sleep_to_limit_buffer(round(lead_s * 1e6))
        return started, stream

    async def close(self) -> None:
        await self.server.close()


@dataclass
class Heard:
    """One output segment read back: sample k played at `start_us + k / rate` (local clock)."""

    samples: Audio
    start_us: int
    rate: int

    def time_us(self, index: float) -> float:
        return self.start_us + index * 1e6 / self.rate

    def first_sound(self) -> int:
        """Index of the first audible sample."""
        loud = np.nonzero(np.abs(self.samples) > 1e-3)[0]
        if not len(loud):
            raise AssertionError("the output holds no audio")
        return int(loud[0])


def heard(player: SendspinPlayer, out_dir: Path) -> list[Heard]:
    """Every output segment `player` wrote to `out_dir`, in order."""
    return [Heard(read_wav(out_dir / f"{seg.name}.wav").samples, seg.start_us, seg.rate)
            for seg in player.playout.stats.segments]


def locate(haystack: Audio, needle: Audio) -> tuple[int, float]:
    """Where `needle` starts in `haystack` (cross-correlation) and the normalised peak (1: exact)."""
    n = len(haystack) + len(needle)
    size = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(haystack, size) * np.conj(np.fft.rfft(needle, size)), size)
    at = int(np.argmax(corr[:len(haystack)]))
    window = haystack[at:at + len(needle)]
    if len(window) < len(needle):
        window = np.pad(window, (0, len(needle) - len(window)))
    peak = float(np.dot(window, needle) / (np.linalg.norm(window) * np.linalg.norm(needle) + 1e-12))
    return at, peak


@dataclass
class Placement:
    """Where the source is on an output timeline: `source[src + k]` is `output[out + k]`."""

    out: int
    src: int
    peak: float
    """Normalised correlation of the piece found (1: exact)."""

    def source_time_us(self, h: Heard, src_index: int) -> float:
        """Local time at which source sample `src_index` played."""
        return h.time_us(self.out + src_index - self.src)


def place(h: Heard, source: Audio, piece_s: float = 0.5) -> Placement:
    """Find a piece of the output's music (past its first fade-in block) in the source."""
    out = h.first_sound() + round(0.03 * h.rate)
    piece = h.samples[out:out + round(piece_s * h.rate)]
    src, peak = locate(source, piece)
    return Placement(out, src, peak)


def noise(seconds: float, seed: int, level: float = 0.3) -> Audio:
    return np.random.default_rng(seed).uniform(-level, level, round(seconds * RATE)).astype(np.float32)


def tone(seconds: float, level: float = 0.5, freq: float = 440.0) -> Audio:
    t = np.arange(round(seconds * RATE)) / RATE
    return (level * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def rms_at(h: Heard, t_us: float, span_s: float = 0.05) -> float:
    """RMS of the output over `span_s` from local time `t_us`."""
    i = max(0, round((t_us - h.start_us) * h.rate / 1e6))
    part = h.samples[i:i + round(span_s * h.rate)]
    return float(np.sqrt(np.mean(part.astype(np.float64) ** 2))) if len(part) else 0.0


# -- the benchmark ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--players", type=int, default=2, help="players in the group (default 2)")
    parser.add_argument("--seconds", type=float, default=5.0, help="music per round (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="streams, each to fresh players (default 3)")


def run(ctx: Context, args: argparse.Namespace) -> int:
    if args.players < 1 or args.rounds < 1 or not 2.0 <= args.seconds <= 600.0:
        raise UsageError("--players and --rounds must be at least 1, --seconds 2..600")
    missing = sendspin_missing()
    if missing is not None:
        raise UsageError(missing.replace("; the music player is off", ""))
    try:
        import av  # noqa: F401
    except ImportError:
        raise UsageError("the bench's Sendspin server needs PyAV: "
                         "pip install 'aiosendspin[server]'") from None
    rounds = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="edge-bench-sendspin-") as tmp:
            rounds.append(asyncio.run(_round(Path(tmp), args.players, args.seconds, seed=i)))
    firsts = [f for r in rounds for f in r["first_audio_s"]]
    spreads = [r["spread_ms"] for r in rounds]
    result: dict[str, Any] = {
        "players": args.players, "seconds": args.seconds, "rounds": rounds,
        "first_audio_s_median": median(firsts), "first_audio_s_max": max(firsts),
        "spread_ms_median": median(spreads), "spread_ms_max": max(spreads),
        "resyncs": sum(r["resyncs"] for r in rounds), "machine": machine(), "load": os.getloadavg()}
    lines = [
        f"Sendspin, {args.players} players, {args.rounds} rounds of {args.seconds:g} s (load "
        f"{result['load'][0]:.1f}):",
        f"  server starts the stream -> first sample out: median {result['first_audio_s_median']:.3f} s, "
        f"max {result['first_audio_s_max']:.3f} s (goal: under 1 s)",
        f"  one sample across the players: median {result['spread_ms_median']:.3f} ms apart, max "
        f"{result['spread_ms_max']:.3f} ms (goal: under 20 ms)",
        f"  output moved to the clock {result['resyncs']} times",
    ]
    emit(result, lines, args.json)
    return 0


async def _round(tmp: Path, count: int, seconds: float, seed: int) -> dict[str, Any]:
    source = noise(seconds, seed=seed)
    players = [make_player(tmp, f"player{i}") for i in range(count)]
    for player in players:
        await player.start()
    music = MusicServer()
    try:
        clients = [await music.join(player) for player in players]
        started, stream = await music.stream(clients, source)
        await until(lambda: all(p.playout.stats.blocks * 0.02 > seconds + 0.5 for p in players),
                    seconds + 30, "every player played it out")
        stream.stop()
    finally:
        await music.close()
        for player in players:
            await player.stop()
    outs = [heard(player, tmp / player.name / "out")[0] for player in players]
    placed = [place(out, source) for out in outs]
    worst = min(p.peak for p in placed)
    if worst < 0.999:
        raise AssertionError(f"a player's output is not the stream (correlation {worst:.3f})")
    common = max(p.src for p in placed) + RATE // 2
    times = [p.source_time_us(out, common) for p, out in zip(placed, outs, strict=True)]
    return {"first_audio_s": [(out.time_us(out.first_sound()) - started) / 1e6 for out in outs],
            "spread_ms": (max(times) - min(times)) / 1000,
            "resyncs": sum(p.playout.stats.resyncs for p in players),
            "late_blocks": sum(p.playout.stats.late_blocks for p in players)}
