"""Offload: wire bytes vs Wyoming, server throughput batched vs one at a time, first audio local vs remote.

Everything runs on loopback in one process: a real `SynthServer` in a thread,
real clients over TCP. Ratios are measured side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.report import emit, machine, median
from edge_agent.commands.context import Context
from edge_agent.config import Endpoint, OffloadSettings, ServerSettings, TtsSettings
from edge_agent.models.store import ModelStore
from edge_agent.offload.client.connection import ClientConnection
from edge_agent.offload.client.router import SynthRouter
from edge_agent.offload.client.servers import ServerPool
from edge_agent.offload.server.synth_server import ServerThread
from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.codecs import available_codecs
from edge_agent.runtime.sessions import make_session
from edge_agent.tts import kokoro
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.piper import PiperVoice
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import Voice

WIRE_TEXT = (
    "The washing machine in the basement has finished its cycle. Please move the clothes to the dryer "
    "right away. Dinner will be ready at seven thirty. The front door is still open, so please close it."
)
BURST_TEXTS = [
    "The front door is open. Please close it.",
    "Dinner is ready. Come to the kitchen.",
    "The washing machine has finished. Move the clothes.",
    "A parcel was delivered. It is on the porch.",
    "The garage light is on. Turn it off tonight.",
    "It is raining outside. Take an umbrella.",
    "The bus leaves in ten minutes. Hurry up.",
    "Remember the recycling. It goes out tonight.",
]
"""Eight distinct two-sentence announcements: eight devices asking at once."""
WYOMING_SAMPLES_PER_CHUNK = 1024
"""wyoming-piper's default chunk size."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--voice", help="server voice for the throughput test "
                                        "(default: kokoro-82m if fetched, else tts.voice)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                        help="concurrent sentences in batched mode (default: CPU count)")
    parser.add_argument("--skip-throughput", action="store_true", help="only wire size and first audio")


@dataclass
class _Stream:
    messages: list[m.Message]
    bytes_in: int
    bytes_out: int
    first_audio_s: float
    total_s: float


async def _one_stream(conn: ClientConnection, sentences: tuple[str, ...], voice: str, codec: m.Codec,
                      rate: int = 0) -> _Stream:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    before_in, before_out = conn.conn.bytes_in, conn.conn.bytes_out
    started = time.perf_counter()
    first = 0.0
    await conn.request(queue.put_nowait, sentences, voice, codec, sample_rate=rate)
    messages: list[m.Message] = []
    while True:
        msg = await asyncio.wait_for(queue.get(), 300)
        if isinstance(msg, Exception):
            raise msg
        messages.append(msg)
        if isinstance(msg, m.Audio) and msg.last and not first:
            first = time.perf_counter() - started
        if isinstance(msg, m.End | m.Error):
            break
    if isinstance(messages[-1], m.Error):
        raise RuntimeError(f"server error: {messages[-1].message}")
    return _Stream(messages, conn.conn.bytes_in - before_in, conn.conn.bytes_out - before_out, first,
                   time.perf_counter() - started)


async def _connect(port: int, psk: bytes) -> ClientConnection:
    return await ClientConnection.open(Endpoint("tcp", "127.0.0.1", port), psk, timeout=10)


# -- bytes on the wire --------------------------------------------------------------


def _wyoming_bytes(text: str, pcm: bytes, rate: int) -> tuple[int, int] | None:
    """Bytes Wyoming's own writer spends on the same request and PCM; None if not installed."""
    try:
        from wyoming.audio import AudioChunk, AudioStart, AudioStop
        from wyoming.event import write_event
        from wyoming.tts import Synthesize
    except ImportError:
        return None
    buf = io.BytesIO()
    write_event(Synthesize(text=text).event(), buf)
    write_event(AudioStart(rate=rate, width=2, channels=1).event(), buf)
    step = WYOMING_SAMPLES_PER_CHUNK * 2
    chunks = 0
    for start in range(0, len(pcm), step):
        write_event(AudioChunk(rate=rate, width=2, channels=1, audio=pcm[start:start + step]).event(), buf)
        chunks += 1
    write_event(AudioStop().event(), buf)
    return len(buf.getvalue()), chunks


