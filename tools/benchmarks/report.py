"""Benchmark output: a readable table, and with --json one JSON object as the last line."""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count()}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def emit(result: dict[str, Any], lines: Sequence[str], as_json: bool) -> None:
    """Print the human lines, then (with `as_json`) the result as the final line."""
    for line in lines:
        print(line, flush=True)
    if as_json:
        print(json.dumps(result, sort_keys=True, default=_plain), flush=True)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
