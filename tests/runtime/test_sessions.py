"""Weights kept beside a model (onnx external data), read once and shared by its sessions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_agent.errors import ModelError
from edge_agent.runtime.sessions import index_weights, load_weights, make_session


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """y = x @ W + b, with W and b stored in `weights.bin`."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path),
              save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=0)
    index_weights(path)
    return path


def test_sessions_sharing_weights_compute_what_the_model_does(model: Path) -> None:
    weights = load_weights(model)
    assert set(weights) == {"W", "b"}
    x = np.ones((1, 64), np.float32)
    expected = make_session(model, 1).run(None, {"x": x})[0]
    for threads in (1, 2):
        got = make_session(model, threads, weights=weights).run(None, {"x": x})[0]
        assert np.array_equal(got, expected)


def test_truncated_weights_are_a_model_error(model: Path) -> None:
    data = model.parent / "weights.bin"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ModelError, match=r"weights\.bin ends inside"):
        load_weights(model)


def test_weights_stored_outside_the_models_directory_are_refused(model: Path) -> None:
    proto = onnx.load(str(model), load_external_data=False)
    for init in proto.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../../etc/passwd"
    onnx.save(proto, str(model))
    with pytest.raises(ModelError, match="outside the model's directory"):
        index_weights(model)
    index = model.with_name(model.name + ".weights.json")
    index.write_text(index.read_text().replace('"weights.bin"', '"../weights.bin"'))
    with pytest.raises(ModelError, match="outside the model's directory"):
        load_weights(model)


def test_a_model_that_is_not_onnx_is_a_model_error(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x00not a model" * 10)
    with pytest.raises(ModelError, match="cannot read its weights"):
        index_weights(path)
    with pytest.raises(ModelError, match="cannot read its weights"):
        load_weights(path)  # and no index beside it


def test_loading_weights_does_not_import_onnx(model: Path) -> None:
    # `import onnx` costs about a second of CPU: the device's load path must not pay it.
    code = ("import sys; from pathlib import Path; "
            "from edge_agent.runtime.sessions import load_weights, make_session; "
            f"p = Path({str(model)!r}); make_session(p, 1, weights=load_weights(p)); "
            "print(sorted(m for m in sys.modules if m == 'onnx' or m.startswith('onnx.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"



SHARED_ARENA_PROBE = """
import sys
from pathlib import Path
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from edge_agent.runtime.sessions import session_options

def peak_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

def session(path, factor, shared):
    # Three products as large as x, held in the session's arena while it runs.
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Add", ["a", "x"], ["b"]),
             helper.make_node("Mul", ["b", "a"], ["c"]), helper.make_node("ReduceSum", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("k", TensorProto.FLOAT, [], [factor])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    opts = session_options(1)
    if not shared:
        opts.add_session_config_entry("session.use_env_allocators", "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

where, shared = Path(sys.argv[1]), sys.argv[2] == "shared"
sessions = [session(where / f"{i}.onnx", 2.0 + i, shared) for i in range(3)]
x = np.ones((1, 4 * 1024 * 1024), np.float32)  # 16 MB
before = peak_mb()
for _ in range(2):
    for one in sessions:
        one.run(None, {"x": x})
print(peak_mb() - before)
"""


def test_sessions_of_one_process_reuse_one_arena(tmp_path: Path) -> None:
    # Three models run in turn: with the shared arena each run takes the blocks the one before
    # freed, so the process holds one run's memory; with an arena per session, three.
    def grown_mb(mode: str) -> float:
        done = subprocess.run([sys.executable, "-c", SHARED_ARENA_PROBE, str(tmp_path), mode],
                              capture_output=True, text=True, timeout=120, check=True)
        return float(done.stdout.strip())

    shared, separate = grown_mb("shared"), grown_mb("separate")
    assert shared < 0.5 * separate, (shared, separate)
