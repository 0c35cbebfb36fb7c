"""Which onnxruntime execution providers a use (tts, asr, server) runs on, and with which options.

`runtime.providers` lists the preferred providers, best first (`tensorrt`, `cuda`,
`cpu`); `runtime.tts`, `runtime.asr` and `runtime.server` override it per use.
The list is intersected with what the installed onnxruntime offers (`onnxruntime`
and `onnxruntime-gpu` install the same module: only one of them is ever in
effect), and `cpu` always ends it. A provider asked for but not offered is named
in one warning per use and process, with what runs instead; so is one that is
offered but that a session could not start (a missing CUDA library, no GPU).

A one-shot command (`say`) runs on the CPU unless its own use names other
providers (`runtime.tts`): starting CUDA costs seconds and hundreds of MB, more
than a sentence's synthesis (`one_shot`). Where CUDA or TensorRT is chosen,
onnxruntime's `preload_dlls()` first loads the CUDA and cuDNN libraries of pip's
`nvidia-*` wheels, so they are found without `LD_LIBRARY_PATH`;
`cuda_libraries()` says in one line what is missing (`doctor` shows it).

The TensorRT and CUDA options follow onnxruntime's documented provider options;
they have not been run on a GPU by this project's tests (there is none where
they run), only checked for what is passed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edge_agent.runtime.settings import CudaSettings, RuntimeSettings, TensorrtSettings

log = logging.getLogger(__name__)

Use = Literal["tts", "asr", "server", "vad"]
"""What a session is for; each use may run on its own providers."""

ORT_NAMES = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
"""Our provider names -> onnxruntime's."""

TRT_SUBDIR = "trt"
"""TensorRT engines and timing caches live in `<models.cache_dir>/trt/`."""

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


@dataclass(frozen=True)
class Profile:
    """A TensorRT optimisation profile: the input shapes a session will see.

    Shapes inside `[min, max]` reuse one engine; a shape outside it would make
    TensorRT build another, mid-announcement. Each model states the range it is
    actually fed (its padding buckets, windows, sentence lengths).
    """

    min: Mapping[str, tuple[int, ...]]
    opt: Mapping[str, tuple[int, ...]]
    max: Mapping[str, tuple[int, ...]]

    def options(self) -> dict[str, str]:
        def text(shapes: Mapping[str, tuple[int, ...]]) -> str:
            return ",".join(f"{name}:{'x'.join(str(d) for d in dims)}" for name, dims in shapes.items())

        return {"trt_profile_min_shapes": text(self.min), "trt_profile_opt_shapes": text(self.opt),
                "trt_profile_max_shapes": text(self.max)}


@dataclass(frozen=True)
class Accelerator:
    """The providers one use runs on, in order (always ending with `cpu`), and their options."""

    use: str
    names: tuple[str, ...] = ("cpu",)
    trt: TensorrtSettings = field(default_factory=TensorrtSettings)
    cuda: CudaSettings = field(default_factory=CudaSettings)
    cache_dir: Path | None = None
    """The model cache; TensorRT's caches go to its `trt/` directory."""

    @property
    def cpu_only(self) -> bool:
        return self.names == ("cpu",)

    def session_providers(self, profile: Profile | None = None) -> list[tuple[str, dict[str, str]]]:
        """`[(onnxruntime provider name, options)]` for `InferenceSession(providers=...)`."""
        result: list[tuple[str, dict[str, str]]] = []
        for name in self.names:
            if name == "tensorrt":
                result.append((ORT_NAMES[name], self._tensorrt(profile)))
            elif name == "cuda":
                result.append((ORT_NAMES[name], {"device_id": str(self.cuda.device_id),
                                                 "cudnn_conv_algo_search": self.cuda.conv_algo_search}))
            else:
                result.append((ORT_NAMES[name], {}))
        return result

    def _tensorrt(self, profile: Profile | None) -> dict[str, str]:
        trt = self.trt
        options = {
            "device_id": str(trt.device_id),
            "trt_fp16_enable": _flag(trt.fp16),
            "trt_max_workspace_size": str(trt.max_workspace_mb * 1024 * 1024),
        }
        if self.cache_dir is not None and (trt.engine_cache or trt.timing_cache):
            where = self.cache_dir / TRT_SUBDIR
            where.mkdir(parents=True, exist_ok=True)
            if trt.engine_cache:
                options |= {"trt_engine_cache_enable": "1", "trt_engine_cache_path": str(where)}
            if trt.timing_cache:
                options |= {"trt_timing_cache_enable": "1", "trt_timing_cache_path": str(where)}
        if profile is not None:
            options |= profile.options()
        return options

    def check(self, session: Any, model: str) -> None:
        """Warn (once per use and provider) when a session did not get a provider it asked for."""
        got = set(session.get_providers())
        for name in self.names:
            if ORT_NAMES[name] not in got:
                _warn_once(self.use, name, f"{self.use}: {name} could not start for {model}; "
                                           f"it runs on {_ours(session.get_providers())}")


