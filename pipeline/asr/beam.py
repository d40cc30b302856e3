"""Beam search bookkeeping for one segment: its live hypotheses (one decoder row each) and finished ones.

faster-whisper's beam search (CTranslate2's, beam 5, patience 1, length penalty 1): each step, the best
2 x size continuations of all live hypotheses, ranked by summed log-probability, fill the next `size`
live hypotheses; an <|endoftext|> among the first `size` finishes its hypothesis instead. The segment
is done once `size` hypotheses have finished. The winner is the finished hypothesis with the best
log-probability per token (the sum divided by its length).

Our guards (token cap, loop stop, one-digit run) stop a hypothesis too: it leaves the beam as finished
but `guarded`, and loses to any hypothesis that ended by itself. In a window shorter than 30 s (zero
padding after the speech) a hypothesis that says its phrase twice ("10 of clubs 10 of clubs") scores
better per token than the one that ended after it; such doubtful ones lose to sound ones. A segment whose winner is guarded is
retried in a longer window, as a greedy row is.

Pure Python over numpy rows, so it is tested without a model; ``GreedyDecoder`` runs the decoder steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # text tokens so far (no prompt, no <|endoftext|>)
    logprob: float  # summed log-probability of its tokens (and of <|endoftext|> once it ended)
    guarded: bool = False  # stopped by a guard, not ended by <|endoftext|>

    def score(self, length_penalty: float = 1.0) -> float:
        """How beams rank finished hypotheses of different lengths: the log-probability divided by the
        length to the power `length_penalty` (1: per token, CTranslate2's default; 0: the sum)."""
        return self.logprob / max(1, len(self.tokens)) ** length_penalty


class SegmentBeam:
    """One segment's hypotheses. ``live[i]`` is decoded in the i-th of the segment's decoder rows."""

    def __init__(self, size: int, end_of_text: int, length_penalty: float = 1.0) -> None:
        if size < 1:
            raise ValueError(f"beam size must be >= 1, got {size}")
        self.size = size
        self.end_of_text = end_of_text
        self.length_penalty = length_penalty
        self.live: list[Hypothesis] = [Hypothesis((), 0.0)]
        self.finished: list[Hypothesis] = []

    @property
    def candidates_per_row(self) -> int:
        """Tokens to read per row: twice the beam, as the best 2 x size candidates of the whole beam
        may all come from one row, and <|endoftext|>s among them leave `size` others to go on with."""
        return 2 * self.size

    @property
    def done(self) -> bool:
        return len(self.finished) >= self.size or not self.live

    def advance(
        self, top_tokens: np.ndarray, top_logprobs: np.ndarray, stop: Callable[[tuple[int, ...]], bool]
    ) -> list[int]:
        """Take one step: ``top_tokens``/``top_logprobs`` [len(live), k] are each live row's best next
        tokens. ``stop`` tells whether a grown hypothesis must stop (a guard). Returns, for each new live
        hypothesis, the index of the live row it grew from (its decoder cache is that row's).

        As CTranslate2 (faster-whisper's engine) does: of the 2 x size best candidates, an
        <|endoftext|> among the first `size` finishes its hypothesis, the others are skipped; live
        hypotheses are the best non-ending candidates, `size` of them."""
        ranked: list[tuple[float, int, int]] = []  # (summed log-prob, source row, token)
        for row, hyp in enumerate(self.live):
            for token, logprob in zip(top_tokens[row], top_logprobs[row], strict=True):
                if np.isfinite(logprob):
                    ranked.append((hyp.logprob + float(logprob), row, int(token)))
        ranked.sort(key=lambda c: -c[0])
        live: list[Hypothesis] = []
        sources: list[int] = []
        for rank, (total, row, token) in enumerate(ranked[: self.candidates_per_row]):
            if len(live) == self.size:
                break
            if token == self.end_of_text:
                if rank < self.size:
                    self.finished.append(Hypothesis(self.live[row].tokens, total))
                continue
            tokens = (*self.live[row].tokens, token)
            if stop(tokens):
                self.finished.append(Hypothesis(tokens, total, guarded=True))
                continue
            live.append(Hypothesis(tokens, total))
            sources.append(row)
        self.live = [] if self.done else live
        return [] if self.done else sources

    def best(self, doubtful: Callable[[tuple[int, ...]], bool] = lambda _: False) -> Hypothesis:
        """The winner: a hypothesis that ended by itself before a guarded one, a sound one before a
        ``doubtful`` one (one that says a phrase twice), then the best score."""
        pool: Sequence[Hypothesis] = self.finished or self.live
        return max(pool, key=lambda h: (not h.guarded, not doubtful(h.tokens), h.score(self.length_penalty)))
