"""`edge-agent listen [--input FILE.wav | -] [--json]`: the hearing loop, printing its events."""

from __future__ import annotations

import argparse
import json
import logging
import time

from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sources import AudioSource
from edge_agent.commands.context import Context
from edge_agent.commands.inputs import add_raw_pcm_arguments, open_named
from edge_agent.errors import UsageError
from edge_agent.listen import Event, Heard, TurnEnded, Woke
from edge_agent.parts import build_hearing

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "listen", parents=[common], help="the hearing loop: wake word, command, transcript",
        description="Listen as the daemon does (listen.mode: wake or always) on the microphone, a "
                    "PCM WAV file or raw 16-bit little-endian PCM on stdin ('-'), and print each "
                    "wake word, transcript and end of turn.")
    p.add_argument("--input", metavar="FILE.wav", help="a WAV file, or '-' for raw 16-bit PCM on stdin "
                   "at --rate (16 kHz) and --channels (mono) "
                   "(default: the configured input: audio.input_command, input_pipe, input_file or the "
                   "microphone)")
    p.add_argument("--mode", choices=("wake", "always"), help="override listen.mode")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: {\"event\": \"wake\"|\"transcript\"|\"turn_end\", ...}")
    add_raw_pcm_arguments(p)
    p.add_argument("--front-end", action="store_true",
                   help="hear the WAV file as the device hears its microphones: its channels through "
                        "the beamformer (audio.mic_geometry; else averaged), then the gain and the "
                        "suppressor (audio.*), built by the same code as the configured input")
    p.set_defaults(handler=run)


def open_input(args: argparse.Namespace, audio: AudioSettings | None = None) -> AudioSource | None:
    """`--input`, or None for the configured input; with `--front-end`, the file opened as the
    configured input is (`open_source`), so its channels meet the device's beamformer."""
    if args.input is None:
        return None
    front_end = getattr(args, "front_end", False)
    if args.input == "-" and front_end:
        raise UsageError("--front-end hears a WAV file; for raw PCM on stdin set "
                         "audio.input_pipe '-' (the device's own input path)")
    return open_named(args.input, args.rate, args.channels, audio if front_end else None)


def event_json(event: Event) -> dict[str, object]:
    """The JSON line for an event (the MQTT payloads' fields, plus stream times)."""
    ts = round(time.time(), 3)
    if isinstance(event, Woke):
        return {"event": "wake", "wake_word": event.detection.wake_word, "model": event.detection.model,
                "conversation_id": event.conversation_id, "time": round(event.detection.time, 3), "ts": ts}
    if isinstance(event, Heard):
        doc: dict[str, object] = {"event": "transcript", **event.transcript.to_json(), "ts": ts}
        if event.conversation_id is not None:
            doc["conversation_id"] = event.conversation_id
        if event.wake_word is not None:
            doc["wake_word"] = event.wake_word
        if event.continued:
            doc["continued"] = True
        if event.time is not None:
            doc["time"] = round(event.time, 3)
        return doc
    assert isinstance(event, TurnEnded)  # no turn is streamed here (nothing sets `stream_turns`)
    return {"event": "turn_end", "conversation_id": event.conversation_id, "reason": event.reason,
            "time": round(event.time, 3), "ts": ts}


def event_line(event: Event) -> str:
    if isinstance(event, Woke):
        return f"[{event.detection.time:7.2f}] wake: {event.detection.wake_word}"
    if isinstance(event, Heard):
        t = event.transcript
        return f"[{t.start:7.2f} -> {t.end:7.2f}] {t.text}"
    assert isinstance(event, TurnEnded)
    return f"[{event.time:7.2f}] turn ended ({event.reason})"


def run(args: argparse.Namespace) -> int:
    ctx = Context(args, {"listen.mode": args.mode} if args.mode else None)
    settings = ctx.settings
    if settings.listen.mode == "off":
        raise UsageError("listen.mode is off (use --mode wake or --mode always)")
    source = open_input(args, settings.audio)  # bad input fails here, before any model is loaded
    try:
        loop = build_hearing(settings, ctx.store, source)
    except BaseException:
        if source is not None:
            source.close()
        raise
    for event in loop:
        print(json.dumps(event_json(event), ensure_ascii=False) if args.json else event_line(event),
              flush=True)
    log.info("%.1f s of audio heard", loop.audio_s)
    return 0
