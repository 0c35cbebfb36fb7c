"""onnxruntime sessions with explicit, documented options."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import platform
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_agent.errors import ModelError
from edge_agent.runtime.providers import CPU, Accelerator, Profile

log = logging.getLogger(__name__)

_ARENA_LOCK = threading.Lock()


def make_session(path: Path, threads: int, *, spin: bool = True,
                 weights: Mapping[str, Any] | None = None, shapes_vary: bool = False,
                 accel: Accelerator = CPU, profile: Profile | None = None, optimized: bool = False) -> Any:
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
    `optimized` says `path` was written by `save_optimized` for this machine:
    onnxruntime then skips its graph optimisations (most of a session's start-up).
    """
    import onnxruntime as ort

    opts = session_options(threads, spin=spin, weights=weights, shapes_vary=shapes_vary, accel=accel)
    if optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
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
        share_cpu_arena()
        opts.add_session_config_entry("session.use_env_allocators", "1")
        for name, value in (weights or {}).items():
            opts.add_initializer(name, value)
    return opts


def share_cpu_arena() -> None:
    """Give every CPU session of this process one memory arena, registered once.

    By default each session keeps an arena of its own, which never returns what it grew to:
    a listening device's peak was the sum of each model's own peak (Whisper's retry window,
    then the voice, each holding its blocks). One arena reuses the blocks a finished run
    freed, so the peak is that of the largest run plus what is held: 377 MB instead of 432 MB
    with Whisper (an export before its fused attention), the voice, Silero and four wake models
    (`benchmarks.rss --wake`), at the same speed. onnxruntime's arena serializes its own
    bookkeeping, so sessions running in different threads (a turn's decode while an announcement
    speaks) can share it.

    Registered once per process, under a lock: models load in several threads, and a second
    registration would give the sessions made after it an arena apart from the first's.
    """
    with _ARENA_LOCK:
        _register_cpu_arena()


@functools.cache
def _register_cpu_arena() -> None:
    import onnxruntime as ort

    where = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(where, ort.OrtArenaCfg({}))


def cpu_fingerprint() -> str:
    """What a CPU-optimized model depends on: onnxruntime's version and this CPU's instruction set.

    onnxruntime's full optimisation rewrites convolutions into a blocked layout
    whose block size follows the CPU's vector width; a model saved that way is
    only valid where it was made.
    """
    import onnxruntime as ort

    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.split(":")[0].strip() in ("flags", "Features"):
                flags = line.split(":", 1)[1]
                break
    except OSError:
        pass
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12]
    return f"ort{ort.__version__}-{platform.machine()}-{digest}"


def save_optimized(source: Path, target: Path) -> None:
    """Write `source` as onnxruntime optimizes it for this CPU (full level) to `target`.

    Its initializers go to `<target>.data` with an index (`index_weights`), so
    `make_session(target, optimized=True, weights=load_weights(target))` starts
    without optimising again and sessions can still share weights. Only for CPU
    sessions (see `cpu_fingerprint`); the caller makes the write atomic.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    opts.optimized_model_filepath = str(target)
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                  target.name + ".data")
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    try:
        ort.InferenceSession(str(source), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise ModelError(f"{source}: cannot optimize: {str(exc).strip()[:200]}") from None
    index_weights(target)


WEIGHTS_INDEX_SUFFIX = ".weights.json"
"""`<model>.onnx.weights.json`: where each external initializer of `<model>.onnx` lies in its data file."""


def index_weights(path: Path) -> Path:
    """Write the index `load_weights` reads for the ONNX model at `path` (its external initializers).

    This is the only place that parses the model with `onnx` (whose import costs
    about a second of CPU on a small board): it runs once, when a model is
    prepared, so loading it later needs only numpy and onnxruntime.
    """
    import numpy as np
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    try:
        model = onnx.load(str(path), load_external_data=False)
        tensors = []
        for init in model.graph.initializer:
            if init.data_location != onnx.TensorProto.EXTERNAL:
                continue
            where = {e.key: e.value for e in init.external_data}
            dtype = np.dtype(tensor_dtype_to_np_dtype(init.data_type))
            count = math.prod(init.dims)
            length = int(where.get("length", count * dtype.itemsize))
            if length != count * dtype.itemsize:
                raise ValueError(f"{init.name}: {length} bytes stored for {count} x {dtype}")
            tensors.append({"name": init.name, "file": where["location"], "dtype": dtype.str,
                            "shape": list(init.dims), "offset": int(where.get("offset", 0))})
    except Exception as exc:  # protobuf decode errors have no common type
        raise ModelError(f"{path}: cannot read its weights: {exc}") from None
    for tensor in tensors:
        _check_local(path, tensor["name"], tensor["file"])
    index = path.with_name(path.name + WEIGHTS_INDEX_SUFFIX)
    index.write_text(json.dumps({"tensors": tensors}), encoding="utf-8")
    return index


def load_weights(path: Path) -> dict[str, Any]:
    """The external-data initializers of the ONNX model at `path`, as onnxruntime values.

    Read once and passed to `make_session(..., weights=...)`, they are shared by
    every session made with them (onnxruntime uses them in place on the CPU).
    Where they lie comes from the index `index_weights` wrote beside the model.
    """
    import numpy as np
    import onnxruntime as ort

    index = path.with_name(path.name + WEIGHTS_INDEX_SUFFIX)
    try:
        tensors = json.loads(index.read_text(encoding="utf-8"))["tensors"]
        weights = {}
        for tensor in tensors:
            name, dtype, shape = str(tensor["name"]), np.dtype(tensor["dtype"]), tuple(tensor["shape"])
            _check_local(path, name, tensor["file"])
            data = path.parent / tensor["file"]
            count = math.prod(shape)
            array = np.fromfile(data, dtype=dtype, count=count, offset=int(tensor["offset"]))
            if array.size != count:
                raise ModelError(f"{path}: cannot read its weights: {data.name} ends inside {name}")
            weights[name] = ort.OrtValue.ortvalue_from_numpy(array.reshape(shape))
        return weights
    except ModelError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path}: cannot read its weights: {exc}") from None


def _check_local(path: Path, name: str, file: str) -> None:
    if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
        raise ModelError(f"{path}: cannot read its weights: {name}: stored outside the model's directory")
