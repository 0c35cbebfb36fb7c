"""Peak memory of a listening device: VAD + Whisper + the local voice loaded and used once
(with `--wake`, the wake engine too, hearing the clip first), and the end-of-turn model
(`listen.end_of_turn: model` and `smart-turn` present) judging the clip once.

Whisper is also made to decode the clip in its retry window (`asr.retry_window_s`), as it does for
any command whose short-window result is unsure or degenerate: the encoder's attention grows with
the square of the window, so that decode, not the usual one, sets a listening device's peak.

Run as its own process (`python -m benchmarks.rss CLIP.wav [--config F] [--set K=V]`)
so nothing the benchmark itself loaded counts; prints one JSON object with the
peak resident set (VmHWM) after each stage.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from dataclasses import replace
from pathlib import Path

from edge_agent.cli import common_options


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MB (VmHWM, else getrusage)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(parents=[common_options()])
    parser.add_argument("clip", type=Path)
    parser.add_argument("--wake", action="store_true",
                        help="also load the wake models and run the clip through them")
    args = parser.parse_args(argv)
    stages: dict[str, float] = {"python": peak_rss_mb()}

    # Imported after the first reading, so "python" is the interpreter and the option parser alone.

    from edge_agent.asr.transcriber import Transcriber
    from edge_agent.asr.whisper import Padding, WhisperOnnx
    from edge_agent.audio.sources import WavFileSource
    from edge_agent.audio.wav import read_wav
    from edge_agent.commands.context import Context
    from edge_agent.listen import Heard, HearingModels, hearing_loop
    from edge_agent.listen.endofturn import load_end_of_turn
    from edge_agent.listen.microphone import Microphone
    from edge_agent.tts.registry import VoiceRegistry
    from edge_agent.tts.voice import synthesize
    from edge_agent.vad import make_segmenter

    ctx = Context(args)
    settings = ctx.settings
    clip = read_wav(args.clip).samples
    segmenter = make_segmenter(settings.vad, ctx.store)
    model = WhisperOnnx.from_settings(settings.asr, settings.models)
    voices = VoiceRegistry(ctx.store, settings.tts)
    voice = voices.get(settings.tts.voice)
    wake = None
    if args.wake:
        from edge_agent.wake import WakeEngine

        wake = WakeEngine.load(settings.wake)
        detections = [d.model for d in wake.feed(clip)]
    end_of_turn = load_end_of_turn(settings.listen, ctx.store)
    if end_of_turn is not None:
        # One call allocates what the model keeps in onnxruntime's arena for the rest of the run.
        end_of_turn.model.probability(clip)
        end_of_turn.close()
    stages["loaded"] = peak_rss_mb()
    source = WavFileSource(args.clip)
    models = HearingModels(segmenter, Transcriber(model, settings.asr))
    listener = hearing_loop("always", settings.listen, models, Microphone(source, source))
    transcripts = [e.transcript.text for e in listener if isinstance(e, Heard)]
    stages["transcribed"] = peak_rss_mb()
    # retry_logprob 0: every result is "unsure", so this decode goes on in the retry window.
    always_retry = replace(Padding.from_settings(settings.asr), retry_logprob=0.0)
    model.recognize(clip, always_retry, beam_size=settings.asr.beam_size)
    stages["retried"] = peak_rss_mb()
    samples = sum(len(c.samples) for c in synthesize(voice, "The front door is open. Please close it."))
    stages["spoke"] = peak_rss_mb()
    print(json.dumps({"peak_rss_mb": max(stages.values()), "stages": stages, "transcripts": transcripts,
                      "spoken_samples": samples, "vad": settings.vad.engine, "variant": model.variant,
                      "wake": detections if wake is not None else None,
                      "end_of_turn": end_of_turn is not None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
