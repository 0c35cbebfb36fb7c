"""ONNX weight compression for any model: int8 on MatMul/Gemm weights, fp16, static int8.

- `int8-matmul`: dynamic int8 on MatMul/Gemm nodes whose weight is a constant. Convolutions
  and activation-by-activation products (attention scores) stay float: blanket int8 makes
  conv-heavy models slower (Piper 2.8x, HiFi-GAN ~10x in published reports).
- `fp16`: every float weight and activation in half precision, float32 at the graph's
  inputs and outputs and through the shape ops next to them (`cast_io_past_shape_ops`).
  onnxconverter-common leaves the model's own `Cast(to=FLOAT)` nodes alone, so their float32
  outputs meet float16 consumers and onnxruntime refuses the model ("Type (tensor(float16))
  of output arg ... does not match"); we retarget every such Cast that does not feed a graph
  output to FLOAT16.
- `int8-all`: dynamic int8 on every op onnxruntime can quantize (convolutions included):
  the "blanket" setting, kept only to measure what it costs.
- `int8-static`: QDQ, per-channel int8 weights and calibrated int8 activations on the same
  MatMul/Gemm nodes. It needs calibration inputs and can break small models: measure it.
- `int4-block`: 4-bit weights with one scale per block of 32 input rows (`MatMulNBits`) on
  the same MatMul/Gemm nodes, and 4-bit embedding tables (`GatherBlockQuantized`); products in
  int8 (`accuracy_level` 4) with activations quantized per block too. Finer scales than one per
  channel and per tensor: on Whisper's decoder it keeps the fp32 model's words where
  `int8-matmul` loses some, at half its size. The model is raised to opset 21 (int4 tensors).
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto

from edge_agent.errors import ModelError, UsageError

log = logging.getLogger(__name__)

Mode = Literal["int8-matmul", "fp16", "int8-static", "int8-all", "int4-block"]
MODES: tuple[Mode, ...] = ("int8-matmul", "fp16", "int8-static", "int8-all", "int4-block")
INT4_BLOCK = 32
"""Input rows per 4-bit scale in `int4-block` (the finest block MatMulNBits supports well)."""
Feed = dict[str, np.ndarray]


def load_onnx(path: Path) -> onnx.ModelProto:
    """Load and structurally check an ONNX file; a bad file is a `ModelError` naming it."""
    if not path.is_file():
        raise ModelError(f"{path}: no such file")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as exc:  # protobuf and the checker raise assorted types
        text = str(exc).strip().splitlines()
        raise ModelError(f"{path}: not a valid ONNX model ({text[0] if text else type(exc).__name__})") \
            from None
    return model


def weight_matmuls(model: onnx.ModelProto) -> list[str]:
    """Names of MatMul/Gemm nodes whose second input is a constant weight."""
    inits = {i.name for i in model.graph.initializer}
    names = []
    for i, node in enumerate(model.graph.node):
        if node.op_type in ("MatMul", "Gemm") and node.input[1] in inits:
            if not node.name:
                node.name = f"{node.op_type}_{i}"
            names.append(node.name)
    return names


def untie_embeddings(model: onnx.ModelProto) -> list[str]:
    """Give tied projections their own weight, so both sides can be quantized.

    A `Gemm(x, E, transB=1)` reading an embedding matrix E that a `Gather` also reads
    (Whisper's vocabulary projection) is left in float by onnxruntime's quantizer, which
    then adds a float transposed copy of E. We rewrite it as `MatMul(x, E^T)` and return the
    names of the embedding Gathers, which are quantized alongside (int8 rows, dequantized
    after the lookup).
    """
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    gathers = {n.input[0]: n for n in graph.node if n.op_type == "Gather" and n.input[0] in inits}
    tied: list[str] = []
    for index, node in enumerate(list(graph.node)):
        if node.op_type != "Gemm" or node.input[1] not in gathers or len(node.input) > 2:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        if attrs.get("transB") != 1 or attrs.get("transA", 0) != 0:
            continue
        weight = numpy_helper.to_array(inits[node.input[1]])
        copy = numpy_helper.from_array(np.ascontiguousarray(weight.T), f"{node.input[1]}.T")
        graph.initializer.append(copy)
        matmul = onnx.helper.make_node("MatMul", [node.input[0], copy.name], list(node.output),
                                       name=node.name or f"untied_{index}")
        graph.node.remove(node)
        graph.node.insert(index, matmul)
        gather = gathers[node.input[1]]
        gather.name = gather.name or f"embedding_{index}"
        tied.append(gather.name)
    return tied


def quantize_int8_matmul(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = load_onnx(src)
    embeddings = untie_embeddings(model)
    nodes = weight_matmuls(model)
    if not nodes:
        raise UsageError(f"{src}: no MatMul/Gemm with constant weights: nothing to quantize")
    quantize_dynamic(model, dst, op_types_to_quantize=["MatMul", "Gemm", "Gather"],
                     nodes_to_quantize=nodes + embeddings, weight_type=QuantType.QInt8,
                     # One scale per output channel: per-tensor scales cost tiny.en ~3 WER
                     # points on short commands for no measurable speed gain.
                     per_channel=True)
    if embeddings:
        quantized = onnx.load(str(dst))
        if share_embedding_rows(quantized):
            onnx.save(quantized, str(dst))


def share_embedding_rows(model: onnx.ModelProto) -> int:
    """Look tied embeddings up in the projection's int8 table; how many tables were dropped.

    After `untie_embeddings` the quantizer stores a tied embedding twice: E^T as per-channel
    int8 for the projection, and E as per-tensor uint8 for the lookup (Whisper tiny.en: two
    20 MB tables). Each lookup `DequantizeLinear(Gather(E_q, ids))` becomes a lookup in E^T's
    int8 table, `Gather(E^T_q, ids, axis=1)` moved back to [..., d], times each row's own
    scale (`Gather(scale, ids)`; its zero point is 0). Same rows with a finer scale per token
    than the one per table, read from one table.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in (*graph.input, *graph.value_info)
             if v.type.tensor_type.HasField("shape")}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    shared = 0
    for gather in [n for n in graph.node if n.op_type == "Gather" and n.input[0].endswith("_quantized")]:
        base = gather.input[0].removesuffix("_quantized")
        table, scale, zero = (inits.get(f"{base}.T_{part}") for part in ("quantized", "scale", "zero_point"))
        after = readers.get(gather.output[0], [])
        rank = ranks.get(gather.input[1])
        if (table is None or scale is None or zero is None or rank is None or len(after) != 1
                or after[0].op_type != "DequantizeLinear" or len(scale.dims) != 1
                or numpy_helper.to_array(zero).any()):
            continue
        dequantize, ids, rows = after[0], gather.input[1], gather.output[0]
        nodes = [
            helper.make_node("Gather", [table.name, ids], [f"{rows}_by_dim"], axis=1),
            helper.make_node("Transpose", [f"{rows}_by_dim"], [rows], perm=[*range(1, rank + 1), 0]),
            helper.make_node("Cast", [rows], [f"{rows}_float"], to=TensorProto.FLOAT),
            helper.make_node("Gather", [scale.name, ids], [f"{rows}_scale"], axis=0),
            helper.make_node("Unsqueeze", [f"{rows}_scale", f"{rows}_last_axis"], [f"{rows}_scale_1"]),
            helper.make_node("Mul", [f"{rows}_float", f"{rows}_scale_1"], list(dequantize.output)),
        ]
        graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), f"{rows}_last_axis"))
        at = list(graph.node).index(gather)
        for old in (gather, dequantize):
            graph.node.remove(old)
        for offset, node in enumerate(nodes):
            graph.node.insert(at + offset, node)
        unused = {gather.input[0], *dequantize.input[1:]} - {i for n in graph.node for i in n.input}
        for name in unused:
            graph.initializer.remove(inits[name])
        shared += 1
    return shared


