"""`edge-agent transcribe FILE.wav [--json]`: VAD + Whisper over a file, one line per utterance: the
hearing loop in mode `always`, without the microphone front end."""

from __future__ import annotations

import argparse
import json
import logging

from edge_agent.commands.context import Context
from edge_agent.commands.inputs import add_raw_pcm_arguments, open_named
from edge_agent.listen import Heard
from edge_agent.parts import build_hearing

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "transcribe", parents=[common], help="transcribe the speech in a WAV file",
        description="Find the utterances in FILE with the VAD and transcribe each with Whisper. "
                    "FILE is a PCM WAV file (any rate, any channels) or '-' for raw 16-bit "
                    "little-endian PCM on stdin (see --rate, --channels).")
    p.add_argument("file", metavar="FILE.wav")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: {\"text\", \"start\", \"end\"} (seconds)")
    add_raw_pcm_arguments(p)
    p.set_defaults(handler=run)


def format_line(text: str, start: float, end: float) -> str:
    return f"[{start:7.2f} -> {end:7.2f}] {text}"


def run(args: argparse.Namespace) -> int:
    ctx = Context(args, {"listen.mode": "always"})
    source = open_named(args.file, args.rate, args.channels)  # bad input fails before any model loads
    try:
        listener = build_hearing(ctx.settings, ctx.store, source, front_end=False)
    except BaseException:
        source.close()
        raise
    for event in listener:
        if not isinstance(event, Heard):
            continue  # mode `always` has no turns: every event is a transcript
        transcript = event.transcript
        if args.json:
            print(json.dumps(transcript.to_json(), ensure_ascii=False), flush=True)
        else:
            print(format_line(transcript.text, transcript.start, transcript.end), flush=True)
    stats = listener.stats
    log.info("%.1f s of audio: %d utterances, %d transcribed", stats.audio_s, stats.utterances,
             stats.transcripts)
    if stats.utterances == 0:
        log.warning("no speech found in %.1f s of audio", stats.audio_s)
    return 0
