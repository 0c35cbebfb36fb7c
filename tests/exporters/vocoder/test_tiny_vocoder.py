"""A tiny randomly initialised HiFi-GAN through the exporter: parity with PyTorch, windows, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from edge_agent.models import ModelStore
from edge_agent.runtime.sessions import make_session
from edge_agent.tts.windowed import FIRST_FRAMES, Vocoder, VocoderInfo, plan_windows
from exporters.quantize import quantize
from exporters.vocoder.hifigan import CODE, CODE_SOURCE, Config, build_generator, inference_form
from exporters.vocoder.onnx_export import export_generator, export_windowed
from exporters.vocoder.pipeline import vocode_pytorch
from tests.exporters.cli_support import fails_with

TINY = {
    "resblock": "1", "upsample_rates": [4, 2], "upsample_kernel_sizes": [8, 4],
    "upsample_initial_channel": 16,
    "resblock_kernel_sizes": [3, 5], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]], "num_mels": 80,
    "n_fft": 32, "hop_size": 8, "win_size": 32, "sampling_rate": 16000, "fmin": 0, "fmax": 8000,
}


@pytest.fixture(scope="module")
def code(store: ModelStore) -> Path:
    return store.fetch(CODE_SOURCE).path(CODE)


@pytest.fixture(scope="module")
def tiny(code: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path, VocoderInfo]:
    """`(generator, whole.onnx, windowed.onnx, info)` of a random two-upsampler generator."""
    torch.manual_seed(0)
    generator = inference_form(build_generator(code, Config.parse(TINY, "tiny")))
    directory = tmp_path_factory.mktemp("tiny-vocoder")
    export_generator(generator, 80, directory / "whole.onnx")
    info = export_windowed(directory / "whole.onnx", directory / "windowed.onnx")
    return generator, directory / "whole.onnx", directory / "windowed.onnx", info


def _mel(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(-4, 2, (80, frames)).astype(np.float32)


def test_exported_graph_matches_pytorch_for_any_number_of_frames(tiny: Any) -> None:
    generator, whole, _, _ = tiny
    graph = onnx.load(str(whole))
    assert not any(n.domain not in ("", "ai.onnx") for n in graph.graph.node)
    session = make_session(whole, 1)
    for frames in (1, 7, 90):
        mel = _mel(frames, frames)
        got = session.run(None, {"mel": mel[None]})[0].reshape(-1)
        expected = vocode_pytorch(generator, mel)
        assert got.shape == (frames * 8,)
        assert np.abs(got - expected).max() < 1e-5


def test_windows_decode_to_the_same_samples_as_the_whole_graph(tiny: Any) -> None:
    _, whole, windowed, info = tiny
    assert (info.channels, info.hop, info.latent) == (80, 8, "mel")
    mel = _mel(150, 1)[None]
    expected = make_session(whole, 1).run(None, {"mel": mel})[0].reshape(-1)
    vocoder = Vocoder(make_session(windowed, 1, shapes_vary=True), info)
    plans = [plan_windows(150, first=True, workers=2), plan_windows(150, first=False),
             [(n, n + 1) for n in range(150)]]
    assert plans[0][0] == (0, FIRST_FRAMES)
    for windows in plans:
        pieces = np.concatenate([vocoder.decode(mel, a, b) for a, b in windows])
        assert pieces.shape == expected.shape
        assert np.abs(pieces - expected).max() < 1e-5


def test_fp16_windows_read_the_mel_and_write_the_audio_in_float32(tiny: Any, tmp_path: Path) -> None:
    # The windowed graph opens with an Unsqueeze and ends with a Reshape: if float16 reached
    # them, onnxruntime would round the mel itself (the whole graph's Conv runs it in float32).
    _, whole, windowed, info = tiny
    for path in (whole, windowed):
        quantize(path, tmp_path / path.name, "fp16")
    nodes = {n.name: n for n in onnx.load(str(tmp_path / windowed.name)).graph.node}
    assert nodes["vits/to4d"].input[0] == "mel" and nodes["vits/flatten"].output[0] == "audio"
    mel = np.random.default_rng(2).uniform(-11.5, 1, (1, 80, 60)).astype(np.float32)
    reference = make_session(whole, 1).run(None, {"mel": mel})[0].reshape(-1)
    got_whole = make_session(tmp_path / whole.name, 1).run(None, {"mel": mel})[0].reshape(-1)
    got_windows = Vocoder(make_session(tmp_path / windowed.name, 1, shapes_vary=True), info).decode(mel)
    whole_diff = np.abs(got_whole - reference).max()
    assert 0 < np.abs(got_windows - reference).max() < 2 * whole_diff


def _checkpoint_dir(tmp_path: Path, data: bytes, config: dict[str, Any] | None = TINY) -> Path:
    path = tmp_path / "mine.pth.tar"
    path.write_bytes(data)
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    return path


def test_a_truncated_checkpoint_exits_2_naming_the_file(
        tmp_path: Path, store: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:
    real = store.fetch(CODE_SOURCE).path("generator.pth.tar")
    with real.open("rb") as fh:
        path = _checkpoint_dir(tmp_path, fh.read(1 << 20), json.loads(store.fetch(CODE_SOURCE).path(
            "config.json").read_text()))
    fails_with(capsys, ["vocoder", "--source", str(path), "--out", str(tmp_path / "out")], str(path),
               "not a readable PyTorch checkpoint")
    assert not (tmp_path / "out").exists()


def test_a_corrupted_checkpoint_exits_2_naming_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _checkpoint_dir(tmp_path, b"\x00garbage" * 1000)
    fails_with(capsys, ["vocoder", "--source", str(path)], str(path), "not a readable PyTorch checkpoint")


def test_a_checkpoint_of_another_shape_exits_2_naming_the_file(
        tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generator = tiny[0]
    state = {k: v for k, v in generator.state_dict().items() if not k.startswith("conv_post")}
    path = tmp_path / "mine.pth.tar"
    torch.save({"generator": state}, path)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    fails_with(capsys, ["vocoder", "--source", str(path)], str(path), "does not fit a HiFi-GAN V1 generator")


@pytest.mark.parametrize(("config", "needle"), [
    (None, "config.json: missing"),
    ({**TINY, "upsample_rates": [4, 4]}, "multiply to 16, hop_size is 8"),
    ({k: v for k, v in TINY.items() if k != "n_fft"}, "missing n_fft"),
    ({**TINY, "resblock": "2"}, "only HiFi-GAN V1"),
])
def test_a_bad_config_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        config: dict[str, Any] | None, needle: str) -> None:
    path = _checkpoint_dir(tmp_path, b"unused", config)
    fails_with(capsys, ["vocoder", "--source", str(path)], needle)


def test_sources_that_are_not_vocoders_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fails_with(capsys, ["vocoder", "--source", "whisper-tiny.en"], "not a vocoder source",
               "hifigan-universal")
    fails_with(capsys, ["vocoder", "--source", "nope"], "unknown source 'nope'")
    fails_with(capsys, ["vocoder", "--source", str(tmp_path)], "a directory")
    fails_with(capsys, ["vocoder", "--source", "hifigan-universal", "--variants", "int4"], "unknown int4")


def test_a_missing_asr_export_exits_2_saying_how_to_make_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fails_with(capsys, ["vocoder", "--source", "hifigan-universal", "--out", str(tmp_path / "v"),
                         "--asr", str(tmp_path / "none")], "edge-export whisper")
    shutil.rmtree(tmp_path / "v", ignore_errors=True)
