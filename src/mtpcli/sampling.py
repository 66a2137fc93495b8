"""Logits -> probabilities: the ONE function that shapes both the target's p and the draft's q.

mlx-lm's law (mlx_lm.sample_utils.make_sampler): top-p, min-p and top-k truncate the UNTEMPERED log-probabilities
(each keeps the most likely tokens down to a cut, so together they keep the tokens above the highest of the three
cuts), then the temperature shapes what is kept. At temperature 0 the row is one-hot on the argmax (greedy). Ties
at a cut are kept (mlx-lm's top-k keeps exactly k, breaking a tie at the k-th value arbitrarily). Works on any
leading shape: (..., V).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class SamplingParams:
    temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temp == 0.0


CANDIDATES = 4096  # top-p looks for its nucleus among this many most likely tokens first (a partial selection)


def probs(logits: mx.array, sp: SamplingParams, full: bool = False) -> mx.array:
    """Return the sampling distribution (float32, rows sum to 1) for each row of `logits`."""
    return shaped(logits, sp, full)[0]


def shaped(logits: mx.array, sp: SamplingParams, full: bool = False) -> tuple[mx.array, mx.array | None]:
    """The distribution, and whether each row's cut was found among the CANDIDATES most likely tokens (None when
    there was nothing to check). Where it was, the result equals the full sort's (`full=True`); where not, the row
    keeps only the candidates: a caller that needs the exact p (the target's) must redo such rows with full=True.
    A partial selection costs a fraction of sorting a 150k vocabulary."""
    logits = logits.astype(mx.float32)
    vocab = logits.shape[-1]
    if sp.greedy:
        return (mx.arange(vocab) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32), None
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # untempered log-probabilities
    cut = None  # per row: the least log-probability kept
    top_k = sp.top_k if 0 < sp.top_k < vocab else 0
    if top_k:
        cut = mx.sort(lp, axis=-1)[..., vocab - top_k : vocab - top_k + 1] if full else \
            mx.topk(lp, top_k, axis=-1).min(axis=-1, keepdims=True)
    if sp.min_p > 0.0:
        floor = lp.max(axis=-1, keepdims=True) + math.log(sp.min_p)
        cut = floor if cut is None else mx.maximum(cut, floor)
    complete = None
    if 0.0 < sp.top_p < 1.0:  # the smallest set of most likely tokens whose mass reaches top_p (ties kept)
        n = max(top_k, CANDIDATES)
        partial = not full and n < vocab
        cand = (mx.sort(mx.topk(lp, n, axis=-1), axis=-1) if partial else mx.sort(lp, axis=-1))[..., ::-1]
        c = mx.exp(cand)
        cum = mx.cumsum(c, axis=-1)
        mass = sp.top_p * mx.exp(lp).sum(axis=-1, keepdims=True)
        nucleus = mx.where(cum - c < mass, cand, mx.inf).min(axis=-1, keepdims=True)
        if partial:  # found: the nucleus ends inside the candidates, or another cut lies above their last
            complete = (cum[..., -1:] >= mass) if cut is None else (cum[..., -1:] >= mass) | (cut >= cand[..., -1:])
            complete = complete[..., 0]
        cut = nucleus if cut is None else mx.maximum(cut, nucleus)
    p = mx.exp(lp) if sp.temp == 1.0 else mx.softmax(logits / sp.temp, axis=-1)
    if cut is not None:
        p = mx.where(lp >= cut, p, 0.0)
    return p / p.sum(axis=-1, keepdims=True), complete


def sample(p: mx.array, key: mx.array) -> mx.array:
    """Draw one token per row of the probability array `p` (..., V)."""
    return mx.random.categorical(mx.log(p), axis=-1, key=key)
