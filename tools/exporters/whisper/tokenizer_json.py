"""A Hugging Face `tokenizer.json` for Whisper's vocabulary, built from openai-whisper's tiktoken files.

Used when the source is an openai-whisper `.pt` checkpoint, which carries no tokenizer;
CTranslate2 directories ship their own `tokenizer.json`, which is copied as is. The
layout follows the one those directories use (byte-level BPE, no normalizer), so the
runtime reads both the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from whisper.model import Whisper

from edge_agent.asr.tokenizer import byte_encoder
from edge_agent.errors import ModelError
from exporters.whisper.reference import Specials, tokenizer_for


def _text(token: bytes) -> str:
    table = byte_encoder()
    return "".join(table[b] for b in token)


def _merge_for(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The last merge BPE makes to build `token`, using only merges ranked below it."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best, best_rank = -1, limit
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            return None
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def build_tokenizer_json(model: Whisper) -> dict[str, Any]:
    encoding = tokenizer_for(model).encoding
    ranks: dict[bytes, int] = dict(encoding._mergeable_ranks)
    vocab = {_text(token): rank for token, rank in ranks.items()}
    eot = encoding._special_tokens["<|endoftext|>"]
    vocab["<|endoftext|>"] = eot  # the byte-level vocabulary's last entry, as in Whisper's own files
    merges = []
    for token, _rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        pair = _merge_for(token, ranks)
        if pair is not None:
            merges.append(f"{_text(pair[0])} {_text(pair[1])}")
    added = [
        {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for content, token_id in sorted(encoding._special_tokens.items(), key=lambda item: item[1])
    ]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "vocab": vocab, "merges": merges},
    }


_SPECIAL_NAMES = {
    "sot": "<|startoftranscript|>", "eot": "<|endoftext|>", "transcribe": "<|transcribe|>",
    "translate": "<|translate|>", "no_timestamps": "<|notimestamps|>",
}


def check_tokenizer(path: Path, sp: Specials) -> None:
    """The tokenizer file must name the special tokens with the ids the model was trained on."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        added = {t["content"]: int(t["id"]) for t in doc["added_tokens"]}
        vocab_size = len(doc["model"]["vocab"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path}: not a usable tokenizer.json ({exc})") from None
    for name, content in _SPECIAL_NAMES.items():
        want = getattr(sp, name)
        got = added.get(content)
        if got is not None and got != want:
            raise ModelError(f"{path}: {content} has id {got}, but the model uses {want}")
        if got is None and not (content == "<|endoftext|>" and vocab_size > want):
            raise ModelError(f"{path}: has no {content} token")
