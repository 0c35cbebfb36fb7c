"""`edge-agent say TEXT`: speak on the sound card, or write a WAV file."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from edge_agent.audio.playback import play
from edge_agent.audio.sinks import AudioOutput, Sink, WavSink
from edge_agent.commands.context import Context
from edge_agent.errors import UsageError
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import synthesize

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("say", parents=[common], help="speak TEXT (or write it to a WAV file)",
                       description="Synthesize TEXT with a local voice; '-' reads it from stdin.")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--voice", metavar="ID", help="voice id (default: tts.voice)")
    p.add_argument("--out", metavar="FILE.wav", type=Path, help="write a WAV file instead of playing")
    p.set_defaults(handler=run)


def read_text(arg: str) -> str:
    text = sys.stdin.read() if arg == "-" else arg
    if not text.strip():
        raise UsageError("nothing to say: TEXT is empty")
    return text


def open_out(path: Path, sample_rate: int, volume: float) -> Sink:
    if path.is_dir():
        raise UsageError(f"--out {path}: is a directory")
    if path.suffix.lower() != ".wav":
        raise UsageError(f"--out {path}: only .wav files are written")
    return WavSink(path, sample_rate, volume)


def run(args: argparse.Namespace) -> int:
    text = read_text(args.text)
    ctx = Context(args, {"tts.voice": args.voice} if args.voice else None)
    settings = ctx.settings
    rate = ctx.store.catalog.get(settings.tts.voice).sample_rate or 22050
    # Open the output first: an unwritable --out fails before any model is loaded.
    if args.out is not None:
        sink = open_out(args.out, rate, settings.audio.volume)
    else:
        sink = AudioOutput(settings.audio).open(rate, name="say")
    try:
        voice = VoiceRegistry(ctx.store, settings.tts).get(settings.tts.voice)
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
    if args.out is not None:
        print(f"{args.out}: {stats.audio_s:.2f} s at {rate} Hz")
    return 0
