"""`edge-agent say TEXT`: speak on the sound card, or write a WAV file."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent.audio.frames import AudioChunk
from edge_agent.audio.playback import play
from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sinks import AudioOutput, AudioUnavailable, Sink, WavSink
from edge_agent.commands.context import Context
from edge_agent.errors import UsageError
from edge_agent.runtime.providers import for_use, one_shot
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import synthesize

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("say", parents=[common], help="speak TEXT (or write it to a WAV file)",
                       description="Synthesize TEXT with the local voice, or on an offload server "
                                   "(--remote, or offload.server / offload.servers); '-' reads it "
                                   "from stdin.")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--voice", metavar="ID", help="voice id (default: tts.voice)")
    p.add_argument("--out", metavar="FILE.wav", type=Path, help="write a WAV file instead of playing")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="synthesize on this device only")
    where.add_argument("--remote", metavar="URI",
                       help="offload to this `edge-agent serve` alone, at tcp://HOST:PORT (or tls://), "
                            "instead of the configured offload servers; the key comes from "
                            "offload.psk_file or $EDGE_OFFLOAD_PSK; with policy auto a failing server "
                            "falls back to the local voice")
    p.set_defaults(handler=run)


def read_text(arg: str) -> str:
    text = sys.stdin.read() if arg == "-" else arg
    if not text.strip():
        raise UsageError("nothing to say: TEXT is empty")
    return text


def open_out(path: Path, sample_rate: int, volume: float) -> Sink:
    if path.is_dir():
        raise UsageError(f"--out {path}: is a directory (name a file in it, e.g. {path / 'speech.wav'})")
    if path.suffix.lower() != ".wav":
        raise UsageError(f"--out {path}: only .wav files are written (e.g. --out {path.with_suffix('.wav')})")
    return WavSink(path, sample_rate, volume)


def open_sink(out: Path | None, audio: AudioSettings, sample_rate: int) -> Sink:
    """`--out`, else the configured output; an output that cannot play is an error, not silence.

    The daemon may fall back to no output (`audio.fallback: null`) and carry on, but a `say`
    that plays nothing and exits 0 looks like success: here that fallback fails instead.
    """
    if out is not None:
        return open_out(out, sample_rate, audio.volume)
    strict = replace(audio, fallback="error") if audio.fallback == "null" else audio
    try:
        return AudioOutput(strict).open(sample_rate, name="say")
    except AudioUnavailable as exc:
        raise AudioUnavailable(f"{exc}, or write a file with --out FILE.wav") from None


def report_file(args: argparse.Namespace, audio: AudioSettings, sink: Sink, audio_s: float,
                detail: str = "") -> None:
    """Where the audio went when it went to a file (--out, audio.output wav, or the WAV fallback)."""
    if isinstance(sink, WavSink):
        chosen = args.out is not None or (audio.output == "wav" and audio.output_command is None)
        where = "" if chosen else " (no sound output: audio.fallback is wav)"
        print(f"{sink.path}: {audio_s:.2f} s at {sink.sample_rate} Hz{detail}{where}")


def _context(args: argparse.Namespace) -> tuple[Context, bool]:
    """Settings with the verb's flags applied, and whether synthesis may go remote."""
    overrides: dict[str, Any] = {}
    if args.remote:  # this server instead of the configured list, not added to it
        overrides["offload.server"] = args.remote
        overrides["offload.servers"] = []
    if args.local:
        overrides["offload.policy"] = "local"
    ctx = Context(args, overrides)
    remote = ctx.settings.offload.offloads
    if args.voice and not remote:
        ctx = Context(args, overrides | {"tts.voice": args.voice})
    return ctx, remote


def run(args: argparse.Namespace) -> int:
    text = read_text(args.text)
    ctx, remote = _context(args)
    settings = ctx.settings
    if remote:
        return _run_routed(args, ctx, text)
    rate = ctx.store.catalog.get(settings.tts.voice).sample_rate or 22050
    # Open the output first: an unwritable --out or no sound card fails before any model is loaded.
    sink = open_sink(args.out, settings.audio, rate)
    try:
        # Never CUDA's start-up for one announcement, unless asked.
        accel = one_shot(settings.runtime, "tts", settings.models.cache_dir)
        voice = VoiceRegistry(ctx.store, settings.tts, accel=accel).get(settings.tts.voice)
        if voice.sample_rate != rate:
            raise UsageError(f"voice {voice.id} runs at {voice.sample_rate} Hz, "
                             f"but the catalog says {rate} Hz")
        stats = play(synthesize(voice, text, settings.tts.sentence_silence_s), sink)
    except BaseException:
        sink.abort()
        raise
    sink.close()
    log.info("spoke %.2f s of audio in %d sentences; first audio after %.3f s",
             stats.audio_s, stats.sentences, stats.first_audio_s or 0.0)
    report_file(args, settings.audio, sink, stats.audio_s)
    return 0


def _run_routed(args: argparse.Namespace, ctx: Context, text: str) -> int:
    """`say` through the offload router: remote voice when the server is healthy, else local."""
    settings = ctx.settings
    rate = ctx.store.catalog.get(settings.tts.voice).sample_rate or 22050
    sink = open_sink(args.out, settings.audio, rate)
    engines: list[str] = []

    def tagged(chunks: Iterator[AudioChunk]) -> Iterator[AudioChunk]:
        for chunk in chunks:
            if chunk.last:
                engines.append(chunk.engine)
            yield chunk

    # The offload client (asyncio streams, TLS, the protocol: ~70 modules) only when synthesis may
    # go remote; a local `say` is mostly start-up and skips it.
    from edge_agent.offload.client import make_synthesizer

    accel = for_use(settings.runtime, "tts", settings.models.cache_dir)
    local = LocalSynthesizer(VoiceRegistry(ctx.store, settings.tts, accel=accel), settings.tts)
    router = make_synthesizer(settings.offload, local)
    try:
        stats = play(tagged(router.stream(text, args.voice)), sink)
    except BaseException:
        sink.abort()
        raise
    finally:
        router.close()
    sink.close()
    used = "+".join(dict.fromkeys(engines)) or "none"
    if "local" in engines:
        servers = ", ".join(settings.offload.targets)
        print(f"edge-agent: {engines.count('local')} of {len(engines)} sentences spoken locally "
              f"(offload {servers} unavailable or failing)", file=sys.stderr)
    log.info("spoke %.2f s of audio in %d sentences (%s); first audio after %.3f s",
             stats.audio_s, stats.sentences, used, stats.first_audio_s or 0.0)
    report_file(args, settings.audio, sink, stats.audio_s, f" (engine: {used})")
    return 0
