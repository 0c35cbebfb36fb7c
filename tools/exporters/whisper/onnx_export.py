"""Whisper encoder and KV-cached decoder as two ONNX graphs (the format in FORMAT.md).

The encoder takes any even number of mel frames up to 3000 and returns every decoder
layer's cross-attention keys and values, so they are computed once per utterance. The
decoder takes new tokens plus the self-attention cache and returns logits and the
grown cache; decoding cost is linear in tokens. Its tokens and cache have a batch axis
(`n_batch`) so a beam search runs every live hypothesis in one call, reading the weights
once; the cross-attention keys and values stay at batch 1 and broadcast (every hypothesis
listens to the same audio).

Both graphs go through torch's `torch.export`-based exporter (`dynamo=True`; the
TorchScript one is deprecated). The frame, token and cache axes are `torch.export` dims
(the encoder's frame count as `2 * k`: its second convolution halves it), so the positional
slices stay symbolic and a zero-length cache runs although the trace saw three entries.
openai-whisper's SDPA path is switched off while exporting, so the graph computes Whisper's
own attention arithmetic, which the PyTorch reference also runs. The vocabulary projection
reads the token embedding itself (a `Gemm` with transB=1); the TorchScript exporter used to
constant-fold a second, transposed copy (80 MB of tiny.en's decoder), and
`check_embedding_stored_once` keeps that from coming back. The encoder's attention is then
fused into onnxruntime's `MultiHeadAttention` (`fuse.py`), which never holds a whole score
matrix: Whisper's 30 s window costs 46 MB less memory.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from whisper.model import MultiHeadAttention, ResidualAttentionBlock, Whisper

from exporters.torch_onnx import quiet
from exporters.whisper.fuse import fuse_attention
from exporters.whisper.reference import encode

OPSET = 18
ENCODER_INPUTS = ["mel"]
ENCODER_OUTPUTS = ["cross_k", "cross_v"]
DECODER_INPUTS = ["tokens", "self_k_in", "self_v_in", "cross_k", "cross_v", "offset"]
DECODER_OUTPUTS = ["logits", "self_k_out", "self_v_out"]
MAX_BATCH = 16
"""Most sequences one decoder call takes (`asr.beam_size` is at most 16)."""


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
    """[batch, n, d_model] -> [batch, heads, n, d_head]"""
    return x.view(x.shape[0], x.shape[1], n_head, -1).permute(0, 2, 1, 3)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_head: int,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """Whisper's attention arithmetic (q and k each scaled by d_head^-1/4), without SDPA; a key
    and value of batch 1 serve every query of the batch."""
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
        logits = F.linear(x.reshape(-1, x.shape[-1]), weight).reshape(tokens.shape[0], n_tokens, -1)
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
    d = model.dims
    half = torch.export.Dim("n_audio_frames", min=1, max=d.n_audio_ctx)
    mel = torch.randn(1, d.n_mels, 200)
    with sdpa_disabled(), quiet():
        torch.onnx.export(
            EncoderGraph(model).eval(), (mel,), str(path), dynamo=True, external_data=False,
            opset_version=OPSET, input_names=ENCODER_INPUTS, output_names=ENCODER_OUTPUTS,
            dynamic_shapes=({2: 2 * half},), verbose=False,
        )
    # Name the axes as FORMAT.md does (the exporter writes `2*n_audio_frames` and its own symbols).
    model_proto = onnx.load(str(path))
    set_shape(model_proto.graph.input[0], [1, d.n_mels, "n_frames"])
    for output in model_proto.graph.output:
        set_shape(output, [d.n_text_layer, 1, "n_audio_frames", d.n_text_state])
    fused = fuse_attention(model_proto)
    if fused != d.n_audio_layer:
        raise RuntimeError(f"encoder export: fused {fused} attentions, expected one per layer "
                           f"({d.n_audio_layer}); the exporter's graph layout changed")
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
    # A batch of 2 in the trace: torch.export specializes a dimension it sees at size 1.
    n_batch, n_past, n_tokens, n_audio = 2, 3, 2, 10
    args = (
        torch.zeros(n_batch, n_tokens, dtype=torch.int64),
        torch.randn(d.n_text_layer, n_batch, n_past, d.n_text_state),
        torch.randn(d.n_text_layer, n_batch, n_past, d.n_text_state),
        torch.randn(d.n_text_layer, 1, n_audio, d.n_text_state),
        torch.randn(d.n_text_layer, 1, n_audio, d.n_text_state),
        torch.tensor(n_past, dtype=torch.int64),
    )
    batch = torch.export.Dim("n_batch", min=1, max=MAX_BATCH)
    tokens = torch.export.Dim("n_tokens", min=1, max=d.n_text_ctx)
    past = torch.export.Dim("n_past", min=0, max=d.n_text_ctx)
    audio = torch.export.Dim("n_audio_frames", min=1, max=d.n_audio_ctx)
    with sdpa_disabled(), quiet():
        torch.onnx.export(
            DecoderGraph(model).eval(), args, str(path), dynamo=True, external_data=False,
            opset_version=OPSET, input_names=DECODER_INPUTS, output_names=DECODER_OUTPUTS,
            dynamic_shapes=({0: batch, 1: tokens}, {1: batch, 2: past}, {1: batch, 2: past}, {2: audio},
                            {2: audio}, None), verbose=False,
        )
    model_proto = onnx.load(str(path))
    for output in model_proto.graph.output[1:]:  # the exporter writes `n_tokens + n_past`
        set_shape(output, [d.n_text_layer, "n_batch", "n_total", d.n_text_state])
    check_embedding_stored_once(model_proto, d.n_vocab, d.n_text_state)
    onnx.save(model_proto, str(path))


def check_embedding_stored_once(model: onnx.ModelProto, n_vocab: int, n_state: int) -> None:
    """Fail if the graph holds the token embedding twice (a transposed copy for the projection)."""
    tables = [i.name for i in model.graph.initializer if sorted(i.dims) == sorted([n_vocab, n_state])]
    if len(tables) != 1:
        raise RuntimeError(f"decoder export: {len(tables)} vocabulary-sized tables ({tables}), expected the "
                           "token embedding once; the exporter's graph layout changed")
