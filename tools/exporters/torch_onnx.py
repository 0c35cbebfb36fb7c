"""What every export through torch's `torch.export`-based ONNX exporter shares."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep the exporter's own notes (torchvision ops it skips, dynamic-shape hints) off our output.

    Its progress lines are turned off with `verbose=False` at the call; errors still raise.
    """
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        exporter_log.setLevel(level)
