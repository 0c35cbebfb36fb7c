"""Whisper encoder and KV-cached decoder as two ONNX graphs (the format in FORMAT.md).

The encoder takes any even number of mel frames up to 3000 and returns every decoder
layer's cross-attention keys and values, so they are computed once per utterance. The
decoder takes new tokens plus the self-attention cache and returns logits and the
grown cache; decoding cost is linear in tokens.

We use the TorchScript-based exporter (`dynamo=False`): it handles the data-dependent
slicing of the positional embeddings with plain `dynamic_axes`. Two traps: openai-whisper's
SDPA path cannot be traced by it (switched off while exporting), and the vocabulary
projection (`x @ W.T`, W the token embedding) is constant-folded into a second, transposed
copy of the embedding matrix: 80 MB of the 193 MB tiny.en decoder. `share_embedding`
rewrites that MatMul as a `Gemm` with transB=1 reading the embedding itself.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from whisper.model import MultiHeadAttention, ResidualAttentionBlock, Whisper

from exporters.whisper.reference import encode

OPSET = 17
ENCODER_INPUTS = ["mel"]
ENCODER_OUTPUTS = ["cross_k", "cross_v"]
DECODER_INPUTS = ["tokens", "self_k_in", "self_v_in", "cross_k", "cross_v", "offset"]
DECODER_OUTPUTS = ["logits", "self_k_out", "self_v_out"]


@contextlib.contextmanager
def sdpa_disabled() -> Iterator[None]:
    """openai-whisper's scaled_dot_product_attention path breaks the TorchScript exporter."""
    saved = MultiHeadAttention.use_sdpa
    MultiHeadAttention.use_sdpa = False
    try:
        yield
    finally:
        MultiHeadAttention.use_sdpa = saved


class EncoderGraph(nn.Module):
    """mel [1, n_mels, n_frames] -> cross_k, cross_v [n_text_layer, 1, n_frames/2, n_text_state]."""

    def __init__(self, model: Whisper) -> None:
        super().__init__()
        self.model = model

    def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = encode(self.model, mel)
        blocks = self.model.decoder.blocks
        keys = torch.stack([b.cross_attn.key(features) for b in blocks])
        values = torch.stack([b.cross_attn.value(features) for b in blocks])
        return keys, values


