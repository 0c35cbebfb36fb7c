"""Word error rate: the project's one measure of transcription accuracy, as a fraction.

`bench asr`, the exporter's manifest and the tests all score with `wer()`: corpus level (every
word edit over every reference word), 0.0 for perfect, 1.0 for one edit per reference word
(it can exceed 1 when the hypothesis inserts words). Both sides are normalised alike first:
`edge_agent.text.normalize` spells out numbers, times, units and abbreviations, so "10:30" and
"ten thirty" agree; then case, punctuation and hyphens are dropped and apostrophes inside a
word kept ("don't" is one word).

Written here rather than taken from `jiwer` because the device runs `bench asr` too, and the
part that matters, the normalisation, is ours either way; the edit distance is a dozen lines.
tests/text/test_wer.py checks it against jiwer on the same normalised words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from edge_agent.text.normalize import normalize

UNIT = "fraction"
"""How `wer()` is expressed; recorded beside every stored WER (`wer_unit` in an export manifest)."""

_NOT_WORD = re.compile(r"[^\w']+|_")


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
    """Corpus WER as a fraction: all word edits over all reference words.

    With no reference words at all, 0.0 if the hypotheses are empty too, else 1.0.
    """
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    edits = total = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        ref_words = words(ref)
        edits += edit_distance(ref_words, words(hyp))
        total += len(ref_words)
    return edits / total if total else float(edits > 0)
