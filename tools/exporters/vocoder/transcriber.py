"""The ASR the vocoder's round trip is heard by: our Whisper runtime on an `edge-export whisper` export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_agent.audio.frames import Samples
from edge_agent.errors import UsageError
from exporters.vocoder.pipeline import Transcribe


def asr_for_round_trip(directory: Path, threads: int) -> tuple[Transcribe, dict[str, Any]]:
    """`(transcribe, description)` for the Whisper export in `directory` (its default variant)."""
    from edge_agent.asr.whisper import WhisperOnnx

    if not (directory / "manifest.json").is_file():
        raise UsageError(f"--asr {directory}: no Whisper export there; make one with "
                         "`edge-export whisper --source whisper-tiny.en` or pass --asr DIR")
    model = WhisperOnnx.load(directory, None, threads)

    def transcribe(audio: Samples) -> str:
        return model.recognize(audio).text

    return transcribe, {"directory": str(directory.resolve()), "variant": model.variant,
                        "source": model.manifest.source}
