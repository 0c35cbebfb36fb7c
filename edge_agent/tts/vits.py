"""A Piper VITS graph split at the latent, so audio can start before a sentence is decoded.

A Piper voice is one ONNX graph: text encoder, duration predictor and flow turn
phoneme ids into a latent `z` of shape `[1, channels, frames]`, then a HiFi-GAN
vocoder turns each latent frame into `hop` samples. The vocoder is most of the
work, and it is convolutional: a window of frames, given enough frames of
context on each side, decodes to the same samples as the whole sentence does.
So we cut the graph in two:

- the *front* (everything up to the latent), run once per sentence;
- the *vocoder*, rewritten from 1-D to 2-D convolutions (`[N, C, 1, T]`), which
  onnxruntime runs through its blocked NCHWc kernels on x86: the same
  arithmetic, about 8% faster single-threaded than the 1-D path the exporter
  emitted (though it gains little from a second intra-op thread, so windows
  run side by side on single-threaded workers instead).

The first window of a stream is small, so playback starts after a fraction of
the vocoder's work; the next grows by `GROWTH`, so it is ready long before the
audio before it has played; the rest is cut into windows that the workers
decode side by side, while the caller's thread runs the next sentence's front.

The split is prepared once per model (keyed by the source's sha256) and kept in
the model cache; a graph we do not recognise (another vocoder shape, a
multi-speaker voice whose vocoder takes the speaker embedding) falls back to
running the original graph whole.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.atomic import fsync_dir
from edge_agent.errors import ModelError
from edge_agent.tts.voice import Samples

log = logging.getLogger(__name__)

FORMAT = 3
"""Bumped whenever the prepared files would differ for the same source model."""

DECODER_PREFIX = "/dec/"
"""Node-name scope of the vocoder in Piper's exports (torch.onnx module scopes)."""

FIRST_FRAMES = 24
"""Latent frames in the first window (24 x 256 samples = 0.28 s at 22.05 kHz)."""

GROWTH = 4
"""Each window is this many times the previous one."""

MAX_FRAMES = 384
"""Longest window (4.5 s at 22.05 kHz)."""


class UnsupportedGraph(ModelError):
    """The ONNX graph is not a Piper VITS we know how to split."""


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


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _decoder_nodes(graph: Any) -> tuple[list[Any], str]:
    """The vocoder's nodes and its one input (the latent)."""
    nodes = [n for n in graph.node if n.name.startswith(DECODER_PREFIX)]
    if not nodes:
        raise UnsupportedGraph(f"no nodes under {DECODER_PREFIX!r}")
    produced = {o for n in nodes for o in n.output}
    initializers = {i.name for i in graph.initializer}
    external = {i for n in nodes for i in n.input if i and i not in produced and i not in initializers}
    if len(external) != 1:
        raise UnsupportedGraph(
            f"the vocoder takes {len(external)} inputs ({sorted(external)}), expected the latent alone")
    if len(graph.output) != 1:
        raise UnsupportedGraph(f"{len(graph.output)} graph outputs, expected one")
    return nodes, external.pop()


def receptive_context(nodes: list[Any], latent: str) -> tuple[int, int]:
    """`(hop, context frames)` of a chain of 1-D convolutions, from their shapes alone.

    For every tensor we track its rate (samples per latent frame) and how far,
    in latent frames, its values reach on either side; a conv adds half its
    dilated kernel at its rate, a transposed conv its kernel over its stride.
    """
    rate: dict[str, int] = {latent: 1}
    reach: dict[str, float] = {latent: 0.0}
    for node in nodes:
        inputs = [i for i in node.input if i in rate]
        if not inputs:
            continue
        r = rate[inputs[0]]
        extent = max(reach[i] for i in inputs)
        if node.op_type == "Conv":
            a = _attrs(node)
            if a.get("strides", [1]) != [1]:
                raise UnsupportedGraph(f"{node.name}: a strided convolution in the vocoder")
            kernel, dilation = a["kernel_shape"][0], a.get("dilations", [1])[0]
            extent += dilation * (kernel - 1) / 2 / r
        elif node.op_type == "ConvTranspose":
            a = _attrs(node)
            stride = a["strides"][0]
            extent += math.ceil(a["kernel_shape"][0] / stride) / r
            r *= stride
        for out in node.output:
            rate[out], reach[out] = r, extent
    final = nodes[-1].output[0]
    if final not in rate:
        raise UnsupportedGraph("the vocoder's output does not depend on the latent")
    return rate[final], math.ceil(reach[final]) + 1


