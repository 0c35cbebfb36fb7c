"""Token ids back to text with a Hugging Face `tokenizer.json` (byte-level BPE), in pure Python.

Whisper's vocabulary is GPT-2's byte-level BPE: each token is a string over 256
printable stand-in characters, one per byte. Decoding joins the tokens' strings,
maps each character back to its byte and reads the bytes as UTF-8. The ASR only
ever decodes, so no merge table is needed at run time.
"""

from __future__ import annotations

import json
from array import array
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


MAX_TOKEN_ID = 1 << 20
"""Ids above this are refused: the tables are indexed by id (Whisper's vocabularies end near 52,000)."""


class Tokenizer:
    """Decodes token ids; knows which ids are special (`<|...|>`) tokens.

    Each id's bytes lie in one blob, found by offset. A dict of the 51,864 vocabulary strings
    (and the JSON they came from, whose freed memory those strings kept from being reused) cost
    a listening device 9 MB of its peak (`benchmarks.rss --wake`: 332.9 -> 323.1 MB).
    """

    def __init__(self, pieces: dict[int, str], special: set[int]) -> None:
        self.special = frozenset(special)
        size = max(pieces, default=-1) + 1
        if size > MAX_TOKEN_ID or min(pieces, default=0) < 0:
            raise ValueError(f"token ids must lie in 0..{MAX_TOKEN_ID - 1}")
        table = byte_decoder()
        blob = bytearray()
        self._starts = array("q", bytes(8 * (size + 1)))
        self._known = bytearray(size)
        for token in range(size):
            piece = pieces.get(token)
            if piece is not None:
                self._known[token] = 1
                blob.extend(piece.encode("utf-8") if token in self.special else _spelled(piece, table))
            self._starts[token + 1] = len(blob)
        self._blob = bytes(blob)

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
            del doc, model  # before the tables are built, so their memory can be reused
            return Tokenizer(pieces, special)
        except FileNotFoundError:
            raise ModelError(f"{path}: no such tokenizer file") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(f"{path}: not a usable tokenizer.json ({exc})") from None

    def __len__(self) -> int:
        return sum(self._known)

    def _bytes(self, token: int) -> bytes | None:
        if not 0 <= token < len(self._known) or not self._known[token]:
            return None
        return self._blob[self._starts[token]:self._starts[token + 1]]

    def token_id(self, piece: str) -> int:
        """The id of a vocabulary string such as `<|en|>` or `Ġ` (a scan: for set-up, not per token)."""
        raw, spelled = piece.encode("utf-8"), _spelled(piece, byte_decoder())
        for token in range(len(self._known)):
            if self._bytes(token) == (raw if token in self.special else spelled):
                return token
        raise ModelError(f"tokenizer has no token {piece!r}")

    def decode(self, tokens: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of `tokens`; special tokens and ids the file does not name are skipped."""
        data = bytearray()
        for token in map(int, tokens):
            piece = self._bytes(token)
            if piece is not None and not (skip_special and token in self.special):
                data.extend(piece)
        return data.decode("utf-8", errors="replace")


def _spelled(piece: str, table: dict[str, int]) -> bytes:
    """The bytes a vocabulary string stands for (a character outside the byte map as its UTF-8)."""
    return b"".join(bytes((table[c],)) if c in table else c.encode("utf-8") for c in piece)
