"""A HiFi-GAN generator as ONNX: the whole graph (any number of mel frames) and its windowed form.

Exported with torch's `torch.export`-based exporter (`dynamo=True`): the generator is a
plain chain of convolutions, so the frame axis is one dynamic dimension and nothing needs
a workaround. The windowed form is derived from that graph by `edge_agent.tts.windowed`,
the same machinery that streams the Piper voice's vocoder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_agent.tts.windowed import VocoderInfo, window_model
from exporters.torch_onnx import quiet

INPUT, OUTPUT = "mel", "waveform"
"""Names in the whole graph: `mel` [1, n_mels, frames] -> `waveform` [1, 1, frames * hop]."""
EXPORT_FRAMES = 32
"""Mel frames of the example input the exporter traces with (any count runs afterwards)."""


def export_generator(generator: Any, n_mels: int, path: Path) -> int:
    """Write the whole graph to `path` (one file, weights inside); returns its opset."""
    import onnx
    import torch

    example = torch.randn(1, n_mels, EXPORT_FRAMES)
    frames = torch.export.Dim("frames", min=1, max=1 << 20)
    with quiet():
        torch.onnx.export(generator, (example,), str(path), dynamo=True, external_data=False,
                          input_names=[INPUT], output_names=[OUTPUT],
                          dynamic_shapes=({2: frames},), verbose=False)
    model = onnx.load(str(path))
    return int(next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")))


def export_windowed(whole: Path, path: Path) -> VocoderInfo:
    """The windowed 2-D graph of the whole one (`audio` [samples] for a window plus its cut bounds)."""
    import onnx

    windowed, info = window_model(onnx.load(str(whole)))
    onnx.save(windowed, str(path))
    return info
