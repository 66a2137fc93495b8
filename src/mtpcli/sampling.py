"""Logits -> probabilities: the ONE function that shapes both the target's p and the draft's q.

Temperature, then top-k, then top-p (nucleus), then min-p, then renormalisation. At temperature 0 the
row is one-hot on the argmax (greedy). Works on any leading shape: (..., V).
"""

from __future__ import annotations

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
    """The distribution, and whether each row's top-p nucleus was found among the CANDIDATES most likely tokens
    (None when there was nothing to check). Where it was, the result equals the full sort's (`full=True`);
    where not, the row keeps only the candidates of its nucleus: a caller that needs the exact p (the target's)
    must redo such rows with full=True. A partial selection costs a fraction of sorting a 150k vocabulary."""
    logits = logits.astype(mx.float32)
    vocab = logits.shape[-1]
    if sp.greedy:
        return (mx.arange(vocab) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32), None
    p = mx.softmax(logits / sp.temp, axis=-1)
    top_k = sp.top_k if 0 < sp.top_k < vocab else 0
    nucleus = 0.0 < sp.top_p < 1.0
    complete = None
    if nucleus and not full and max(top_k, CANDIDATES) < vocab:
        # the most likely tokens, sorted: the same leading values, in the same order, as the full sort's
        cand = mx.sort(mx.topk(p, max(top_k, CANDIDATES), axis=-1), axis=-1)[..., ::-1]
        if top_k:
            kth = cand[..., top_k - 1 : top_k]
            p = mx.where(p >= kth, p, 0.0)
            cand = mx.where(cand >= kth, cand, 0.0)
        mass = sp.top_p * p.sum(-1, keepdims=True)
        cum = mx.cumsum(cand, axis=-1)
        kept = mx.where(cum - cand < mass, cand, mx.inf)
        p = mx.where(p >= kept.min(axis=-1, keepdims=True), p, 0.0)
        complete = cum[..., -1] >= mass[..., 0]  # the nucleus ends inside the candidates (the same sums)
    else:
        if top_k:
            kth = mx.topk(p, top_k, axis=-1).min(axis=-1, keepdims=True) if not full else \
                mx.sort(p, axis=-1)[..., vocab - top_k : vocab - top_k + 1]
            p = mx.where(p >= kth, p, 0.0)
        if nucleus:
            # Keep the smallest set of most likely tokens whose mass reaches top_p (ties at the edge kept).
            sorted_p = mx.sort(p, axis=-1)[..., ::-1]
            mass_before = mx.cumsum(sorted_p, axis=-1) - sorted_p
            kept = mx.where(mass_before < sp.top_p * p.sum(-1, keepdims=True), sorted_p, mx.inf)
            p = mx.where(p >= kept.min(axis=-1, keepdims=True), p, 0.0)
    if sp.min_p > 0.0:
        p = mx.where(p >= sp.min_p * p.max(axis=-1, keepdims=True), p, 0.0)
    return p / p.sum(axis=-1, keepdims=True), complete


def sample(p: mx.array, key: mx.array) -> mx.array:
    """Draw one token per row of the probability array `p` (..., V)."""
    return mx.random.categorical(mx.log(p), axis=-1, key=key)
