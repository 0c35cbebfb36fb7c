"""Fuse the encoder's attention into onnxruntime's `MultiHeadAttention` (com.microsoft).

The exported encoder computes attention as Whisper writes it: split the heads, scale q and k,
`MatMul` -> `Softmax` -> `MatMul`, merge the heads. onnxruntime then materializes every head's
score matrix and its softmax: at Whisper's 30 s window (1500 frames, tiny.en's 6 heads) that is
2 x 54 MB, which sets a listening device's peak memory (the retry window, `asr.retry_window_s`).
Its fused `MultiHeadAttention` runs the same arithmetic blockwise on the CPU (flash attention,
a block of scores at a time), measured here at 13 MB instead of 60 MB for one layer at 1500
frames, and no slower.

Only the encoder is fused: the decoder's attention has one query per token and a causal mask
over a growing cache, so its scores are small. The pattern is the one `onnx_export.attend`
produces through `torch.export`; `fuse_attention` returns how many it fused, and the caller
fails when that is not one per layer (the exporter's graph layout changed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"
HEADS = [0, 2, 1, 3]
"""[batch, n, heads, d_head] <-> [batch, heads, n, d_head]."""
KEYS_T = [0, 1, 3, 2]


@dataclass
class _Graph:
    """Who writes and who reads each value, and the constants."""

    producer: dict[str, onnx.NodeProto]
    consumers: dict[str, list[onnx.NodeProto]]
    constants: dict[str, np.ndarray]
    outputs: set[str]

    @staticmethod
    def of(graph: onnx.GraphProto) -> _Graph:
        producer: dict[str, onnx.NodeProto] = {}
        consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer if _small(i.dims)}
        for node in graph.node:
            for name in node.output:
                producer[name] = node
            for name in node.input:
                consumers[name].append(node)
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        return _Graph(producer, consumers, constants, {o.name for o in graph.output})

    def made_by(self, name: str, op: str, **attrs: list[int] | int) -> onnx.NodeProto | None:
        """The node of type `op` (with these attribute values) that writes `name`, if one does."""
        node = self.producer.get(name)
        if node is None or node.op_type != op:
            return None
        have = _attrs(node)
        return node if all(have.get(k) == v for k, v in attrs.items()) else None

    def only_reader(self, name: str, op: str) -> onnx.NodeProto | None:
        readers = self.consumers.get(name, [])
        return readers[0] if len(readers) == 1 and readers[0].op_type == op else None

    def scalar(self, name: str) -> float | None:
        value = self.constants.get(name)
        return float(value) if value is not None and value.size == 1 else None


def _small(dims: Iterable[int]) -> bool:
    return math.prod(dims) <= 16


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes by name, lists as lists."""
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: list(v) if isinstance(v, list | tuple) else v for k, v in values.items()}


def _split_heads(g: _Graph, name: str) -> tuple[str, int, list[onnx.NodeProto]] | None:
    """`name` = Transpose(Reshape(x, [b, n, heads, d_head]), HEADS): (x, heads, the two nodes)."""
    transpose = g.made_by(name, "Transpose", perm=HEADS)
    if transpose is None:
        return None
    reshape = g.made_by(transpose.input[0], "Reshape")
    shape = g.constants.get(reshape.input[1]) if reshape is not None and len(reshape.input) > 1 else None
    if reshape is None or shape is None or shape.size != 4 or shape[2] <= 0:
        return None
    return reshape.input[0], int(shape[2]), [reshape, transpose]


def _scaled_heads(g: _Graph, name: str) -> tuple[str, int, float, list[onnx.NodeProto]] | None:
    """`name` = split_heads(x) * constant: (x, heads, the constant, the nodes)."""
    mul = g.made_by(name, "Mul")
    if mul is None:
        return None
    for ours, theirs in ((0, 1), (1, 0)):
        scale = g.scalar(mul.input[theirs])
        split = _split_heads(g, mul.input[ours])
        if scale is not None and split is not None:
            return split[0], split[1], scale, [*split[2], mul]
    return None


def _match(g: _Graph, softmax: onnx.NodeProto) -> tuple[onnx.NodeProto, list[onnx.NodeProto]] | None:
    """The fused node for one Softmax's attention, and the nodes it replaces."""
    axis = _attrs(softmax).get("axis", -1)
    scores = g.made_by(softmax.input[0], "MatMul")
    mix = g.only_reader(softmax.output[0], "MatMul")
    if axis != -1 or scores is None or mix is None or mix.input[0] != softmax.output[0]:
        return None
    q = _scaled_heads(g, scores.input[0])
    keys_t = g.made_by(scores.input[1], "Transpose", perm=KEYS_T)
    k = _scaled_heads(g, keys_t.input[0]) if keys_t is not None else None
    v = _split_heads(g, mix.input[1])
    merge = g.only_reader(mix.output[0], "Transpose")
    flat = g.only_reader(merge.output[0], "Reshape") if merge is not None else None
    if q is None or k is None or v is None or keys_t is None or merge is None or flat is None:
        return None
    heads = {q[1], k[1], v[1]}
    if len(heads) != 1 or _attrs(merge).get("perm") != HEADS:
        return None
    replaced = [*q[3], *k[3], keys_t, scores, softmax, mix, *v[2], merge, flat]
    # Every value the pattern makes, but its result, must be read only inside it.
    for node in replaced:
        for out in node.output:
            if out != flat.output[0] and (out in g.outputs
                                          or any(r not in replaced for r in g.consumers.get(out, []))):
                return None
    fused = helper.make_node("MultiHeadAttention", [q[0], k[0], v[0]], [flat.output[0]],
                             name=f"{softmax.name}_fused", domain=MS_DOMAIN, num_heads=heads.pop(),
                             scale=q[2] * k[2])
    return fused, replaced


def fuse_attention(model: onnx.ModelProto) -> int:
    """Replace each unmasked self-attention of `model` by `MultiHeadAttention`; how many were."""
    g = _Graph.of(model.graph)
    nodes = list(model.graph.node)
    fused_at: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    for softmax in (n for n in nodes if n.op_type == "Softmax"):
        found = _match(g, softmax)
        if found is None:
            continue
        fused, replaced = found
        ids = {id(n) for n in replaced}
        # The fused node goes where the pattern's last node was: its inputs are all written by then.
        last = max(i for i, n in enumerate(nodes) if id(n) in ids)
        fused_at[last] = fused
        dropped |= ids
    if not fused_at:
        return 0
    kept = []
    for i, node in enumerate(nodes):
        if i in fused_at:
            kept.append(fused_at[i])
        elif id(node) not in dropped:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return len(fused_at)