def _heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """[1, n, d_model] -> [1, heads, n, d_head]"""
    return x.view(x.shape[0], x.shape[1], n_head, -1).permute(0, 2, 1, 3)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_head: int,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """Whisper's attention arithmetic (q and k each scaled by d_head^-1/4), without SDPA."""
    scale = (q.shape[-1] // n_head) ** -0.25
    qh, kh, vh = _heads(q, n_head) * scale, _heads(k, n_head) * scale, _heads(v, n_head)
    scores = qh @ kh.transpose(-1, -2)
    if mask is not None:
        scores = scores + mask
    weights = scores.softmax(dim=-1)
    out: torch.Tensor = (weights @ vh).permute(0, 2, 1, 3).flatten(start_dim=2)
    return out


class DecoderGraph(nn.Module):
    """One decoder step over `tokens` with a self-attention cache; see FORMAT.md for shapes."""

    def __init__(self, model: Whisper) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, self_k_in: torch.Tensor, self_v_in: torch.Tensor,  # noqa: PLR0917
                cross_k: torch.Tensor, cross_v: torch.Tensor, offset: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dec = self.model.decoder
        n_tokens = tokens.shape[1]
        positions = torch.arange(n_tokens, device=tokens.device) + offset
        x = dec.token_embedding(tokens) + F.embedding(positions, dec.positional_embedding)[None]
        # Query i sits at position offset + i and may see cache slots 0..offset + i.
        key_positions = torch.arange(self_k_in.shape[2] + n_tokens, device=tokens.device)
        future = key_positions[None, :] > positions[:, None]
        mask = torch.zeros(future.shape, dtype=x.dtype).masked_fill(future, -math.inf)
        new_k: list[torch.Tensor] = []
        new_v: list[torch.Tensor] = []
        for i, block in enumerate(dec.blocks):
            x, k, v = self._block(block, x, past=(self_k_in[i], self_v_in[i]), cross=(cross_k[i], cross_v[i]),
                                  mask=mask)
            new_k.append(k)
            new_v.append(v)
        x = dec.ln(x)
        weight = dec.token_embedding.weight
        logits = F.linear(x.reshape(-1, x.shape[-1]), weight).reshape(1, n_tokens, weight.shape[0])
        return logits, torch.stack(new_k), torch.stack(new_v)

    @staticmethod
    def _block(block: ResidualAttentionBlock, x: torch.Tensor, *, past: tuple[torch.Tensor, torch.Tensor],
               cross: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn, cross_attn = block.attn, block.cross_attn
        assert cross_attn is not None and block.cross_attn_ln is not None  # decoder blocks have both
        h = block.attn_ln(x)
        k = torch.cat([past[0], attn.key(h)], dim=1)
        v = torch.cat([past[1], attn.value(h)], dim=1)
        x = x + attn.out(attend(attn.query(h), k, v, attn.n_head, mask))
        h = block.cross_attn_ln(x)
        x = x + cross_attn.out(attend(cross_attn.query(h), cross[0], cross[1], cross_attn.n_head))
        x = x + block.mlp(block.mlp_ln(x))
        return x, k, v


def export_encoder(model: Whisper, path: Path) -> None:
    n_frames = 2 * model.dims.n_audio_ctx
    mel = torch.randn(1, model.dims.n_mels, n_frames)
    with sdpa_disabled(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings about dynamic shapes are expected
        torch.onnx.export(
            EncoderGraph(model).eval(), (mel,), str(path), dynamo=False, opset_version=OPSET,
            input_names=ENCODER_INPUTS, output_names=ENCODER_OUTPUTS,
            dynamic_axes={"mel": {2: "n_frames"}, "cross_k": {2: "n_audio_frames"},
                          "cross_v": {2: "n_audio_frames"}},
            do_constant_folding=True,
        )
    # The tracer names the stacked batch axis after a Concat; it is always 1.
    model_proto = onnx.load(str(path))
    shape = [model.dims.n_text_layer, 1, "n_audio_frames", model.dims.n_text_state]
    for output in model_proto.graph.output:
        set_shape(output, shape)
    onnx.save(model_proto, str(path))


def set_shape(value: onnx.ValueInfoProto, shape: list[int | str]) -> None:
    dims = value.type.tensor_type.shape.dim
    del dims[:]
    for d in shape:
        dim = dims.add()
        if isinstance(d, int):
            dim.dim_value = d
        else:
            dim.dim_param = d


def export_decoder(model: Whisper, path: Path) -> None:
    d = model.dims
    n_past, n_tokens, n_audio = 3, 2, 10
    args = (
        torch.zeros(1, n_tokens, dtype=torch.int64),
        torch.randn(d.n_text_layer, 1, n_past, d.n_text_state),
        torch.randn(d.n_text_layer, 1, n_past, d.n_text_state),
        torch.randn(d.n_text_layer, 1, n_audio, d.n_text_state),
        torch.randn(d.n_text_layer, 1, n_audio, d.n_text_state),
        torch.tensor(n_past, dtype=torch.int64),
    )
    with sdpa_disabled(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            DecoderGraph(model).eval(), args, str(path), dynamo=False, opset_version=OPSET,
            input_names=DECODER_INPUTS, output_names=DECODER_OUTPUTS,
            dynamic_axes={
                "tokens": {1: "n_tokens"},
                "self_k_in": {2: "n_past"}, "self_v_in": {2: "n_past"},
                "cross_k": {2: "n_audio_frames"}, "cross_v": {2: "n_audio_frames"},
                "logits": {1: "n_tokens"},
                "self_k_out": {2: "n_total"}, "self_v_out": {2: "n_total"},
            },
            do_constant_folding=True,
        )
    model = onnx.load(str(path))
    if not share_embedding(model, "model.decoder.token_embedding.weight"):
        raise RuntimeError("decoder export: vocabulary projection not found; the graph layout changed")
    onnx.save(model, str(path))


def share_embedding(model: onnx.ModelProto, embedding: str) -> bool:
    """Make the vocabulary projection read `embedding` instead of a transposed copy.

    Returns False (and changes nothing) when no MatMul reads an exact transposed copy.
    """
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    if embedding not in inits:
        return False
    weight = numpy_helper.to_array(inits[embedding])
    for index, node in enumerate(graph.node):
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        copy = inits[node.input[1]]
        if tuple(copy.dims) != weight.shape[::-1]:
            continue
        if not np.array_equal(numpy_helper.to_array(copy), weight.T):
            continue
        gemm = onnx.helper.make_node("Gemm", [node.input[0], embedding], list(node.output),
                                     name=node.name or "vocab_projection", transB=1)
        graph.node.remove(node)
        graph.node.insert(index, gemm)
        if not any(copy.name in n.input for n in graph.node):
            graph.initializer.remove(copy)
        return True
    return False