def _pcm_of(messages: list[m.Message]) -> bytes:
    return b"".join(msg.data for msg in messages if isinstance(msg, m.Audio))


def measure_wire(server: ServerThread, psk: bytes, voice: Voice) -> dict[str, Any]:
    sentences = tuple(voice.sentences(WIRE_TEXT))

    async def go() -> dict[str, _Stream]:
        conn = await _connect(server.port, psk)
        try:
            out = {"pcm16": await _one_stream(conn, sentences, voice.id, m.Codec.PCM16)}
            if m.Codec.OPUS in conn.info.codecs:
                out["opus"] = await _one_stream(conn, sentences, voice.id, m.Codec.OPUS)
            return out
        finally:
            await conn.close()

    streams = asyncio.run(go())
    pcm_stream = streams["pcm16"]
    end = pcm_stream.messages[-1]
    assert isinstance(end, m.End)
    audio_s = end.samples / voice.sample_rate
    result: dict[str, Any] = {"audio_s": audio_s, "voice": voice.id, "rate": voice.sample_rate}
    for name, stream in streams.items():
        result[f"{name}_bytes_per_s"] = (stream.bytes_in + stream.bytes_out) / audio_s
        frames = sum(isinstance(x, m.Audio) for x in stream.messages)
        result[f"{name}_audio_frames"] = frames
    reference = _wyoming_bytes(WIRE_TEXT, _pcm_of(pcm_stream.messages), voice.sample_rate)
    if reference is None:
        result |= {"wyoming_bytes_per_s": None}
        return result
    wyoming_bytes, chunks = reference
    pcm_bytes = end.samples * 2
    result |= {
        "wyoming_bytes_per_s": wyoming_bytes / audio_s,
        "wyoming_chunks": chunks,
        "wyoming_overhead_per_chunk": (wyoming_bytes - pcm_bytes) / chunks,
        "pcm16_ratio": result["pcm16_bytes_per_s"] * audio_s / wyoming_bytes,
    }
    if "opus_bytes_per_s" in result:
        result["opus_ratio"] = result["opus_bytes_per_s"] * audio_s / wyoming_bytes
    return result


# -- throughput ------------------------------------------------------------------------


def _server(voice: Voice, psk: bytes, workers: int, threads: int) -> ServerThread:
    settings = ServerSettings(host="127.0.0.1", port=0, voices=(voice.id,), workers=workers, threads=threads,
                              max_streams=64, metrics_interval_s=0, shutdown_grace_s=1)
    return ServerThread(settings, {voice.id: voice}, psk)


def _burst(server: ServerThread, psk: bytes, voice: Voice) -> dict[str, float]:
    """Eight devices, eight connections, eight requests at once; audio seconds per wall second."""

    async def go() -> tuple[float, list[_Stream]]:
        conns = [await _connect(server.port, psk) for _ in BURST_TEXTS]
        try:
            started = time.perf_counter()
            streams = await asyncio.gather(*(
                _one_stream(c, tuple(voice.sentences(t)), voice.id, m.Codec.PCM16)
                for c, t in zip(conns, BURST_TEXTS, strict=True)))
            return time.perf_counter() - started, list(streams)
        finally:
            for c in conns:
                await c.close()

    wall, streams = asyncio.run(go())
    audio = 0.0
    for s in streams:
        end = s.messages[-1]
        assert isinstance(end, m.End)
        audio += end.samples / voice.sample_rate
    ttfa = [s.first_audio_s for s in streams]
    snap = server.server.metrics.snapshot()
    return {"wall_s": wall, "audio_s": audio, "throughput": audio / wall, "ttfa_p50_s": median(ttfa),
            "ttfa_max_s": max(ttfa), "mean_batch": snap["mean_batch"], "rtf_p50": snap["rtf_p50"] or 0.0}


def _load(store: ModelStore, voice_id: str, threads: int, speaker: str) -> Voice:
    registry = VoiceRegistry(store, TtsSettings(threads=threads, idle_unload_s=0))
    registry.register_runtime("kokoro", kokoro.loader(store, speaker=speaker, threads=threads,
                                                      spin=threads > 1))
    voice = registry.get(voice_id)
    for _ in voice.synthesize_sentence("Warm up."):
        pass
    return voice


