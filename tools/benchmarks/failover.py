"""Failover between two `edge-agent serve` processes, timed: a server killed, blackholed or busy.

The device side is the real router and server pool (the Piper voice on both servers,
so timings are about the failover, not the voice) with the local voice as last
resort, and a consumer that plays the audio in real time (it waits until the
audio it has taken would have finished), as a sound card does. Scenarios:

- `killed`: after the first sentence from server A, A is SIGKILLed (the connection is
  reset): the rest must come from server B;
- `blackholed`: A sits behind a TCP proxy that, after the first sentence, stops
  forwarding in both directions without closing anything (a cable pulled, a
  host frozen): the device only notices through its deadlines;
- `busy`: A's queue is full (another client holds its only slot), so A answers BUSY
  and the stream goes to B at once.

Reported per scenario: which engine spoke each sentence (each exactly once), the
time from the fault to the next sentence, and the audible gap (how long the
listener heard nothing beyond the sentence pause).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from benchmarks.report import emit, machine
from benchmarks.serveproc import ServeProcess
from edge_agent.audio.frames import AudioChunk
from edge_agent.commands.context import Context
from edge_agent.config import OffloadSettings
from edge_agent.offload.client.connection import OffloadClient
from edge_agent.offload.client.router import SynthRouter
from edge_agent.offload.client.servers import ListedOrder, ServerPool
from edge_agent.offload.wire.messages import Codec
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.registry import VoiceRegistry

TEXT = " ".join(f"This is sentence number {n} of the evening announcement." for n in
                ("one", "two", "three", "four", "five", "six"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--first-audio-deadline", type=float, default=None,
                        help="offload.first_audio_deadline_s (default: the config's)")
    parser.add_argument("--sentence-timeout", type=float, default=None,
                        help="offload.sentence_timeout_s (default: the config's)")


class Blackhole:
    """A TCP proxy to `port` that can stop forwarding, both ways, without closing anything."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="blackhole", daemon=True)
        self.thread.start()
        self.cut = False
        self.tasks: set[asyncio.Task[None]] = set()

        async def start() -> asyncio.Server:
            return await asyncio.start_server(self._accept, "127.0.0.1", 0)

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.uri = f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pipe(src, dst))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await src.read(65536):
                if self.cut:
                    continue  # swallowed: the peer's packets go nowhere, its socket stays open
                dst.write(data)
                await dst.drain()

    def blackhole(self) -> None:
        self.cut = True

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@dataclass
class Playback:
    """What a real-time sink would hear, sentence by sentence.

    Chunks are taken as soon as the router yields them (the daemon's synthesis
    thread runs ahead of the sink the same way), and a timeline of when each would
    be heard is kept: a sentence arriving after the audio before it has finished
    playing is a gap the listener hears.
    """

    engines: dict[int, list[str]] = field(default_factory=dict)
    lasts: dict[int, int] = field(default_factory=dict)
    """Sentence -> chunks that closed it (1 when it was spoken once)."""
    arrivals: dict[int, float] = field(default_factory=dict)
    heard_until: float = 0.0
    gaps: dict[int, float] = field(default_factory=dict)
    """Sentence -> silence before it beyond the sentence pause (seconds)."""

    def play(self, chunks: Iterator[AudioChunk], after_first: Callable[[], None]) -> None:
        for chunk in chunks:
            now = time.monotonic()
            self.engines.setdefault(chunk.sentence, []).append(chunk.engine)
            self.lasts[chunk.sentence] = self.lasts.get(chunk.sentence, 0) + int(chunk.last)
            if chunk.sentence not in self.arrivals:
                self.arrivals[chunk.sentence] = now
                if self.heard_until:
                    self.gaps[chunk.sentence] = max(0.0, now - self.heard_until)
            self.heard_until = max(self.heard_until, now) + len(chunk.samples) / chunk.sample_rate
            if chunk.sentence == 0 and chunk.last:
                after_first()

    def summary(self, fault_at: float, sentences: int) -> dict[str, Any]:
        after = sorted(t for t in self.arrivals.values() if t > fault_at)
        return {
            "engines": [self.engines.get(i, ["missing"])[0] for i in range(sentences)],
            "each_once": sorted(self.lasts) == list(range(sentences)) and all(
                n == 1 for n in self.lasts.values()) and all(len(set(e)) == 1 for e in self.engines.values()),
            "fault_to_next_sentence_s": round(after[0] - fault_at, 3) if after else None,
            "max_audible_gap_s": round(max(self.gaps.values(), default=0.0), 3),
        }


def _router(local: LocalSynthesizer, uris: list[str], psk: bytes, settings: OffloadSettings) -> SynthRouter:
    """A router whose pool lists `uris` in that order (ties go to the first) and is connected to all."""
    offload = replace(settings, server=uris[0], servers=tuple(uris[1:]), voice=local.settings.voice,
                      policy="auto")
    pool = ServerPool(offload, psk, rng=ListedOrder())
    pool.start()
    if not pool.wait_all(30):
        pool.close()
        raise RuntimeError(f"the device could not connect to {', '.join(uris)}")
    return SynthRouter(local, offload, pool)


def _requests(server: ServeProcess) -> int:
    return int(server.scrape().get("edge_serve_requests_total", 0))


