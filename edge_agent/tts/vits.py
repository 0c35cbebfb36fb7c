"""A Piper VITS graph split at the latent, so audio can start before a sentence is decoded.

A Piper voice is one ONNX graph: text encoder, duration predictor and flow turn
phoneme ids into a latent `z` of shape `[1, channels, frames]`, then a HiFi-GAN
vocoder turns each latent frame into `hop` samples. The vocoder is most of the
work, and it is convolutional: a window of frames, given enough frames of
context on each side, decodes to the same samples as the whole sentence does.
So we cut the graph in two:

- the *front* (everything up to the latent), run once per sentence, its
  weights in a file of their own so that two sessions can share them;
- the *vocoder*, rewritten from 1-D to 2-D convolutions (`[N, C, 1, T]`), which
  onnxruntime runs through its blocked NCHWc kernels on x86: the same
  arithmetic, faster single-threaded than the 1-D path the exporter emitted.

Context is expensive only if every layer computes it: the first layers need
all of it, the last ones (the upsampled, costly part) almost none. So the
vocoder graph *cuts* its tensors where nothing bypasses them (around each
upsampler), keeping only the samples the layers after the cut can still reach
(`cut_points`). A window then costs about two frames of overlap per side
instead of `context`, and small windows are cheap: the first one of a stream is
0.28 s, so playback starts after a fraction of the work, and the rest are cut
so that single-threaded workers share a sentence evenly.

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
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.atomic import fsync_dir
from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError
from edge_agent.runtime import cpu_fingerprint, index_weights, save_optimized

log = logging.getLogger(__name__)

FORMAT = 5
"""Bumped whenever the prepared files would differ for the same source model."""

FRONT_WEIGHTS = "front.weights"
"""The front's weights, beside `front.onnx` (onnx external data)."""

DECODER_PREFIX = "/dec/"
"""Node-name scope of the vocoder in Piper's exports (torch.onnx module scopes)."""

FIRST_FRAMES = 24
"""Latent frames in the first window (24 x 256 samples = 0.28 s at 22.05 kHz)."""

WINDOW_FRAMES = 64
"""Longest window after the first (0.74 s at 22.05 kHz)."""

MIN_FRAMES = 16
"""Shortest window a sentence is cut into to keep every worker busy."""


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
    cuts: tuple[tuple[int, int], ...] = ()
    """`(rate, keep)` of each cut the graph makes, in order (see `cut_points`)."""

    @staticmethod
    def from_json(doc: dict[str, Any]) -> VocoderInfo:
        return VocoderInfo(int(doc["channels"]), int(doc["hop"]), int(doc["context"]), str(doc["latent"]),
                           tuple((int(r), int(k)) for r, k in doc["cuts"]))


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
        out_nodes, "piper-vocoder-2d",
        [helper.make_tensor_value_info(latent, TensorProto.FLOAT, [1, channels, "frames"])]
        + (bounds if cuts else []),
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
    cuts = cut_points(nodes, latent)
    front = _front(model, {id(n) for n in nodes} | {id(n) for n in tail}, latent)
    vocoder = _vocoder_2d(nodes, weights, latent, channels, [t for t, _, _ in cuts])
    onnx.checker.check_model(vocoder)
    return front, vocoder, VocoderInfo(channels, hop, context, latent, tuple((r, k) for _, r, k in cuts))


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
                                VocoderInfo.from_json(doc["vocoder"]))
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
        # The front's weights go to a file of their own, so its two sessions can share them.
        onnx.save(front, str(tmp / "front.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=FRONT_WEIGHTS, size_threshold=1024)
        index = index_weights(tmp / "front.onnx")  # so loading needs no `onnx` import
        onnx.save(vocoder, str(tmp / "vocoder.onnx"))
        (tmp / "prepared.json").write_text(
            json.dumps({"format": FORMAT, "source": str(model_path), "vocoder": asdict(info)}, indent=1),
            encoding="utf-8")
        for name in ("front.onnx", FRONT_WEIGHTS, index.name, "vocoder.onnx", "prepared.json"):
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


CPU_PREFIX = "cpu-"
"""`<prepared>/cpu-<fingerprint>/`: the split as onnxruntime optimizes it for this CPU."""


def prepare_cpu(prepared: Prepared, directory: Path) -> Prepared | None:
    """The split pre-optimized for this CPU, made once into a subdirectory of `directory`.

    onnxruntime's graph optimisation is most of a session's start-up (the front's
    took ~4x as long as loading an optimized copy, measured here): doing it once
    makes every later `say` start sooner. The copy is only valid for this CPU and
    onnxruntime version, so its directory is named by `cpu_fingerprint()` and one
    made for another is removed. None (optimize at every load) if it cannot be written.
    """
    target = directory / f"{CPU_PREFIX}{cpu_fingerprint()}"
    optimized = Prepared(target / "front.onnx", target / "vocoder.onnx", prepared.info)
    if target.is_dir():
        return optimized
    tmp = Path(tempfile.mkdtemp(prefix=".cpu.", dir=directory))
    try:
        save_optimized(prepared.front, tmp / "front.onnx")
        save_optimized(prepared.vocoder, tmp / "vocoder.onnx")
        for item in tmp.iterdir():
            with open(item, "rb") as fh:
                os.fsync(fh.fileno())
        for stale in directory.glob(f"{CPU_PREFIX}*"):  # made for another CPU or onnxruntime
            if stale.name != target.name:
                shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, target)
        fsync_dir(directory)
    except (OSError, ModelError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if target.is_dir():  # another process made it first
            return optimized
        log.warning("%s: cannot keep a CPU-optimized copy (%s); optimizing at every load", directory, exc)
        return None
    return optimized


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
