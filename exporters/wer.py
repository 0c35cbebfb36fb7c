"""Word error rate over a set of transcripts (corpus level: total edits / total reference words)."""

from __future__ import annotations

import re
from collections.abc import Sequence

_PUNCT = re.compile(r"[^\w\s']")
_SPACE = re.compile(r"\s+")


def normalize(text: str) -> list[str]:
    """Lower case, punctuation and hyphens to spaces, apostrophes kept ("don't" stays one word)."""
    return _SPACE.sub(" ", _PUNCT.sub(" ", text.lower().replace("-", " "))).split()


def edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    """Levenshtein distance between word sequences."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """WER in percent of reference words; 0 for an empty reference set with empty hypotheses."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    edits = words = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        r, h = normalize(ref), normalize(hyp)
        edits += edit_distance(r, h)
        words += len(r)
    if words == 0:
        return 0.0 if edits == 0 else 100.0
    return 100.0 * edits / words
