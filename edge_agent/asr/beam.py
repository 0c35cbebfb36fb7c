"""Beam search for Whisper's decoder: the selection rules of openai-whisper's `BeamSearchDecoder`.

`Beam` holds the bookkeeping, not the model: each step the caller gives it every
live hypothesis's next-token log-probabilities (suppressed tokens at -inf), and it
keeps the `size` best continuations by summed log-probability. From each hypothesis
the `size + 1` likeliest tokens are candidates; ranked together, end-of-text ones
become finished and the rest fill the beam until it holds `size`. Search stops once
`size` sequences have finished (patience 1); `best()` ranks the finished ones by
their summed log-probability over their length (openai-whisper without a length
penalty), after topping them up with the live ones when decoding ran out of budget.

The decoder state of a hypothesis (its KV cache) rides along as an opaque `state`:
continuations of one hypothesis share it, as the decoder never writes into its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Hypothesis:
    """One sequence in the beam."""

    tokens: tuple[int, ...]
    """Sampled token ids, without the prompt (the last one not yet fed to the decoder)."""
    sum_logprob: float
    state: Any
    """The decoder's cache after every token but the last (whatever the caller keeps there)."""


class Beam:
    """The live and finished hypotheses of one beam search over one utterance."""

    def __init__(self, size: int, eot: int, state: Any) -> None:
        if size < 1:
            raise ValueError(f"beam size must be at least 1, not {size}")
        self.size = size
        self.eot = eot
        self.live = [Hypothesis((), 0.0, state)]
        self.finished: dict[tuple[int, ...], float] = {}
        """Finished sequences (end-of-text excluded) and their summed log-probability (included)."""

    @property
    def done(self) -> bool:
        return len(self.finished) >= self.size

    def advance(self, logprobs: list[npt.NDArray[np.floating[Any]]], states: list[Any]) -> None:
        """One step: `logprobs[i]` and `states[i]` are what the decoder gave for `self.live[i]`."""
        scores: dict[tuple[int, ...], float] = {}
        sources: dict[tuple[int, ...], Any] = {}
        for hyp, row, state in zip(self.live, logprobs, states, strict=True):
            top = np.argpartition(row, -(self.size + 1))[-(self.size + 1):]
            for token in top.tolist():
                sequence = (*hyp.tokens, token)
                scores[sequence] = hyp.sum_logprob + float(row[token])
                sources[sequence] = state
        live: list[Hypothesis] = []
        newly: dict[tuple[int, ...], float] = {}
        for sequence in sorted(scores, key=scores.__getitem__, reverse=True):
            if sequence[-1] == self.eot:
                newly[sequence[:-1]] = scores[sequence]
                continue
            live.append(Hypothesis(sequence, scores[sequence], sources[sequence]))
            if len(live) == self.size:
                break
        for sequence in sorted(newly, key=newly.__getitem__, reverse=True):
            if len(self.finished) >= self.size:
                break
            self.finished.setdefault(sequence, newly[sequence])
        self.live = live

    def best(self) -> tuple[tuple[int, ...], float]:
        """The winning sequence (without end-of-text) and its summed log-probability."""
        finished = dict(self.finished)
        for hyp in sorted(self.live, key=lambda h: h.sum_logprob, reverse=True):
            if len(finished) >= self.size:
                break
            finished.setdefault(hyp.tokens, hyp.sum_logprob)
        return max(finished.items(), key=lambda item: item[1] / max(1, len(item[0])))
