"""The encoder's attention fused into MultiHeadAttention: the same numbers, only where it is safe."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from exporters.whisper.fuse import fuse_attention

HEADS, D_HEAD = 3, 8
WIDTH = HEADS * D_HEAD


def attention_graph(*, masked: bool = False, leak: bool = False) -> onnx.ModelProto:
    """x [1, n, WIDTH] -> attention as `onnx_export.attend` exports it -> [1, n, WIDTH].

    `masked` adds a mask to the scores (the decoder's self-attention); `leak` also makes the
    softmax a graph output (a value read outside the pattern).
    """
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (WIDTH, WIDTH)).astype(np.float32), f"w{p}")
             for p in "qkv"]
    inits += [numpy_helper.from_array(np.array([1, -1, HEADS, D_HEAD], np.int64), "split"),
              numpy_helper.from_array(np.array([1, -1, WIDTH], np.int64), "merge"),
              numpy_helper.from_array(np.array(D_HEAD ** -0.25, np.float32), "scale"),
              numpy_helper.from_array(np.array(-3.0, np.float32), "mask")]
    nodes = []
    for p in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}_lin"]),
                  helper.make_node("Reshape", [f"{p}_lin", "split"], [f"{p}_view"]),
                  helper.make_node("Transpose", [f"{p}_view"], [f"{p}_heads"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Mul", ["q_heads", "scale"], ["q_scaled"]),
              helper.make_node("Mul", ["scale", "k_heads"], ["k_scaled"]),
              helper.make_node("Transpose", ["k_scaled"], ["k_t"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q_scaled", "k_t"], ["scores"])]
    if masked:
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["scores_masked"]))
    nodes += [helper.make_node("Softmax", ["scores_masked" if masked else "scores"], ["weights"], axis=-1),
              helper.make_node("MatMul", ["weights", "v_heads"], ["mixed"]),
              helper.make_node("Transpose", ["mixed"], ["mixed_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["mixed_t", "merge"], ["out"])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, "n", WIDTH])]
    if leak:
        outputs.append(helper.make_tensor_value_info("weights", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 [1, "n", WIDTH])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["out"], {"x": x})[0])


def test_fused_attention_computes_what_the_exported_pattern_does():
    x = np.random.default_rng(1).normal(0, 1, (1, 37, WIDTH)).astype(np.float32)
    model = attention_graph()
    expected = run(model, x)
    assert fuse_attention(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "MatMul", "MatMul", "MultiHeadAttention"]
    fused = model.graph.node[-1]
    assert fused.domain == "com.microsoft" and list(fused.input) == ["q_lin", "k_lin", "v_lin"]
    onnx.checker.check_model(model)
    np.testing.assert_allclose(run(model, x), expected, atol=1e-5)


def test_masked_attention_is_left_alone():
    model = attention_graph(masked=True)
    before = [n.op_type for n in model.graph.node]
    assert fuse_attention(model) == 0
    assert [n.op_type for n in model.graph.node] == before


def test_attention_whose_inner_values_are_read_elsewhere_is_left_alone():
    model = attention_graph(leak=True)
    assert fuse_attention(model) == 0
    assert "Softmax" in {n.op_type for n in model.graph.node}