_ELEMENTWISE = frozenset({"Add", "Mul", "Sub", "Div", "LeakyRelu", "Relu", "Tanh", "Sigmoid", "Identity"})
"""Ops that do not care whether a tensor is 3-D or 4-D."""


def _vocoder_2d(nodes: list[Any], weights: dict[str, Any], latent: str, channels: int) -> Any:
    """The vocoder as a graph of 2-D ops on `[1, C, 1, T]`, returning flat audio samples."""
    from onnx import TensorProto, helper, numpy_helper

    inits: dict[str, Any] = {"vits.axes2": np.array([2], np.int64), "vits.flat": np.array([-1], np.int64)}
    out_nodes = [helper.make_node("Unsqueeze", [latent, "vits.axes2"], ["vits.z4"], name="vits/to4d")]
    rename = {latent: "vits.z4"}
    last = nodes[-1].output[0]
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
    out_nodes.append(helper.make_node("Reshape", [last, "vits.flat"], ["audio"], name="vits/flatten"))
    graph = helper.make_graph(
        out_nodes, "piper-vocoder-2d",
        [helper.make_tensor_value_info(latent, TensorProto.FLOAT, [1, channels, "frames"])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["samples"])],
        [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)


def _front(model: Any, dropped: set[int], latent: str) -> Any:
    """A copy of `model` without the vocoder, returning the latent."""
    from onnx import TensorProto, helper

    graph = model.graph
    kept = [n for n in graph.node if id(n) not in dropped]
    used = {i for n in kept for i in n.input}
    front = helper.make_graph(
        kept, f"{graph.name}-front", list(graph.input),
        [helper.make_tensor_value_info(latent, TensorProto.FLOAT, [1, None, None])],
        [i for i in graph.initializer if i.name in used],
    )
    return helper.make_model(front, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                             producer_name=model.producer_name)


def split(model: Any) -> tuple[Any, Any, VocoderInfo]:
    """`(front, vocoder, info)` from a loaded Piper ONNX model; `UnsupportedGraph` if it is not one."""
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    nodes, latent = _decoder_nodes(graph)
    # Everything after the vocoder must only reshape its output (Piper adds a unit axis).
    produced = {o for d in nodes for o in d.output}
    tail = [n for n in graph.node if not n.name.startswith(DECODER_PREFIX)
            and any(i in produced for i in n.input)]
    if any(n.op_type not in ("Unsqueeze", "Squeeze", "Reshape", "Identity") for n in tail):
        raise UnsupportedGraph("the vocoder's output is processed further")
    consumed = {i for n in nodes for i in n.input}
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name in consumed}
    first_conv = next((n for n in nodes if n.op_type == "Conv"), None)
    if first_conv is None or latent not in first_conv.input:
        raise UnsupportedGraph("the vocoder does not start with a convolution of the latent")
    channels = int(weights[first_conv.input[1]].shape[1])
    hop, context = receptive_context(nodes, latent)
    front = _front(model, {id(n) for n in nodes} | {id(n) for n in tail}, latent)
    vocoder = _vocoder_2d(nodes, weights, latent, channels)
    onnx.checker.check_model(vocoder)
    return front, vocoder, VocoderInfo(channels, hop, context, latent)