@dataclass
class Bench:
    """Two or three serve processes, the device's local voice and its offload settings."""

    local: LocalSynthesizer
    offload: OffloadSettings
    psk: bytes
    started: list[ServeProcess] = field(default_factory=list)

    @property
    def voice(self) -> str:
        return self.local.settings.voice

    def serve(self, *extra: str) -> ServeProcess:
        server = ServeProcess(["--set", f"server.voices=[{self.voice}]", "--set", "server.metrics_port=0",
                               "--set", "server.workers=1", *extra], {"EDGE_OFFLOAD_PSK": self.psk.decode()})
        self.started.append(server)
        return server

    def close(self) -> None:
        for server in self.started:
            server.close()

    def fault_after_first(self, uris: list[str], inject: Callable[[], None],
                          sentences: int) -> dict[str, Any]:
        router = _router(self.local, uris, self.psk, self.offload)
        fault: list[float] = []

        def after_first() -> None:
            fault.append(time.monotonic())
            inject()

        playback = Playback()
        try:
            playback.play(router.stream(TEXT), after_first)
        finally:
            router.close()
        return playback.summary(fault[0], sentences)

    def killed(self, b: ServeProcess, sentences: int) -> dict[str, Any]:
        a = self.serve()
        before = _requests(b)
        result = self.fault_after_first([a.uri, b.uri], a.kill, sentences)
        return result | {"requests_b": _requests(b) - before}

    def blackholed(self, b: ServeProcess, sentences: int) -> dict[str, Any]:
        a = self.serve()
        proxy = Blackhole(a.port)
        before = _requests(b)
        try:
            result = self.fault_after_first([proxy.uri, b.uri], proxy.blackhole, sentences)
        finally:
            proxy.close()
        return result | {"requests_b": _requests(b) - before}

    def busy(self, b: ServeProcess) -> dict[str, Any]:
        a = self.serve("--set", "server.max_streams=1")
        holder = OffloadClient(OffloadSettings(server=a.uri), self.psk)
        holder.start()
        try:
            if not holder.wait_ready(30):
                raise RuntimeError(f"cannot connect to {a.uri}: {holder.last_error}")
            # A's only slot, held by another client's long stream that nobody reads.
            held = holder.open_stream(self.local.voices.get(self.voice).sentences(TEXT * 3), self.voice,
                                      Codec.PCM16)
            result = _first_audio(self.local, [a.uri, b.uri], self.psk, self.offload)
            direct = _first_audio(self.local, [b.uri], self.psk, self.offload)
            result["direct_to_b_s"] = direct["first_audio_s"]
            result["direct_engines"] = direct["engines"]
            held.cancel()
        finally:
            holder.close()
        result["busy_answers_a"] = int(a.scrape().get("edge_serve_busy_total", 0))
        return result


def run(ctx: Context, args: argparse.Namespace) -> int:
    import os

    load = os.getloadavg()[0]
    overrides: dict[str, Any] = {}
    if args.first_audio_deadline is not None:
        overrides["first_audio_deadline_s"] = args.first_audio_deadline
    if args.sentence_timeout is not None:
        overrides["sentence_timeout_s"] = args.sentence_timeout
    offload = replace(ctx.settings.offload, **overrides)
    tts = replace(ctx.settings.tts, sentence_silence_s=0.2)
    local = LocalSynthesizer(VoiceRegistry(ctx.store, tts), tts)
    bench = Bench(local, offload, secrets.token_hex(32).encode())
    try:
        sentences = len(bench.local.voices.get(tts.voice).sentences(TEXT))
        b = bench.serve()
        results = {"killed": bench.killed(b, sentences), "blackholed": bench.blackholed(b, sentences),
                   "busy": bench.busy(b)}
    finally:
        bench.close()
    result = {"sentences": sentences, "first_audio_deadline_s": offload.first_audio_deadline_s,
              "sentence_timeout_s": offload.sentence_timeout_s, "machine": machine(),
              "load_1m_before": round(load, 2), **results}
    emit(result, _lines(result, load), args.json)
    return 0


def _lines(result: dict[str, Any], load: float) -> list[str]:
    k, h, y = result["killed"], result["blackholed"], result["busy"]
    return [
        f"failover between two serve processes ({result['sentences']} sentences, load {load:.2f}; "
        f"deadlines: first audio {result['first_audio_deadline_s']:g} s, "
        f"sentence {result['sentence_timeout_s']:g} s)",
        f"killed:     engines {k['engines']}, each once: {k['each_once']}; fault -> next sentence "
        f"{k['fault_to_next_sentence_s']} s; longest audible gap {k['max_audible_gap_s']} s",
        f"blackholed: engines {h['engines']}, each once: {h['each_once']}; fault -> next sentence "
        f"{h['fault_to_next_sentence_s']} s; longest audible gap {h['max_audible_gap_s']} s",
        f"busy:       first audio {y['first_audio_s']} s via the busy server first "
        f"(straight to the other: {y['direct_to_b_s']} s); BUSY answers from A: {y['busy_answers_a']}; "
        f"engines {y['engines']}",
    ]


def _first_audio(local: LocalSynthesizer, uris: list[str], psk: bytes,
                 offload: OffloadSettings) -> dict[str, Any]:
    router = _router(local, uris, psk, offload)
    try:
        started = time.monotonic()
        stream = router.stream(TEXT)
        first = next(stream)
        elapsed = time.monotonic() - started
        engines = {first.sentence: first.engine}
        for chunk in stream:
            engines.setdefault(chunk.sentence, chunk.engine)
    finally:
        router.close()
    return {"first_audio_s": round(elapsed, 3), "engines": [engines[i] for i in sorted(engines)]}
