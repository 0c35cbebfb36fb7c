"""Execution providers by configuration: intersected with the build, per-use overrides, loud fallback.

The machines the suite runs on have the CPU build of onnxruntime only, so the
GPU paths are checked for what they ask onnxruntime (provider names and
options), and the fallback for what happens when they are not there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edge_agent.config import RuntimeSettings, Settings, load_settings
from edge_agent.errors import ConfigError
from edge_agent.runtime import providers
from edge_agent.runtime.providers import Accelerator, Profile, choose, for_use, running_on
from edge_agent.runtime.sessions import make_session, session_options


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    """Each test sees the first warning of a process."""
    providers._warned.clear()
    yield
    providers._warned.clear()


@pytest.fixture
def relu(tmp_path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "edge_agent.runtime.providers" and r.levelno == logging.WARNING]


def test_the_default_is_cpu_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    accel = for_use(RuntimeSettings(), "tts")
    assert accel.names == ("cpu",) and accel.cpu_only
    assert warnings_of(caplog) == []


def test_a_missing_provider_warns_once_naming_it_and_the_fallback(caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(3):
        accel = choose("tts", ("tensorrt", "cuda", "cpu"), offered=["cpu"])
        assert accel.names == ("cpu",)
    [warning] = warnings_of(caplog)
    assert "tensorrt, cuda not available" in warning and "running on cpu" in warning


def test_offered_providers_keep_their_order_and_cpu_always_ends_the_list() -> None:
    assert choose("asr", ("cuda", "tensorrt"), offered=["tensorrt", "cuda", "cpu"]).names == (
        "cuda", "tensorrt", "cpu")
    assert choose("asr", ("cpu", "cuda"), offered=["cuda", "cpu"]).names == ("cuda", "cpu")


def test_per_use_overrides_apply(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("runtime:\n  providers: [tensorrt, cuda, cpu]\n  asr: [cuda, cpu]\n  server: [cpu]\n")
    runtime = load_settings(config).runtime
    assert runtime.wanted("tts") == ("tensorrt", "cuda", "cpu")
    assert runtime.wanted("asr") == ("cuda", "cpu")
    assert runtime.wanted("server") == ("cpu",)
    assert runtime.wanted("vad") == ("tensorrt", "cuda", "cpu")


def test_unknown_or_empty_provider_lists_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runtime\.providers\[0\]: 'rocm' is not one of"):
        load_settings(None, {"runtime.providers": ["rocm"]})
    with pytest.raises(ConfigError, match="runtime"):
        load_settings(None, {"runtime.tts": []})
    assert RuntimeSettings(tts=None).wanted("tts") == ("cpu",)


def test_tensorrt_options_cache_under_the_model_cache_and_carry_the_profile(tmp_path: Path) -> None:
    accel = Accelerator("tts", ("tensorrt", "cuda", "cpu"), cache_dir=tmp_path)
    profile = Profile({"input": (1, 1), "scales": (3,)}, {"input": (1, 128), "scales": (3,)},
                      {"input": (1, 1024), "scales": (3,)})
    (trt, trt_opts), (cuda, cuda_opts), (cpu, cpu_opts) = accel.session_providers(profile)
    assert (trt, cuda, cpu) == ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    assert trt_opts["trt_fp16_enable"] == "1"
    assert trt_opts["trt_engine_cache_enable"] == "1" and trt_opts["trt_timing_cache_enable"] == "1"
    assert trt_opts["trt_engine_cache_path"] == str(tmp_path / "trt") and (tmp_path / "trt").is_dir()
    assert trt_opts["trt_profile_min_shapes"] == "input:1x1,scales:3"
    assert trt_opts["trt_profile_max_shapes"] == "input:1x1024,scales:3"
    assert cuda_opts == {"device_id": "0", "cudnn_conv_algo_search": "HEURISTIC"}
    assert cpu_opts == {}


def test_cpu_only_session_settings_are_not_given_to_other_providers() -> None:
    import onnxruntime as ort

    weights = {"W": ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.float32))}
    cpu = session_options(2, spin=True, weights=weights)
    gpu = session_options(2, spin=True, weights=weights, accel=Accelerator("tts", ("cuda", "cpu")))
    assert cpu.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    with pytest.raises(Exception, match="allow_spinning"):
        gpu.get_session_config_entry("session.intra_op.allow_spinning")
    assert gpu.intra_op_num_threads == cpu.intra_op_num_threads == 2  # CPU-fallback nodes still use them


def test_a_provider_that_cannot_start_falls_back_to_cpu_with_one_warning(
        relu: Path, caplog: pytest.LogCaptureFixture) -> None:
    # As if the GPU build were installed but its libraries or the GPU were missing.
    accel = Accelerator("asr", ("cuda", "cpu"))
    with pytest.warns(UserWarning):  # onnxruntime's own, about the provider it does not have
        sessions = [make_session(relu, 1, accel=accel) for _ in range(2)]
    x = np.array([[-1.0, 2.0]], np.float32)
    assert all(running_on(s) == "cpu" for s in sessions)
    assert sessions[0].run(None, {"x": x})[0].tolist() == [[0.0, 2.0]]
    [warning] = warnings_of(caplog)
    assert warning == "asr: cuda could not start for relu.onnx; it runs on cpu"


def _settings(tmp_path: Path, runtime: str) -> Settings:
    config = tmp_path / "c.yaml"
    config.write_text(f"runtime:\n{runtime}")
    return load_settings(config)


def test_a_one_shot_command_runs_on_the_cpu_whatever_the_general_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """`say` with cuda first in runtime.providers on a build that offers it: no CUDA session."""
    monkeypatch.setattr(providers, "available", lambda: ["tensorrt", "cuda", "cpu"])
    settings = _settings(tmp_path, "  providers: [cuda, cpu]\n")
    caplog.set_level(logging.INFO, logger="edge_agent.runtime.providers")
    assert providers.for_use(settings.runtime, "tts").names == ("cuda", "cpu")  # the daemon's choice
    accel = providers.one_shot(settings.runtime, "tts")
    assert accel.names == ("cpu",) and accel.cpu_only
    assert any("one-shot command runs on the cpu" in r.getMessage() for r in caplog.records)


def test_a_one_shot_command_honours_its_own_use_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "available", lambda: ["cuda", "cpu"])
    settings = _settings(tmp_path, "  providers: [cpu]\n  tts: [cuda, cpu]\n")
    assert providers.one_shot(settings.runtime, "tts").names == ("cuda", "cpu")


def test_gpu_libraries_are_preloaded_once_and_only_for_a_gpu_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    calls: list[int] = []

    def fake_preload() -> None:
        calls.append(1)
        print("onnxruntime says something on stdout")

    monkeypatch.setattr(ort, "preload_dlls", fake_preload)
    providers.preload_gpu_libraries.cache_clear()
    try:
        choose("tts", ("cpu",), offered=["cuda", "cpu"])
        assert calls == []
        for _ in range(3):
            choose("server", ("cuda", "cpu"), offered=["cuda", "cpu"])
        assert calls == [1]
    finally:
        providers.preload_gpu_libraries.cache_clear()


def test_missing_cuda_libraries_are_named_in_one_line_with_the_fix() -> None:
    line = providers.cuda_libraries(find_wheel=lambda module: module != "nvidia.cudnn",
                                    find_system=lambda lib: False)
    assert line is not None and "\n" not in line
    assert "cudnn" in line and "cublas" not in line and "onnxruntime-gpu[cuda,cudnn]" in line
    assert providers.cuda_libraries(find_wheel=lambda module: False, find_system=lambda lib: True) is None
    assert providers.cuda_libraries(find_wheel=lambda module: True, find_system=lambda lib: False) is None


def test_doctor_reports_missing_cuda_libraries_on_a_gpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from argparse import Namespace

    from edge_agent.commands import doctor
    from edge_agent.commands.context import Context

    monkeypatch.setattr(doctor, "available", lambda: ["cuda", "cpu"])
    monkeypatch.setattr(doctor, "cuda_libraries", lambda: "CUDA libraries not found: cudnn (...)")
    check = doctor.check_runtime(Context(Namespace(config=None, overrides=[], verbose=0)))
    assert not check.ok and "CUDA libraries not found: cudnn" in check.detail
    monkeypatch.setattr(doctor, "available", lambda: ["cpu"])
    assert doctor.check_runtime(Context(Namespace(config=None, overrides=[], verbose=0))).ok