def available() -> list[str]:
    """Our names of the providers the installed onnxruntime offers, in its order."""
    import onnxruntime as ort

    offered = set(ort.get_available_providers())
    return [ours for ours, theirs in ORT_NAMES.items() if theirs in offered]


def choose(use: str, wanted: Sequence[str], *, trt: TensorrtSettings | None = None,
           cuda: CudaSettings | None = None, cache_dir: Path | None = None,
           offered: Sequence[str] | None = None) -> Accelerator:
    """The providers of `wanted` that onnxruntime offers, then `cpu`; one warning names the missing."""
    offered = available() if offered is None else offered
    names = [n for n in dict.fromkeys(wanted) if n in offered and n != "cpu"]
    missing = [n for n in dict.fromkeys(wanted) if n not in offered]
    names.append("cpu")
    if names[0] != "cpu":
        preload_gpu_libraries()
    if missing:
        _warn_once(use, ",".join(missing),
                   f"{use}: execution provider{'s' if len(missing) > 1 else ''} {', '.join(missing)} not "
                   f"available in this onnxruntime (offered: {', '.join(offered)}); "
                   f"running on {', '.join(names)}")
    return Accelerator(use, tuple(names), trt or TensorrtSettings(), cuda or CudaSettings(), cache_dir)


def for_use(runtime: RuntimeSettings, use: Use, cache_dir: Path | None = None) -> Accelerator:
    """The accelerator `runtime` gives `use` (TensorRT caches under `cache_dir`, the model cache)."""
    return choose(use, runtime.wanted(use), trt=runtime.tensorrt, cuda=runtime.cuda, cache_dir=cache_dir)


def one_shot(runtime: RuntimeSettings, use: Use, cache_dir: Path | None = None) -> Accelerator:
    """The accelerator of a one-shot command for `use`: the CPU, unless `runtime.<use>` itself
    names providers. `runtime.providers` is for processes that stay up (`run`, `serve`): a
    `say` that started CUDA for one sentence took 5 s and 1 GB instead of about 3 s and
    0.36 GB on the CPU (an H200 host, issue 37)."""
    if getattr(runtime, use, None) is not None:
        return for_use(runtime, use, cache_dir)
    if runtime.providers != ("cpu",):
        log.info("%s: a one-shot command runs on the cpu (runtime.providers is for long-running "
                 "processes; set runtime.%s to use %s here)", use, use, ", ".join(runtime.providers))
    return Accelerator(use, ("cpu",), runtime.tensorrt, runtime.cuda, cache_dir)


@functools.cache
def preload_gpu_libraries() -> None:
    """Load CUDA and cuDNN from pip's `nvidia-*` wheels (where installed) before a GPU session,
    through onnxruntime's own `preload_dlls()` (onnxruntime-gpu >= 1.21; a CPU build does
    nothing). Once per process; what it prints goes to the log, not to our stdout."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            preload()
    except OSError as exc:  # a library present but unloadable: the session says what failed
        log.warning("onnxruntime.preload_dlls: %s", exc)
    if said.getvalue().strip():
        log.info("onnxruntime.preload_dlls: %s", " ".join(said.getvalue().split()))


CUDA_WHEELS = {"cudart": "nvidia.cuda_runtime", "cublas": "nvidia.cublas", "cudnn": "nvidia.cudnn",
               "cufft": "nvidia.cufft", "curand": "nvidia.curand"}
"""The CUDA libraries onnxruntime's CUDA provider loads, and the module of the pip wheel with each."""


def cuda_libraries(find_wheel: Callable[[str], bool] | None = None,
                   find_system: Callable[[str], bool] | None = None) -> str | None:
    """None when every library onnxruntime's CUDA provider needs is found (a pip `nvidia-*` wheel
    or the system's loader path); else one line naming the missing ones and how to install them."""
    find_wheel = find_wheel or _has_module
    find_system = find_system or _has_library
    missing = [lib for lib, module in CUDA_WHEELS.items() if not find_wheel(module) and not find_system(lib)]
    if not missing:
        return None
    return (f"CUDA libraries not found: {', '.join(missing)} (neither pip's nvidia-* wheels nor the system's "
            "library path); install them with `pip install 'onnxruntime-gpu[cuda,cudnn]'`, or the CUDA "
            "toolkit and cuDNN 9; until then sessions run on the CPU")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # the parent package (`nvidia`) is not there
        return False


def _has_library(name: str) -> bool:
    import ctypes.util

    return ctypes.util.find_library(name) is not None


def running_on(session: Any) -> str:
    """The providers an onnxruntime session actually has, by our names (`cuda, cpu`)."""
    return _ours(session.get_providers())


def _warn_once(use: str, name: str, message: str) -> None:
    with _warned_lock:
        if (use, name) in _warned:
            return
        _warned.add((use, name))
    log.warning("%s", message)


def _ours(ort_names: Sequence[str]) -> str:
    back = {v: k for k, v in ORT_NAMES.items()}
    return ", ".join(back.get(n, n) for n in ort_names)


def _flag(value: bool) -> str:
    return "1" if value else "0"


CPU = Accelerator("cpu")
"""CPU only, no options: what a caller that names no accelerator gets."""