def measure_throughput(ctx: Context, psk: bytes, voice_id: str, workers: int, repeats: int) -> dict[str, Any]:
    cores = os.cpu_count() or 2
    speaker = ctx.settings.server.kokoro_speaker
    one_voice = _load(ctx.store, voice_id, cores, speaker)
    batch_voice = _load(ctx.store, voice_id, 1, speaker)
    runs: dict[str, list[dict[str, float]]] = {"one_at_a_time": [], "batched": []}
    for _ in range(repeats):  # interleaved, so load from other processes hits both alike
        modes = (("one_at_a_time", one_voice, 1, cores), ("batched", batch_voice, workers, 1))
        for mode, voice, w, t in modes:
            server = _server(voice, psk, w, t)
            try:
                runs[mode].append(_burst(server, psk, voice))
            finally:
                server.stop()
    summary: dict[str, Any] = {"voice": voice_id, "requests": len(BURST_TEXTS), "repeats": repeats,
                               "one_at_a_time_config": f"1 worker x {cores} threads",
                               "batched_config": f"{workers} workers x 1 thread"}
    for mode, values in runs.items():
        summary[mode] = {k: median([v[k] for v in values]) for k in values[0]}
    summary["speedup"] = summary["batched"]["throughput"] / summary["one_at_a_time"]["throughput"]
    return summary


def measure_model_batching(store: ModelStore, voice_id: str, threads: int, repeats: int) -> dict[str, Any]:
    """A padded batch of 8 through Piper's ONNX graph vs 8 single runs: does the model batch well?"""
    files = store.require(voice_id)
    model = files.entry.files[0].name
    voice = PiperVoice.load(voice_id, files.path(model), files.path(f"{model}.json"), threads=threads)
    session = make_session(files.path(model), threads)
    ids = [voice.phoneme_ids(t.split(". ")[0])[0] for t in BURST_TEXTS]
    scales = np.array([voice.config.noise_scale, voice.config.length_scale, voice.config.noise_w],
                      dtype=np.float32)

    def run(batch: list[list[int]]) -> None:
        width = max(map(len, batch))
        tokens = np.zeros((len(batch), width), dtype=np.int64)
        for i, row in enumerate(batch):
            tokens[i, :len(row)] = row
        session.run(None, {"input": tokens, "input_lengths": np.array([len(r) for r in batch]),
                           "scales": scales})

    run(ids[:2])
    single, batched = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        for row in ids:
            run([row])
        single.append(time.perf_counter() - started)
        started = time.perf_counter()
        run(ids)
        batched.append(time.perf_counter() - started)
    return {"voice": voice_id, "batch": len(ids), "sequential_s": median(single),
            "batched_s": median(batched), "speedup": median(single) / median(batched)}


# -- first audio --------------------------------------------------------------------------


def measure_first_audio(ctx: Context, server: ServerThread, psk: bytes, voice_ids: list[str],
                        repeats: int) -> dict[str, Any]:
    tts = ctx.settings.tts
    local = LocalSynthesizer(VoiceRegistry(ctx.store, tts), tts)

    def first_chunk(router: SynthRouter, voice: str | None) -> tuple[float, str]:
        started = time.perf_counter()
        stream = router.stream(WIRE_TEXT, voice)
        chunk = next(stream)
        elapsed = time.perf_counter() - started
        for _ in stream:  # drain: measure first audio only, but leave no stream half-read
            pass
        return elapsed, chunk.engine

    local_router = SynthRouter(local, OffloadSettings(policy="local"))
    first_chunk(local_router, None)  # load and warm the local voice
    result: dict[str, Any] = {"local_voice": tts.voice}
    times: dict[str, list[float]] = {"local": []}
    offload = OffloadSettings(server=server.uri, policy="remote", codec="opus", first_audio_deadline_s=60,
                              sentence_timeout_s=60)
    pool = ServerPool(offload, psk)
    pool.start()
    try:
        remote_router = SynthRouter(local, offload, pool)
        pool.wait_ready(10)
        for voice_id in voice_ids:
            first_chunk(remote_router, voice_id)
            times[f"remote_{voice_id}"] = []
        for _ in range(repeats):
            times["local"].append(first_chunk(local_router, None)[0])
            for voice_id in voice_ids:
                elapsed, engine = first_chunk(remote_router, voice_id)
                if engine != "remote":
                    raise RuntimeError(f"remote first audio fell back to {engine}")
                times[f"remote_{voice_id}"].append(elapsed)
    finally:
        pool.close()
    for name, values in times.items():
        result[f"{name}_s"] = median(values)
    return result


