"""`edge-agent serve`: the heavy synthesis server for a fleet of devices."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from typing import Any

from edge_agent.commands.context import Context
from edge_agent.config import ServerSettings, TtsSettings
from edge_agent.logs import setup_logging
from edge_agent.models.store import ModelStore
from edge_agent.offload.server import Monitor, ServerMetrics, SynthServer, check_key
from edge_agent.offload.wire import load_psk, server_tls_context
from edge_agent.runtime.providers import CPU, Accelerator, for_use, running_on
from edge_agent.tts import kokoro
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import Voice

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="run the synthesis server",
                       description="Serve heavy voices to devices over the offload protocol. The "
                                   "pre-shared key comes from server.psk_file or $EDGE_OFFLOAD_PSK.")
    p.add_argument("--host", help="address to listen on (default: server.host)")
    p.add_argument("--port", type=int, help="port (default: server.port; 0 picks a free one)")
    p.set_defaults(handler=run)


def load_voices(store: ModelStore, settings: ServerSettings, accel: Accelerator = CPU) -> dict[str, Voice]:
    """Load and warm up every configured voice (a missing model says how to fetch it)."""
    registry = VoiceRegistry(store, TtsSettings(threads=settings.threads, idle_unload_s=0), accel=accel)
    registry.register_runtime("kokoro", kokoro.loader(store, speaker=settings.kokoro_speaker,
                                                      threads=settings.threads,
                                                      spin=settings.workers == 1, accel=accel))
    voices: dict[str, Voice] = {}
    for voice_id in settings.voices:
        voice = registry.get(voice_id)
        started = time.perf_counter()
        for _ in voice.synthesize_sentence("Ready."):
            pass
        log.info("voice %s ready (%d Hz, warm-up %.2f s)", voice_id, voice.sample_rate,
                 time.perf_counter() - started)
        voices[voice_id] = voice
    return voices


def run(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    if args.host:
        overrides["server.host"] = args.host
    if args.port is not None:
        overrides["server.port"] = args.port
    ctx = Context(args, overrides)
    settings = ctx.settings
    setup_logging(verbosity=max(1, args.verbose), json_lines=settings.logging.json)
    s = settings.server
    psk = load_psk(s.psk_file)
    check_key(s, psk)  # before spending seconds on models
    tls = server_tls_context(s.tls_cert, s.tls_key) if s.tls_cert and s.tls_key else None
    accel = for_use(ctx.settings.runtime, "server", ctx.settings.models.cache_dir)
    asyncio.run(_serve(s, ctx.store, psk, tls, accel))
    return 0


def describe(voice_id: str, voice: Voice) -> str:
    """`kokoro-82m [kokoro-v1.0.int8.onnx on cpu]`: the model file (its variant) and the providers
    each of its sessions runs on, as onnxruntime reports them."""
    variant = getattr(voice, "variant", "")
    where = sorted({running_on(session) for session in voice.sessions().values() if session is not None})
    inside = " ".join(x for x in (variant, f"on {' | '.join(where)}" if where else "") if x)
    return f"{voice_id} [{inside}]" if inside else voice_id


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _serve(settings: ServerSettings, store: ModelStore, psk: bytes | None, tls: Any,
                 accel: Accelerator = CPU) -> None:
    """Probes first (live, not ready), then the voices, then the server; SIGTERM: unready, GOAWAY, drain."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = ServerMetrics()
    monitor = None
    probes = ""
    if settings.metrics_port is not None:
        monitor = Monitor(metrics, settings.metrics_host or settings.host, settings.metrics_port)
        mhost, mport = await monitor.start()
        probes = f"; metrics on http://{_shown(mhost)}:{mport}/metrics"
    try:
        voices = await asyncio.to_thread(load_voices, store, settings, accel)
        if stop.is_set():
            return
        server = SynthServer(settings, voices, psk, tls=tls, metrics=metrics)
        host, port = await server.start()
        if monitor is not None:
            monitor.ready = True
        logger = (loop.create_task(server.log_metrics(settings.metrics_interval_s))
                  if settings.metrics_interval_s > 0 else None)
        print(f"edge-agent serve: listening on {'tls' if tls else 'tcp'}://{_shown(host)}:{port} "
              f"(voices: {', '.join(describe(k, v) for k, v in voices.items())}; "
              f"{settings.workers} workers x {settings.threads} threads)"
              f"{probes}", flush=True)
        await stop.wait()
        log.info("signal received: draining (grace %.0f s)", settings.shutdown_grace_s)
        if monitor is not None:
            monitor.ready = False
        if logger is not None:
            logger.cancel()
        await server.shutdown()
    finally:
        if monitor is not None:
            await monitor.close()
