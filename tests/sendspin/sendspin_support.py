"""A real aiosendspin server in-process on loopback, and the player's output read back as a timeline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiosendspin.noise.keys import Identity
from aiosendspin.noise.trust_store import InMemoryServerPairingStore
from aiosendspin.server import AudioFormat, SendspinServer

from edge_agent.audio.sinks import Sink, WavSink
from edge_agent.audio.wav import read_wav
from edge_agent.sendspin.player import SendspinPlayer, now_us
from edge_agent.sendspin.settings import SendspinSettings

RATE = 48000
BLOCK = RATE // 50  # 20 ms per commit, as Music Assistant sends


async def until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """The first truthy `predicate()`, polled on the loop; AssertionError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


def wav_opener(out_dir: Path) -> Callable[[int, str], Sink]:
    """The `--out-dir` sink: `<out_dir>/<segment>.wav`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return lambda rate, name: WavSink(out_dir / f"{name}.wav", rate)


def make_player(tmp: Path, name: str, **settings: Any) -> SendspinPlayer:
    fields = {"enabled": True, "host": "127.0.0.1", "port": 0, "zeroconf": False, **settings}
    return SendspinPlayer(SendspinSettings(**fields), name, wav_opener(tmp / name / "out"),
                          tmp / name / "state")


class MusicServer:
    """Music Assistant's side: dials players, approves them, streams PCM to a group."""

    def __init__(self, name: str = "test-server") -> None:
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

    async def stream(self, clients: list[Any], source: np.ndarray, *, lead_s: float = 0.5,
                     on_block: Callable[[int], Any] | None = None) -> tuple[int, Any]:
        """Play mono `source` (as stereo 16-bit at `RATE`) to `clients` grouped; returns the local
        µs the stream started and the stream. `on_block(i)` may stop it early (returns True)."""
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

    samples: np.ndarray
    start_us: int
    rate: int

    def time_us(self, index: float) -> float:
        return self.start_us + index * 1e6 / self.rate


def heard(player: SendspinPlayer, out_dir: Path) -> list[Heard]:
    return [Heard(read_wav(out_dir / f"{seg.name}.wav").samples, seg.start_us, seg.rate)
            for seg in player.playout.stats.segments]


def locate(haystack: np.ndarray, needle: np.ndarray) -> tuple[int, float]:
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


def place(h: Heard, source: np.ndarray, piece_s: float = 0.5) -> Placement:
    """Find a piece of the output's music (past its first fade-in block) in the source."""
    loud = np.nonzero(np.abs(h.samples) > 1e-3)[0]
    assert len(loud), "the output holds no audio"
    out = int(loud[0]) + round(0.03 * h.rate)
    piece = h.samples[out:out + round(piece_s * h.rate)].astype(np.float64)
    src, peak = locate(source.astype(np.float64), piece)
    return Placement(out, src, peak)


def noise(seconds: float, seed: int, level: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(seed).uniform(-level, level, round(seconds * RATE))).astype(np.float32)


def tone(seconds: float, level: float = 0.5, freq: float = 440.0) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (level * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def rms_at(h: Heard, t_us: float, span_s: float = 0.05) -> float:
    """RMS of the output over `span_s` from local time `t_us`."""
    i = round((t_us - h.start_us) * h.rate / 1e6)
    part = h.samples[max(0, i):max(0, i) + round(span_s * h.rate)]
    return float(np.sqrt(np.mean(part.astype(np.float64) ** 2))) if len(part) else 0.0