# -- the subject ------------------------------------------------------------------------------


def run(ctx: Context, args: argparse.Namespace) -> int:
    settings = ctx.settings
    psk = secrets.token_bytes(32)
    store = ctx.store
    load_before = os.getloadavg()[0]
    piper_id = settings.tts.voice
    piper = _load(store, piper_id, settings.tts.threads, settings.server.kokoro_speaker)
    heavy = args.voice or ("kokoro-82m" if store.locate("kokoro-82m") else piper_id)
    server_voices: dict[str, Voice] = {piper_id: piper}
    if heavy != piper_id:
        server_voices[heavy] = _load(store, heavy, settings.tts.threads, settings.server.kokoro_speaker)
    server = ServerThread(ServerSettings(host="127.0.0.1", port=0, voices=tuple(server_voices), workers=1,
                                         threads=settings.tts.threads, metrics_interval_s=0,
                                         shutdown_grace_s=1), server_voices, psk)
    try:
        wire = measure_wire(server, psk, piper)
        first = measure_first_audio(ctx, server, psk, list(server_voices), args.repeats)
    finally:
        server.stop()
    result: dict[str, Any] = {"wire": wire, "first_audio": first, "codecs": sorted(c.name for c in
                                                                                   available_codecs()),
                              "machine": machine()}
    lines = [f"wire: {wire['audio_s']:.2f} s of speech, {wire['voice']} at {wire['rate']} Hz"]
    if wire["wyoming_bytes_per_s"]:
        header = wire["wyoming_overhead_per_chunk"]
        lines.append(f"  Wyoming (1024-sample chunks, {header:.0f} B header each): "
                     f"{wire['wyoming_bytes_per_s']:.0f} B/s")
        lines.append(f"  ours PCM16: {wire['pcm16_bytes_per_s']:.0f} B/s (ratio {wire['pcm16_ratio']:.3f})")
        if "opus_ratio" in wire:
            lines.append(f"  ours Opus:  {wire['opus_bytes_per_s']:.0f} B/s (ratio {wire['opus_ratio']:.3f}; "
                         "goal <= 0.15)")
    lines.append(f"first audio (median of {args.repeats}): local {first['local_s'] * 1000:.0f} ms; " +
                 "; ".join(f"remote {v} {first[f'remote_{v}_s'] * 1000:.0f} ms" for v in server_voices))
    if not args.skip_throughput:
        throughput = measure_throughput(ctx, psk, heavy, args.workers, args.repeats)
        batching = measure_model_batching(store, piper_id, settings.tts.threads, args.repeats)
        result |= {"throughput": throughput, "model_batching": batching, "speedup": throughput["speedup"]}
        one, batched = throughput["one_at_a_time"], throughput["batched"]
        lines += [
            f"throughput, {throughput['requests']} concurrent requests, {heavy} (median of {args.repeats}):",
            f"  one at a time ({throughput['one_at_a_time_config']}): {one['throughput']:.2f} s audio/s, "
            f"first audio p50 {one['ttfa_p50_s']:.2f} s, max {one['ttfa_max_s']:.2f} s",
            f"  batched ({throughput['batched_config']}): {batched['throughput']:.2f} s audio/s, "
            f"first audio p50 {batched['ttfa_p50_s']:.2f} s, max {batched['ttfa_max_s']:.2f} s, "
            f"mean batch {batched['mean_batch']:.2f}",
            f"  speedup {throughput['speedup']:.2f}x (goal >= 1.5x)",
            f"model batching check ({batching['voice']}, padded batch of {batching['batch']} vs one by one): "
            f"{batching['speedup']:.2f}x -> the server runs sentences concurrently, not as padded batches",
        ]
    result["loadavg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    lines.append(f"machine load (1-min average) before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
                 f"on {os.cpu_count()} CPUs: other processes slow both sides alike but shrink the gain "
                 "from running sentences side by side")
    emit(result, lines, args.json)
    return 0
