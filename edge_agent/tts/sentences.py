"""Sentence splitting: the unit of streaming, interruption and offload fallback."""

from __future__ import annotations

import re

_BOUNDARY = re.compile(
    r"(?:(?<=[.!?…])|(?<=[.!?…][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])|\n\s*\n|\n(?=\s*[-*•])"
)
_CLAUSE = re.compile(r"(?<=[,;:—–])\s+")
_WORD_END = re.compile(r"\s+")

MAX_SENTENCE_CHARS = 300
"""Longer sentences are cut at clause boundaries (then at spaces) to bound model input."""


def split_sentences(text: str, max_chars: int = MAX_SENTENCE_CHARS) -> list[str]:
    """Split normalised text into sentences, none longer than `max_chars`."""
    out: list[str] = []
    for raw in _BOUNDARY.split(text):
        sentence = " ".join(raw.split())
        if sentence:
            out.extend(_cap(sentence, max_chars))
    return out


def _cap(sentence: str, max_chars: int) -> list[str]:
    if len(sentence) <= max_chars:
        return [sentence]
    pieces: list[str] = []
    current = ""
    for clause in _CLAUSE.split(sentence):
        for word_chunk in _hard_split(clause, max_chars):
            candidate = f"{current} {word_chunk}".strip()
            if len(candidate) <= max_chars:
                current = candidate
            else:
                pieces.append(current)
                current = word_chunk
    if current:
        pieces.append(current)
    return [p for p in pieces if p]


def _hard_split(clause: str, max_chars: int) -> list[str]:
    if len(clause) <= max_chars:
        return [clause]
    chunks: list[str] = []
    current = ""
    for full_word in _WORD_END.split(clause):
        # A "word" longer than a sentence (a URL, CJK text, a long code) is cut into pieces,
        # never shortened: every character is spoken.
        for word in (full_word[i:i + max_chars] for i in range(0, len(full_word), max_chars)):
            if current and len(current) + 1 + len(word) > max_chars:
                chunks.append(current)
                current = word
            else:
                current = f"{current} {word}".strip()
    if current:
        chunks.append(current)
    return chunks


def split_complete(text: str) -> tuple[str, str]:
    """`(complete, rest)`: the sentences of a growing text known to be over, and what may go on.

    A sentence is known to be over once a boundary and the start of the next one
    have arrived ("It is late. The" -> "It is late.", "The"), so text streamed in
    pieces (an LLM's answer) can be spoken a sentence at a time.
    """
    end = 0
    for match in _BOUNDARY.finditer(text):
        end = match.end()
    return text[:end].strip(), text[end:]
