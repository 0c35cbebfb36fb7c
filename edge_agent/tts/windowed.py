"""A convolutional vocoder run in windows, so audio can start before the whole input is decoded.

A HiFi-GAN vocoder (Piper's, and the mel vocoders `edge-export vocoder` writes)
turns each frame of its input (a latent or a mel spectrogram, `[1, channels,
frames]`) into `hop` samples, and it is convolutional: a window of frames, given
enough frames of context on each side, decodes to the same samples as the whole
input does. The graph is rewritten from 1-D to 2-D convolutions (`[N, C, 1, T]`),
which onnxruntime runs through its blocked NCHWc kernels on x86: the same
arithmetic, faster single-threaded than the 1-D path the exporters emit.

Context is expensive only if every layer computes it: the first layers need
all of it, the last ones (the upsampled, costly part) almost none. So the
windowed graph *cuts* its tensors where nothing bypasses them (around each
upsampler), keeping only the samples the layers after the cut can still reach
(`cut_points`). A window then costs about two frames of overlap per side
instead of `context`, and small windows are cheap: the first one of a stream is
0.28 s, so playback starts after a fraction of the work, and the rest are cut
so that single-threaded workers share the input evenly.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError
from edge_agent.runtime.providers import Profile

FIRST_FRAMES = 24
"""Latent frames in the first window (24 x 256 samples = 0.28 s at 22.05 kHz)."""

WINDOW_FRAMES = 64
"""Longest window after the first (0.74 s at 22.05 kHz)."""

MIN_FRAMES = 16
"""Shortest window a sentence is cut into to keep every worker busy."""


class UnsupportedGraph(ModelError):
    """The ONNX graph is not a vocoder we know how to run in windows."""


@dataclass(frozen=True)
class VocoderInfo:
    """What the runtime needs to know about a prepared vocoder."""

    channels: int
    """Latent channels."""
    hop: int
    """Samples per latent frame."""
    context: int
    """Latent frames of context on each side that make a window decode exactly."""
    latent: str
    """Name of the latent tensor (the front's output, the vocoder's input)."""
    cuts: tuple[tuple[int, int], ...] = ()
    """`(rate, keep)` of each cut the graph makes, in order (see `cut_points`)."""

    @staticmethod
    def from_json(doc: dict[str, Any]) -> VocoderInfo:
        return VocoderInfo(int(doc["channels"]), int(doc["hop"]), int(doc["context"]), str(doc["latent"]),
                           tuple((int(r), int(k)) for r, k in doc["cuts"]))


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _reach(nodes: list[Any], latent: str) -> tuple[dict[str, int], dict[str, Fraction]]:
    """Rate and reach of every tensor a chain of 1-D convolutions computes from the latent.

    A tensor's rate is its samples per latent frame; its reach is how far, in
    latent frames, a wrong value at the edge of the latent can spread into it:
    a conv adds half its dilated kernel at its rate, a transposed conv its
    kernel over its stride. Only 'same' convolutions and transposed convolutions
    that upsample by exactly their stride are accepted, so every tensor stays
    aligned with the latent (sample `i` at rate `r` belongs to frame `i // r`).
    """
    rate: dict[str, int] = {latent: 1}
    reach: dict[str, Fraction] = {latent: Fraction(0)}
    for node in nodes:
        inputs = [i for i in node.input if i in rate]
        if not inputs:
            continue
        r = rate[inputs[0]]
        if any(rate[i] != r for i in inputs):
            raise UnsupportedGraph(f"{node.name}: combines tensors of different rates")
        extent = max(reach[i] for i in inputs)
        if node.op_type in ("Conv", "ConvTranspose"):
            a = _attrs(node)
            kernel, dilation = a["kernel_shape"][0], a.get("dilations", [1])[0]
            stride, pads = a.get("strides", [1])[0], a.get("pads", [0, 0])
            if node.op_type == "Conv":
                span = dilation * (kernel - 1)
                if stride != 1 or span % 2 or list(pads) != [span // 2, span // 2]:
                    raise UnsupportedGraph(f"{node.name}: not a 'same' unstrided convolution")
                extent += Fraction(span, 2 * r)
            else:
                if (dilation != 1 or pads[0] != pads[1] or kernel - stride != 2 * pads[0]
                        or any(a.get("output_padding", [0]))):
                    raise UnsupportedGraph(f"{node.name}: does not upsample by exactly its stride")
                extent += Fraction(math.ceil(kernel / stride), r)
                r *= stride
        for out in node.output:
            rate[out], reach[out] = r, extent
    if nodes[-1].output[0] not in rate:
        raise UnsupportedGraph("the vocoder's output does not depend on the latent")
    return rate, reach


def receptive_context(nodes: list[Any], latent: str) -> tuple[int, int]:
    """`(hop, context frames)`: a window given `context` frames either side decodes exactly."""
    rate, reach = _reach(nodes, latent)
    final = nodes[-1].output[0]
    return rate[final], math.ceil(reach[final]) + 1


def cut_points(nodes: list[Any], latent: str) -> list[tuple[str, int, int]]:
    """`(tensor, rate, keep)` for each place the vocoder may drop context it no longer needs.

    A window's context is needed in full only by the first layers: a tensor
    whose remaining layers reach `d` latent frames needs only `d * rate` samples
    (`keep`, plus one) beyond the window's edge. Cuts are made where one tensor
    carries everything (nothing bypasses it), at the inputs and outputs of the
    upsamplers and the inputs of the convolutions there.
    """
    rate, reach = _reach(nodes, latent)
    total = reach[nodes[-1].output[0]]
    last_use = {i: n for n, node in enumerate(nodes) for i in node.input if i in rate}
    wanted = ({n.input[0] for n in nodes if n.op_type in ("Conv", "ConvTranspose")}
              | {n.output[0] for n in nodes if n.op_type == "ConvTranspose"}) - {latent}
    cuts: list[tuple[str, int, int]] = []
    live = {latent}
    for n, node in enumerate(nodes):
        live = {t for t in live | {o for o in node.output if o in rate} if last_use.get(t, -1) > n}
        if len(live) == 1 and (tensor := next(iter(live))) in wanted and tensor not in {c[0] for c in cuts}:
            cuts.append((tensor, rate[tensor], math.ceil((total - reach[tensor]) * rate[tensor]) + 1))
    return cuts


_ELEMENTWISE = frozenset({"Add", "Mul", "Sub", "Div", "LeakyRelu", "Relu", "Tanh", "Sigmoid", "Identity"})
"""Ops that do not care whether a tensor is 3-D or 4-D."""


def _vocoder_2d(nodes: list[Any], weights: dict[str, Any], latent: str, channels: int,
                cuts: list[str]) -> Any:
    """The vocoder as a graph of 2-D ops on `[1, C, 1, T]`, returning flat audio samples.

    Each tensor in `cuts` is sliced on its time axis to `[starts[n], ends[n])`,
    two int64 inputs with one entry per cut, before anything else uses it.
    """
    from onnx import TensorProto, helper, numpy_helper

    inits: dict[str, Any] = {"vits.axes2": np.array([2], np.int64), "vits.flat": np.array([-1], np.int64),
                             "vits.axes3": np.array([3], np.int64)}
    out_nodes = [helper.make_node("Unsqueeze", [latent, "vits.axes2"], ["vits.z4"], name="vits/to4d")]
    rename = {latent: "vits.z4"}
    last = nodes[-1].output[0]
    for n in range(len(cuts)):
        inits[f"vits.cut{n}"] = np.array([n], np.int64)
        inits[f"vits.cut{n}.next"] = np.array([n + 1], np.int64)
        for bound in ("starts", "ends"):
            out_nodes.append(helper.make_node("Slice", [bound, f"vits.cut{n}", f"vits.cut{n}.next"],
                                              [f"vits.cut{n}.{bound}"], name=f"vits/cut{n}/{bound}"))
    for node in nodes:
        inputs = [rename.get(i, i) for i in node.input]
        a = _attrs(node)
        if node.op_type in ("Conv", "ConvTranspose"):
            kernel = a["kernel_shape"]
            if len(kernel) != 1:
                raise UnsupportedGraph(f"{node.name}: a {len(kernel)}-D convolution")
            w = weights[node.input[1]]
            name = f"{node.input[1]}.2d"
            inits[name] = w[:, :, None, :]
            inputs[1] = name
            pads = a.get("pads", [0, 0])
            attrs = {
                "kernel_shape": [1, kernel[0]],
                "pads": [0, pads[0], 0, pads[1]],
                "dilations": [1, a.get("dilations", [1])[0]],
                "strides": [1, a.get("strides", [1])[0]],
                "group": a.get("group", 1),
            }
            if node.op_type == "ConvTranspose" and "output_padding" in a:
                attrs["output_padding"] = [0, a["output_padding"][0]]
            out_nodes.append(
                helper.make_node(node.op_type, inputs, list(node.output), name=node.name, **attrs))
            constants = node.input[2:]
        elif node.op_type in _ELEMENTWISE:
            out_nodes.append(helper.make_node(node.op_type, inputs, list(node.output), name=node.name, **a))
            constants = node.input
        else:
            raise UnsupportedGraph(f"{node.name}: {node.op_type} in the vocoder")
        inits.update((i, weights[i]) for i in constants if i in weights)
        for out in node.output:
            if out in cuts:
                n = cuts.index(out)
                rename[out] = f"{out}.cut"
                out_nodes.append(helper.make_node(
                    "Slice", [out, f"vits.cut{n}.starts", f"vits.cut{n}.ends", "vits.axes3"], [rename[out]],
                    name=f"vits/cut{n}"))
    out_nodes.append(helper.make_node("Reshape", [last, "vits.flat"], ["audio"], name="vits/flatten"))
    bounds = [helper.make_tensor_value_info(b, TensorProto.INT64, [len(cuts)]) for b in ("starts", "ends")]
    graph = helper.make_graph(
        out_nodes, "vocoder-2d",
        [helper.make_tensor_value_info(latent, TensorProto.FLOAT, [1, channels, "frames"])]
        + (bounds if cuts else []),
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["samples"])],
        [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)


def window_graph(nodes: list[Any], weights: dict[str, Any], latent: str, channels: int,
                 ) -> tuple[Any, VocoderInfo]:
    """The windowed 2-D graph of a vocoder's `nodes` (reading `latent`) and what drives it."""
    import onnx

    hop, context = receptive_context(nodes, latent)
    cuts = cut_points(nodes, latent)
    vocoder = _vocoder_2d(nodes, weights, latent, channels, [t for t, _, _ in cuts])
    onnx.checker.check_model(vocoder)
    return vocoder, VocoderInfo(channels, hop, context, latent, tuple((r, k) for _, r, k in cuts))


