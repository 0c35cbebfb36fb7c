"""A Piper VITS graph split at the latent, so audio can start before a sentence is decoded.

A Piper voice is one ONNX graph: text encoder, duration predictor and flow turn
phoneme ids into a latent `z` of shape `[1, channels, frames]`, then a HiFi-GAN
vocoder turns each latent frame into `hop` samples. The vocoder is most of the
work. So we cut the graph in two:

- the *front* (everything up to the latent), run once per sentence, its
  weights in a file of their own so that two sessions can share them;
- the *vocoder*, run in windows (`edge_agent.tts.windowed`: 2-D convolutions,
  context cut to what each layer still reaches).

The split is prepared once per model (keyed by the source's sha256) and kept in
the model cache; a graph we do not recognise (another vocoder shape, a
multi-speaker voice whose vocoder takes the speaker embedding) falls back to
running the original graph whole.

Several versions may share one cache (an upgrade while the old process still
runs, two virtualenvs): each prepared copy is named by what it depends on (the
split by `FORMAT`, its CPU-optimized copy by onnxruntime version and CPU), a
process holds what it loads from (`edge_agent.tts.inuse`), and a copy is only
ever removed by a process of its own version, when it does not load and nobody
holds it. Other versions' copies are left alone: a process of an older version
takes no locks, so nothing tells whether it is still reading them, and two
versions side by side would otherwise remove each other's copy at every start.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edge_agent.atomic import fsync_dir
from edge_agent.errors import ModelError
from edge_agent.runtime.sessions import cpu_fingerprint, index_weights, save_optimized
from edge_agent.tts import inuse
from edge_agent.tts.windowed import UnsupportedGraph, VocoderInfo, window_graph

log = logging.getLogger(__name__)

FORMAT = 6
"""Bumped whenever the prepared files would differ for the same source model."""

FRONT_WEIGHTS = "front.weights"
"""The front's weights, beside `front.onnx` (onnx external data)."""

DECODER_PREFIX = "/dec/"
"""Node-name scope of the vocoder in Piper's exports (torch.onnx module scopes)."""


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
    vocoder, info = window_graph(nodes, weights, latent, channels)
    front = _front(model, {id(n) for n in nodes} | {id(n) for n in tail}, latent)
    return front, vocoder, info


@dataclass(frozen=True)
class Prepared:
    """Paths of a prepared split and what the runtime needs to drive it."""

    front: Path
    vocoder: Path
    info: VocoderInfo

    @property
    def directory(self) -> Path:
        return self.front.parent


def prepare(model_path: Path, directory: Path) -> Prepared:
    """The split of `model_path`, made once into `directory/v<FORMAT>/` and reused after.

    `directory` should name the source uniquely (its sha256). Files are written
    to a temporary directory and renamed into place, so a crash or a concurrent
    process never leaves a half-written split behind. A damaged split is made
    again unless another process holds it (`inuse.Held`).
    """
    target = directory / f"v{FORMAT}"
    meta = target / "prepared.json"
    if meta.is_file():
        try:
            doc = json.loads(meta.read_text(encoding="utf-8"))
            if doc.get("format") == FORMAT:
                return Prepared(target / "front.onnx", target / "vocoder.onnx",
                                VocoderInfo.from_json(doc["vocoder"]))
        except (OSError, ValueError, TypeError, KeyError):
            pass
        log.info("%s: prepared split is damaged; preparing again", target)
    if target.exists() and not inuse.remove_unheld(target):
        raise inuse.Held(f"{target}: damaged, but another process is using it")
    import onnx

    try:
        model = onnx.load(str(model_path))
    except Exception as exc:  # protobuf decode errors have no common type
        raise ModelError(f"{model_path}: cannot read ONNX model: {exc}") from None
    front, vocoder, info = split(model)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=directory))
    try:
        inuse.mark(tmp)
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
        os.replace(tmp, target)
        fsync_dir(directory)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        # another process won the race; its split is as good as ours
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Prepared(target / "front.onnx", target / "vocoder.onnx", info)


CPU_PREFIX = "cpu-"
"""`<split>/cpu-<fingerprint>/`: the split as onnxruntime optimizes it for this CPU."""


def prepare_cpu(prepared: Prepared, fingerprint: str | None = None) -> Prepared | None:
    """The split pre-optimized for this CPU, made once into a subdirectory of the split's.

    onnxruntime's graph optimisation is most of a session's start-up (the front's
    took ~4x as long as loading an optimized copy, measured here): doing it once
    makes every later `say` start sooner. The copy is only valid for this CPU and
    onnxruntime version, so its directory is named by `fingerprint` (default
    `cpu_fingerprint()`); copies for others are left alone (see the module's
    docstring). None (optimize at every load) if it cannot be written.
    """
    directory = prepared.directory
    target = directory / f"{CPU_PREFIX}{fingerprint or cpu_fingerprint()}"
    optimized = Prepared(target / "front.onnx", target / "vocoder.onnx", prepared.info)
    if target.is_dir():
        return optimized
    tmp = Path(tempfile.mkdtemp(prefix=".cpu.", dir=directory))
    try:
        inuse.mark(tmp)
        save_optimized(prepared.front, tmp / "front.onnx")
        save_optimized(prepared.vocoder, tmp / "vocoder.onnx")
        for item in tmp.iterdir():
            with open(item, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
        fsync_dir(directory)
    except (OSError, ModelError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if target.is_dir():  # another process made it first
            return optimized
        log.warning("%s: cannot keep a CPU-optimized copy (%s); optimizing at every load", directory, exc)
        return None
    return optimized
