"""The onnxruntime settings section (`runtime`): which accelerator each use runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Provider = Literal["tensorrt", "cuda", "cpu"]
"""onnxruntime execution providers by our names."""


@dataclass(frozen=True)
class TensorrtSettings:
    """TensorRT execution provider options (onnxruntime's `trt_*`)."""

    fp16: bool = True
    """Let TensorRT run layers in half precision."""
    engine_cache: bool = True
    """Keep built engines in `<models.cache_dir>/trt/` (building one takes minutes on a Jetson)."""
    timing_cache: bool = True
    """Keep layer timings there too, so an engine for a new profile builds faster."""
    max_workspace_mb: int = 1024
    """Scratch memory TensorRT may use while building an engine."""
    device_id: int = 0
    """GPU index."""

    def __post_init__(self) -> None:
        if self.max_workspace_mb < 16 or self.device_id < 0:
            raise ValueError("max_workspace_mb must be at least 16 and device_id not negative")


@dataclass(frozen=True)
class CudaSettings:
    """CUDA execution provider options."""

    conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = "HEURISTIC"
    """cuDNN convolution algorithm search: EXHAUSTIVE benchmarks every new input shape (and
    every Piper sentence and window has one), HEURISTIC picks without timing."""
    device_id: int = 0
    """GPU index."""

    def __post_init__(self) -> None:
        if self.device_id < 0:
            raise ValueError(f"device_id: {self.device_id} is negative")


@dataclass(frozen=True)
class RuntimeSettings:
    """onnxruntime execution providers: which accelerator each use runs on."""

    providers: tuple[Provider, ...] = ("cpu",)
    """Preferred providers, best first (e.g. [tensorrt, cuda, cpu]), kept where the installed
    onnxruntime offers them; cpu always comes last. One warning names each one missing."""
    tts: tuple[Provider, ...] | None = None
    """Providers for the local voices; None uses `providers`."""
    asr: tuple[Provider, ...] | None = None
    """Providers for Whisper; None uses `providers`."""
    server: tuple[Provider, ...] | None = None
    """Providers for the voices `edge-agent serve` runs; None uses `providers`."""
    tensorrt: TensorrtSettings = field(default_factory=TensorrtSettings)
    cuda: CudaSettings = field(default_factory=CudaSettings)

    def wanted(self, use: str) -> tuple[Provider, ...]:
        """The providers asked for `use` (tts, asr, server; anything else gets `providers`)."""
        override: tuple[Provider, ...] | None = getattr(self, use, None) if use in (
            "tts", "asr", "server") else None
        return self.providers if override is None else override

    def __post_init__(self) -> None:
        for name in ("providers", "tts", "asr", "server"):
            value = getattr(self, name)
            if value is not None and not value:
                raise ValueError(f"{name}: name at least one provider (cpu is always last)")