def window_model(model: Any) -> tuple[Any, VocoderInfo]:
    """`window_graph` of a model that is a vocoder alone: one input `[1, channels, frames]`, one output."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise UnsupportedGraph(f"{len(inputs)} inputs and {len(graph.output)} outputs, expected one each")
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != 3 or not dims[1].dim_value:
        raise UnsupportedGraph(f"input {inputs[0].name!r} is not [1, channels, frames]")
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    return window_graph(list(graph.node), weights, inputs[0].name, int(dims[1].dim_value))


def plan_windows(frames: int, *, first: bool, workers: int = 1) -> list[tuple[int, int]]:
    """`[start, end)` latent frames of each window: equal windows of at most `WINDOW_FRAMES`.

    The first sentence of a stream starts with `FIRST_FRAMES` alone, so
    playback begins after a fraction of the work. The rest is cut into a
    multiple of `workers` windows (none shorter than `MIN_FRAMES`), so the
    workers share a sentence evenly and finish it together. Windows are small
    because the cuts make context cheap.
    """
    windows = []
    start = 0
    if first and frames - FIRST_FRAMES >= FIRST_FRAMES // 2:  # a short tail rides along instead
        windows.append((0, FIRST_FRAMES))
        start = FIRST_FRAMES
    rest = frames - start
    if rest > 0:
        pieces = -(-math.ceil(rest / WINDOW_FRAMES) // workers) * workers
        pieces = max(1, min(pieces, rest // MIN_FRAMES))
        windows.extend(itertools.pairwise(start + round(i * rest / pieces) for i in range(pieces + 1)))
    return windows


FIRST_PIECE_FRAMES = 6
"""Shortest piece a first window is cut into (a window costs ~1.7 ms besides its frames here)."""


def split_window(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """`[start, end)` in up to `parts` equal pieces of at least `FIRST_PIECE_FRAMES`, to decode side by
    side: the first window of a stream, when every worker is free for it."""
    parts = max(1, min(parts, (end - start) // FIRST_PIECE_FRAMES))
    return list(itertools.pairwise(start + round(i * (end - start) / parts) for i in range(parts + 1)))


def window_profile(info: VocoderInfo) -> Profile:
    """The shapes a windowed vocoder is fed: windows of up to `WINDOW_FRAMES` (or a first window of
    `FIRST_FRAMES` plus its tail) with their context either side, and one start/end per cut."""
    def shapes(frames: int) -> dict[str, tuple[int, ...]]:
        fed: dict[str, tuple[int, ...]] = {info.latent: (1, info.channels, frames)}
        return fed | ({"starts": (len(info.cuts),), "ends": (len(info.cuts),)} if info.cuts else {})

    longest = max(WINDOW_FRAMES, FIRST_FRAMES + FIRST_FRAMES // 2) + 2 * info.context
    return Profile(shapes(1), shapes(WINDOW_FRAMES // 2 + 2 * info.context), shapes(longest))


class Vocoder:
    """Runs the 2-D vocoder on windows of a latent."""

    def __init__(self, session: Any, info: VocoderInfo) -> None:
        self.session = session
        self.info = info

    def decode(self, z: Any, start: int = 0, end: int | None = None) -> Samples:
        """Samples for latent frames `[start, end)` of `z`.

        The window is decoded with `context` frames either side, which each cut
        then trims to what the layers after it still need.
        """
        info = self.info
        frames = z.shape[-1]
        end = frames if end is None else end
        lo, hi = max(0, start - info.context), min(frames, end + info.context)
        feed = {info.latent: np.ascontiguousarray(z[:, :, lo:hi])}
        rate, first, stop = 1, lo, hi  # the current tensor's span, in samples at `rate`
        if info.cuts:
            starts, ends = [], []
            for cut_rate, keep in info.cuts:
                first, stop = first * (cut_rate // rate), stop * (cut_rate // rate)
                kept = max(first, start * cut_rate - keep), min(stop, end * cut_rate + keep)
                starts.append(kept[0] - first)
                ends.append(kept[1] - first)
                (first, stop), rate = kept, cut_rate
            feed["starts"], feed["ends"] = np.array(starts, np.int64), np.array(ends, np.int64)
        audio = self.session.run(None, feed)[0]
        offset = first * (info.hop // rate)
        trimmed: Samples = audio[start * info.hop - offset: end * info.hop - offset]
        return trimmed
