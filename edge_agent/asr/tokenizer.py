"""Token ids back to text with a Hugging Face `tokenizer.json` (byte-level BPE), in pure Python.

Whisper's vocabulary is GPT-2's byte-level BPE: each token is a string over 256
printable stand-in characters, one per byte. Decoding joins the tokens' strings,
maps each character back to its byte and reads the bytes as UTF-8. The ASR only
ever decodes, so no merge table is needed at run time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from edge_agent.errors import ModelError

SPACE_TOKEN = "\u0120"
"""How byte-level BPE spells a leading space ('Ġ')."""


@lru_cache(maxsize=1)
def byte_encoder() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable stand-in character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """`byte_encoder` inverted: stand-in character -> byte."""
    return {c: b for b, c in byte_encoder().items()}


class Tokenizer:
    """Decodes token ids; knows which ids are special (`<|...|>`) tokens."""

    def __init__(self, pieces: dict[int, str], special: set[int]) -> None:
        self._pieces = pieces
        self.special = frozenset(special)
        self._ids = {piece: i for i, piece in pieces.items()}

    @staticmethod
    def load(path: Path) -> Tokenizer:
        """Read a `tokenizer.json` whose model is byte-level BPE."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            model = doc["model"]
            if model.get("type") != "BPE":
                raise ModelError(f"{path}: tokenizer model is {model.get('type')!r}, expected BPE")
            if (doc.get("decoder") or {}).get("type") != "ByteLevel":
                raise ModelError(f"{path}: tokenizer decoder is not ByteLevel")
            pieces = {int(i): str(piece) for piece, i in model["vocab"].items()}
            special = set()
            for added in doc.get("added_tokens", []):
                pieces[int(added["id"])] = str(added["content"])
                if added.get("special", False):
                    special.add(int(added["id"]))
        except FileNotFoundError:
            raise ModelError(f"{path}: no such tokenizer file") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(f"{path}: not a usable tokenizer.json ({exc})") from None
        return Tokenizer(pieces, special)

    def __len__(self) -> int:
        return len(self._pieces)

    def piece(self, token: int) -> str | None:
        """The vocabulary string of `token`, or None for ids outside the file (e.g. timestamps)."""
        return self._pieces.get(token)

    def token_id(self, piece: str) -> int:
        """The id of a vocabulary string such as `<|en|>` or `Ġ`."""
        try:
            return self._ids[piece]
        except KeyError:
            raise ModelError(f"tokenizer has no token {piece!r}") from None

    def decode(self, tokens: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of `tokens`; special tokens and ids the file does not name are skipped."""
        table = byte_decoder()
        data = bytearray()
        for token in tokens:
            piece = self._pieces.get(int(token))
            if piece is None or (skip_special and token in self.special):
                continue
            if token in self.special:
                data.extend(piece.encode("utf-8"))
                continue
            for char in piece:
                byte = table.get(char)
                if byte is None:
                    data.extend(char.encode("utf-8"))
                else:
                    data.append(byte)
        return data.decode("utf-8", errors="replace")
