"""onnxruntime sessions with explicit, documented options."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from edge_agent.errors import ModelError

log = logging.getLogger(__name__)


def make_session(path: Path, threads: int, *, spin: bool = True) -> Any:
    """An onnxruntime CPU session with `threads` intra-op threads and full graph optimisation.

    Inter-op parallelism stays at 1: the models we run are chains of ops, and a
    second pool only competes for the same two to four cores.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    # Spinning workers cut latency between ops; a daemon that idles most of the time
    # can turn it off to give the cores back.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: cannot load ONNX model: {first}") from None
