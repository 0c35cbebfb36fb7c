"""onnxruntime sessions with explicit, documented options."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_agent.errors import ModelError
from edge_agent.providers import CPU, Accelerator, Profile

log = logging.getLogger(__name__)


def make_session(path: Path, threads: int, *, spin: bool = True,
                 weights: Mapping[str, Any] | None = None, shapes_vary: bool = False,
                 accel: Accelerator = CPU, profile: Profile | None = None) -> Any:
    """An onnxruntime session on `accel`'s providers with `threads` intra-op threads and full graph
    optimisation.

    Inter-op parallelism stays at 1: the models we run are chains of ops, and a
    second pool only competes for the same two to four cores. `weights` (from
    `load_weights`) are used in place of the model's own, so several sessions of
    one model hold its weights once. `shapes_vary` turns off onnxruntime's memory
    patterns, which are planned and kept per input shape: a model fed a new shape
    on nearly every call (a sentence, a window) only pays for them in memory.

    On an accelerator (`accel` not CPU only) the CPU-only settings are left out:
    spinning, and `weights` (they would be copied to the device per session,
    not shared; onnxruntime reads the model's external data itself). `profile`
    is the TensorRT optimisation profile of the shapes the caller feeds.
    """
    import onnxruntime as ort

    opts = session_options(threads, spin=spin, weights=weights, shapes_vary=shapes_vary, accel=accel)
    providers = accel.session_providers(profile)
    try:
        session = ort.InferenceSession(str(path), sess_options=opts, providers=[n for n, _ in providers],
                                       provider_options=[o for _, o in providers])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: cannot load ONNX model: {first}") from None
    accel.check(session, path.name)
    return session


def session_options(threads: int, *, spin: bool = True, weights: Mapping[str, Any] | None = None,
                    shapes_vary: bool = False, accel: Accelerator = CPU) -> Any:
    """The `SessionOptions` of `make_session` (CPU-only entries only for a CPU session)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.enable_mem_pattern = not shapes_vary
    opts.log_severity_level = 3
    # Spinning workers cut latency between ops (a Piper front runs 1.4x faster with
    # them), but must stop when the run ends: threads left spinning after a run
    # steal the cores from whatever runs next (the vocoder's windows, the ASR
    # decoder). A caller that shares the cores during the run passes spin=False.
    if accel.cpu_only:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        opts.add_session_config_entry("session.force_spinning_stop", "1")
        for name, value in (weights or {}).items():
            opts.add_initializer(name, value)
    return opts


def load_weights(path: Path) -> dict[str, Any]:
    """The external-data initializers of the ONNX model at `path`, as onnxruntime values.

    Read once and passed to `make_session(..., weights=...)`, they are shared by
    every session made with them (onnxruntime uses them in place on the CPU).
    """
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx.helper import tensor_dtype_to_np_dtype

    try:
        model = onnx.load(str(path), load_external_data=False)
        weights = {}
        for init in model.graph.initializer:
            if init.data_location != onnx.TensorProto.EXTERNAL:
                continue
            where = {e.key: e.value for e in init.external_data}
            dtype = np.dtype(tensor_dtype_to_np_dtype(init.data_type))
            count = math.prod(init.dims)
            offset, length = int(where.get("offset", 0)), int(where.get("length", count * dtype.itemsize))
            if length != count * dtype.itemsize:
                raise ValueError(f"{init.name}: {length} bytes stored for {count} x {dtype}")
            if Path(where["location"]).name != where["location"]:
                raise ValueError(f"{init.name}: stored outside the model's directory")
            data = path.parent / where["location"]
            array = np.fromfile(data, dtype=dtype, count=count, offset=offset)
            if array.size != count:
                raise ValueError(f"{data.name} ends inside {init.name}")
            weights[init.name] = ort.OrtValue.ortvalue_from_numpy(array.reshape(tuple(init.dims)))
        return weights
    except Exception as exc:  # protobuf decode errors have no common type
        raise ModelError(f"{path}: cannot read its weights: {exc}") from None
