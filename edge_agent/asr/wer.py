"""Word error rate, after a normalisation that ignores case, punctuation and how numbers are written."""

from __future__ import annotations

import re
from collections.abc import Sequence

from edge_agent.tts.normalize import normalize

_NOT_WORD = re.compile(r"[^a-z0-9' ]+")


def words(text: str) -> list[str]:
    """Lower-case words with numbers, times and units spelled out ('10' and 'ten' agree)."""
    spoken = normalize(text).lower().replace("-", " ")
    return [w.strip("'") for w in _NOT_WORD.sub(" ", spoken).split() if w.strip("'")]


def edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    """Levenshtein distance over words (substitutions, insertions, deletions)."""
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i]
        for j, h in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h)))
        previous = current
    return previous[-1]


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER: all word edits over all reference words."""
    if len(references) != len(hypotheses):
        raise ValueError("references and hypotheses differ in number")
    edits = sum(edit_distance(words(r), words(h)) for r, h in zip(references, hypotheses, strict=True))
    total = sum(len(words(r)) for r in references)
    return edits / total if total else float(edits > 0)