@dataclass(frozen=True)
class Prepared:
    """Paths of a prepared split and what the runtime needs to drive it."""

    front: Path
    vocoder: Path
    info: VocoderInfo


def prepare(model_path: Path, directory: Path) -> Prepared:
    """The split of `model_path`, made once into `directory` and reused after.

    `directory` should name the source uniquely (its sha256). Files are written
    to a temporary directory and renamed into place, so a crash or a concurrent
    process never leaves a half-written split behind.
    """
    meta = directory / "prepared.json"
    if meta.is_file():
        try:
            doc = json.loads(meta.read_text(encoding="utf-8"))
            if doc.get("format") == FORMAT:
                return Prepared(directory / "front.onnx", directory / "vocoder.onnx",
                                VocoderInfo(**doc["vocoder"]))
        except (OSError, ValueError, TypeError, KeyError):
            pass
        log.info("%s: prepared split is stale or damaged; preparing again", directory)
    import onnx

    try:
        model = onnx.load(str(model_path))
    except Exception as exc:  # protobuf decode errors have no common type
        raise ModelError(f"{model_path}: cannot read ONNX model: {exc}") from None
    front, vocoder, info = split(model)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        onnx.save(front, str(tmp / "front.onnx"))
        onnx.save(vocoder, str(tmp / "vocoder.onnx"))
        (tmp / "prepared.json").write_text(
            json.dumps({"format": FORMAT, "source": str(model_path), "vocoder": asdict(info)}, indent=1),
            encoding="utf-8")
        for name in ("front.onnx", "vocoder.onnx", "prepared.json"):
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
        fsync_dir(directory.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        # another process won the race; its split is as good as ours
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Prepared(directory / "front.onnx", directory / "vocoder.onnx", info)


def plan_windows(frames: int, *, first: bool, spread: bool = False,
                 workers: int = 2) -> list[tuple[int, int]]:
    """`[start, end)` latent frames of each window.

    The first sentence of a stream starts with `FIRST_FRAMES`, then `GROWTH`
    times that, so playback begins early and never waits for the next window.
    For the first sentence, and with `spread` (the caller sets it for the last
    one, when nothing else is left to overlap), what remains is cut into
    at least `workers` equal windows, which the pool decodes side by side.
    Otherwise a sentence is cut only where it exceeds `MAX_FRAMES` (each cut
    costs `2 x context` frames of overlap) and runs beside the next sentence's
    front instead. `MAX_FRAMES` also bounds the vocoder's working memory
    however long the sentence.
    """
    windows = []
    start, size = 0, FIRST_FRAMES
    while first and start < frames and size < MAX_FRAMES:
        end = min(frames, start + size)
        if frames - end < size // 2:  # a short tail rides along with this window
            end = frames
        windows.append((start, end))
        start, size = end, size * GROWTH
    rest = frames - start
    if rest > 0:
        pieces = math.ceil(rest / MAX_FRAMES)
        if first or spread:
            pieces = max(pieces, min(workers, rest // FIRST_FRAMES))
        bounds = [start + round(i * rest / pieces) for i in range(pieces + 1)]
        windows.extend(itertools.pairwise(bounds))
    return windows


class Vocoder:
    """Runs the 2-D vocoder on windows of a latent."""

    def __init__(self, session: Any, info: VocoderInfo) -> None:
        self._session = session
        self.info = info

    def decode(self, z: Any, start: int = 0, end: int | None = None) -> Samples:
        """Samples for latent frames `[start, end)` of `z`, decoded with `context` frames either side."""
        frames = z.shape[-1]
        end = frames if end is None else end
        lo = max(0, start - self.info.context)
        hi = min(frames, end + self.info.context)
        audio = self._session.run(None, {self.info.latent: np.ascontiguousarray(z[:, :, lo:hi])})[0]
        hop = self.info.hop
        trimmed: Samples = audio[(start - lo) * hop: (end - lo) * hop]
        return trimmed
