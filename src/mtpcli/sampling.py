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


def probs(logits: mx.array, sp: SamplingParams) -> mx.array:
    """Return the sampling distribution (float32, rows sum to 1) for each row of `logits`."""
    logits = logits.astype(mx.float32)
    vocab = logits.shape[-1]
    if sp.greedy:
        return (mx.arange(vocab) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    p = mx.softmax(logits / sp.temp, axis=-1)
    if 0 < sp.top_k < vocab:
        kth = mx.sort(p, axis=-1)[..., vocab - sp.top_k : vocab - sp.top_k + 1]
        p = mx.where(p >= kth, p, 0.0)
    if 0.0 < sp.top_p < 1.0:
        # Keep the smallest set of most likely tokens whose mass reaches top_p (ties at the edge kept).
        sorted_p = mx.sort(p, axis=-1)[..., ::-1]
        mass_before = mx.cumsum(sorted_p, axis=-1) - sorted_p
        kept = mx.where(mass_before < sp.top_p * p.sum(-1, keepdims=True), sorted_p, mx.inf)
        p = mx.where(p >= kept.min(axis=-1, keepdims=True), p, 0.0)
    if sp.min_p > 0.0:
        p = mx.where(p >= sp.min_p * p.max(axis=-1, keepdims=True), p, 0.0)
    return p / p.sum(axis=-1, keepdims=True)


def sample(p: mx.array, key: mx.array) -> mx.array:
    """Draw one token per row of the probability array `p` (..., V)."""
    return mx.random.categorical(mx.log(p), axis=-1, key=key)
