"""The PyTorch Whisper reference that `edge-agent bench asr` times ours against.

The device runtime never imports the exporter (nor torch), so the bench cannot reach for this
module: it finds it through the `edge_speech.asr_references` entry point group
(pyproject.toml), which is only loadable where the `export` extra is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edge_agent.audio.frames import Samples
from exporters.whisper.reference import Reference, load_model, set_threads


def torch_fp32(ct2_dir: Path, threads: int) -> Callable[[Samples], str]:
    """openai-whisper in fp32 on the CTranslate2 weights in `ct2_dir`: audio -> text (30 s padding)."""
    set_threads(threads)
    ref = Reference(load_model(ct2_dir))
    return lambda audio: ref.transcribe(audio).text
