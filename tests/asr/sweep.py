"""A sweep of short commands over several voices and speeds: the default padding against Whisper's 30 s.

Piper's joe (noiseless, so every run hears the same samples) at three speaking rates and
espeak-ng in four voices say `TEXTS`; each clip is transcribed with the configured
default (`AsrSettings()`) and with `padding=full` (Whisper's own 30 s window). A clip
*loses words* when its default transcript is more than one word shorter than its full
one. Run as a script for the figures:
`PYTHONPATH=.:tests python tests/asr/sweep.py --model EXPORT_DIR [--padding bucket]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.clips import ESPEAK_VOICES, PIPER_SPEEDS, SWEEP_TEXTS, espeak_clip, load_16k
from edge_agent.asr.whisper import Padding, WhisperOnnx
from edge_agent.text.wer import words
from tests.speech_fixtures import close_speed_voices, piper_speed_clip

TEXTS = SWEEP_TEXTS
"""Twenty-two commands: the bench's twelve, ten more (short ones and two sentences in one)."""


@dataclass(frozen=True)
class Result:
    voice: str
    text: str
    default: str
    full: str

    @property
    def lost(self) -> int:
        """Words the default transcript has fewer than the full one."""
        return len(words(self.full)) - len(words(self.default))




def clips(directory: Path, cache: Path) -> list[tuple[str, str, Path]]:
    """(voice, text, wav) for every voice and text of the sweep."""
    out = []
    for speed in PIPER_SPEEDS:
        out += [(f"piper@{speed}", t, piper_speed_clip(t, directory, cache, speed)) for t in TEXTS]
    for voice, wpm in ESPEAK_VOICES:
        out += [(f"espeak:{voice}@{wpm}", t, espeak_clip(t, directory, voice, wpm)) for t in TEXTS]
    close_speed_voices()
    return out


def sweep(model: WhisperOnnx, padding: Padding, clip_list: list[tuple[str, str, Path]],
          max_tokens: int = 96, show: bool = False) -> list[Result]:
    results = []
    for voice, text, path in clip_list:
        audio = load_16k(path)
        default = model.recognize(audio, padding, max_tokens=max_tokens).text
        full = model.recognize(audio, Padding("full"), max_tokens=max_tokens).text
        results.append(Result(voice, text, default, full))
        if show:
            print(f"{voice:22} {default!r:60} {full!r} {'LOST' if results[-1].lost > 1 else ''}", flush=True)
    return results


def main() -> None:
    import argparse

    from edge_agent.config import AsrSettings
    from edge_agent.text.wer import wer

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True, help="export directory")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/edge-speech-tests/models")
    parser.add_argument("--padding", default=AsrSettings.padding)
    parser.add_argument("--margin", type=float, default=AsrSettings.margin_s)
    parser.add_argument("--bucket", type=float, default=AsrSettings.bucket_s)
    parser.add_argument("--retry-logprob", type=float, default=AsrSettings.retry_logprob)
    args = parser.parse_args()
    clip_list = clips(args.cache / "clips", args.cache)
    model = WhisperOnnx.load(args.model, threads=2)
    padding = Padding(args.padding, args.bucket, args.margin, args.retry_logprob)
    results = sweep(model, padding, clip_list, show=True)
    lost = [r for r in results if r.lost > 1]
    print(f"{len(results)} clips, {len({r.voice for r in results})} voices; "
          f"words lost (default vs full, >1): {len(lost)} clips, "
          f"{sum(max(0, r.lost) for r in results)} words "
          f"in all; WER default {wer([r.text for r in results], [r.default for r in results]):.3f}, "
          f"full {wer([r.text for r in results], [r.full for r in results]):.3f}")


if __name__ == "__main__":
    main()