def quantize_int4_block(src: Path, dst: Path) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    model = load_onnx(src)
    untie_embeddings(model)  # the vocabulary projection becomes a MatMul, its embedding a Gather
    if not weight_matmuls(model):
        raise UsageError(f"{src}: no MatMul/Gemm with constant weights: nothing to quantize")
    ops = ("MatMul", "Gather")
    axes = (("MatMul", 0), ("Gather", 1))  # blocks along the reduced axis; embedding rows stay whole
    config = DefaultWeightOnlyQuantConfig(block_size=INT4_BLOCK, is_symmetric=True, accuracy_level=4,
                                          bits=4, op_types_to_quantize=ops, quant_axes=axes)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=INT4_BLOCK, is_symmetric=True,
                                     accuracy_level=4, op_types_to_quantize=ops, quant_axes=axes,
                                     algo_config=config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
        quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)


def quantize_int8_all(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(load_onnx(src), dst, weight_type=QuantType.QInt8)


def quantize_fp16(src: Path, dst: Path) -> None:
    from onnxconverter_common import float16

    model = load_onnx(src)
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    own_casts = {n.name for n in model.graph.node if n.op_type in _TYPED_OPS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "-inf will be truncated to -10000": expected for masks
        converted = float16.convert_float_to_float16(model, keep_io_types=True)
    retarget_float_casts(converted, own_casts)
    cast_io_past_shape_ops(converted)
    harmonize_float_inputs(converted)
    onnx.save(converted, str(dst))


_SHAPE_OPS = {"Unsqueeze", "Squeeze", "Reshape", "Flatten"}
"""Ops that move values without computing: float16 changes nothing about them but their type."""


def cast_io_past_shape_ops(model: onnx.ModelProto) -> int:
    """Move the casts at float32 graph inputs and outputs past the shape ops next to them.

    The float32<->float16 casts then sit at the first and last ops that compute, which
    matters on onnxruntime's CPU: it has float16 kernels for shape ops but (on x86) none for
    Conv, so a cast in front of a Conv is dropped together with the cast back to float32 it
    inserts to run the Conv in float32, while one in front of an Unsqueeze really rounds the
    input. A HiFi-GAN's log-mel input (|x| up to 11.5) rounded to float16 moves its waveform
    by 0.02, twenty times what its float16 weights do. (The converter's own node block list
    cannot do this: a blocked node writing a graph output turns that output into float16.)
    Returns the number of casts moved.
    """
    graph = model.graph
    nodes = list(graph.node)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    inputs = {i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT}
    outputs = {o.name for o in graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT}
    stale: set[str] = set()
    moved = 0
    for cast in nodes:
        if cast.op_type != "Cast":
            continue
        if cast.input[0] in inputs:  # input -> Cast -> shape op  becomes  input -> shape op -> Cast
            users = consumers.get(cast.output[0], [])
            if len(users) != 1 or users[0].op_type not in _SHAPE_OPS or users[0].input[0] != cast.output[0]:
                continue
            first, second = users[0], cast
            stale.add(cast.output[0])
            first.input[0], cast.input[0] = cast.input[0], f"{cast.output[0]}.float32"
            cast.output[0], first.output[0] = first.output[0], cast.input[0]
        elif cast.output[0] in outputs:  # shape op -> Cast -> output  becomes  Cast -> shape op -> output
            shape = next((n for n in nodes if cast.input[0] in n.output), None)
            if shape is None or shape.op_type not in _SHAPE_OPS or len(consumers[cast.input[0]]) != 1:
                continue
            first, second = cast, shape
            stale.add(cast.input[0])
            cast.input[0], shape.input[0] = shape.input[0], f"{shape.output[0]}.float32"
            shape.output[0], cast.output[0] = cast.output[0], shape.input[0]
        else:
            continue
        at = min(list(graph.node).index(first), list(graph.node).index(second))
        graph.node.remove(first)
        graph.node.remove(second)
        graph.node.insert(at, second)
        graph.node.insert(at, first)
        moved += 1
    kept = [v for v in graph.value_info if v.name not in stale]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return moved


_SAME_TYPE_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "LessOrEqual",
                  "GreaterOrEqual", "Max", "Min", "Sum", "Mean", "Concat", "MatMul"}
"""Ops whose float inputs must all share one type."""
_SAME_TYPE_SLOTS = {"Where": (1, 2), "Pad": (0, 2), "Clip": (0, 1, 2), "Range": (0, 1, 2)}
"""Ops where only some inputs share the float type."""


def harmonize_float_inputs(model: onnx.ModelProto) -> int:
    """Cast float32 inputs to float16 where an op would otherwise mix the two.

    The converter leaves some float32 constants in place (e.g. a VITS attention mask's
    comparison value), which onnxruntime then rejects ("Type parameter (T) ... bound to
    different types"). Returns the number of casts inserted.
    """
    inferred = onnx.shape_inference.infer_shapes(model)
    types: dict[str, int] = {}
    for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        types[v.name] = v.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    for node in inferred.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    inserted = 0
    nodes = list(model.graph.node)
    for node in nodes:
        if node.op_type in _SAME_TYPE_OPS:
            slots = list(range(len(node.input)))
        elif node.op_type in _SAME_TYPE_SLOTS:
            slots = [i for i in _SAME_TYPE_SLOTS[node.op_type] if i < len(node.input)]
        else:
            continue
        kinds = {types.get(node.input[i]) for i in slots if node.input[i]}
        if not {TensorProto.FLOAT, TensorProto.FLOAT16} <= kinds:
            continue
        for i in slots:
            if types.get(node.input[i]) == TensorProto.FLOAT:
                cast_out = f"{node.input[i]}_as_fp16_{inserted}"
                cast = onnx.helper.make_node("Cast", [node.input[i]], [cast_out], to=TensorProto.FLOAT16,
                                             name=f"harmonize_cast_{inserted}")
                model.graph.node.insert(list(model.graph.node).index(node), cast)
                node.input[i] = cast_out
                inserted += 1
    return inserted


_TYPED_OPS = {"Cast": "to", "RandomNormalLike": "dtype", "RandomUniformLike": "dtype",
              "RandomNormal": "dtype", "RandomUniform": "dtype", "EyeLike": "dtype"}
"""Ops whose output type is an attribute the converter does not rewrite."""


def retarget_float_casts(model: onnx.ModelProto, own: set[str]) -> int:
    """Point the model's own Cast(to=FLOAT) (and random ops' dtype=FLOAT) at FLOAT16.

    Only nodes named in `own` (present before conversion) change: casts the converter
    inserted around graph I/O and blocked ops are left alone, and so is any node touching a
    graph input or output.
    """
    io = {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    changed = 0
    for node in model.graph.node:
        if node.op_type not in _TYPED_OPS or node.name not in own:
            continue
        if any(t in io for t in (*node.input, *node.output)):
            continue
        for attr in node.attribute:
            if attr.name == _TYPED_OPS[node.op_type] and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
                changed += 1
    return changed


class _Feeds:
    """onnxruntime's CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: Iterable[Feed]) -> None:
        self._it: Iterator[Feed] = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self._it, None)

    def rewind(self) -> None:  # pragma: no cover - only used by some calibrators
        pass


def quantize_int8_static(src: Path, dst: Path, calibration: list[Feed]) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    if not calibration:
        raise UsageError("int8-static needs calibration inputs")
    model = load_onnx(src)
    nodes = weight_matmuls(model)
    if not nodes:
        raise UsageError(f"{src}: no MatMul/Gemm with constant weights: nothing to quantize")
    reader: Any = _Feeds(calibration)
    with tempfile.TemporaryDirectory(prefix="calib-") as tmp:
        prepared = Path(tmp) / "model.onnx"
        onnx.save(model, str(prepared))
        quantize_static(
            prepared, dst, reader, quant_format=QuantFormat.QDQ, per_channel=True,
            op_types_to_quantize=["MatMul", "Gemm"], nodes_to_quantize=nodes,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )


def quantize(src: Path, dst: Path, mode: Mode, calibration: list[Feed] | None = None) -> None:
    """Write `src` compressed by `mode` to `dst` (atomically: a partial file never lands)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.partial")
    try:
        if mode == "int8-matmul":
            quantize_int8_matmul(src, tmp)
        elif mode == "fp16":
            quantize_fp16(src, tmp)
        elif mode == "int8-static":
            quantize_int8_static(src, tmp, calibration or [])
        elif mode == "int4-block":
            quantize_int4_block(src, tmp)
        elif mode == "int8-all":
            quantize_int8_all(src, tmp)
        else:
            raise UsageError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)
