"""Draft sources. Each hands the verify step the same thing: k proposed tokens and, where it has them, their
draft distributions q (None means a deterministic proposal, i.e. one-hot q).

A drafter has `begin(prompt, hidden)`, `propose(context, k, sp, key)`, `commit(context, proposal, n_accepted,
hidden)` (context already holds the committed tokens) and `restart()`. `hidden` is the target's hidden
states (1, n, H) of the tokens it just ran, passed only to drafters that set `needs_hidden`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from ..sampling import SamplingParams, probs, sample


@dataclass
class Proposal:
    tokens: mx.array  # (k,) int32
    q: mx.array | None  # (k, V) float32 draft distributions, or None for one-hot proposals
    k: int  # realized length (a confidence floor may cut a draft short)
    requested: int  # the width that was asked for


def empty(requested: int = 0) -> Proposal:
    return Proposal(mx.zeros((0,), mx.int32), None, 0, requested)


def autoregress(step: Callable[[mx.array | None], mx.array], k: int, sp: SamplingParams, key: mx.array,
                p_min: float = 0.0) -> Proposal:
    """Draw up to k tokens, one per call of `step` (the previous draw -> next-token logits (V,); None for the
    first), through the same sampling code as the target's p. A confidence floor p_min cuts the draft short
    (one host sync per step, only when asked for)."""
    tokens, qs = [], []
    keys = None if sp.greedy else mx.random.split(key, max(k, 1))  # greedy drafting draws nothing
    t = None
    for i in range(k):
        logits = step(t)
        if sp.greedy:
            t = mx.argmax(logits, axis=-1, keepdims=True).astype(mx.int32)
        else:
            q = probs(logits, sp)
            t = sample(q, keys[i]).reshape(1).astype(mx.int32)
        if p_min > 0.0:
            conf = mx.softmax(logits.astype(mx.float32))[t] if sp.greedy else q[t]
            if conf.item() < p_min:
                break
        tokens.append(t)
        if not sp.greedy:
            qs.append(q)
        mx.async_eval(t)
    if not tokens:
        return empty(k)
    return Proposal(mx.concatenate(tokens), mx.stack(qs) if qs else None, len(tokens), k)


class NoDraft:
    """Plain autoregressive decoding through the same verify/commit path (k = 0)."""

    name = "none"
    needs_hidden = False

    def begin(self, prompt: list[int], hidden=None) -> None:
        pass

    def propose(self, context: list[int], k: int, sp, key) -> Proposal:
        return empty()

    def commit(self, context: list[int], proposal: Proposal, n_accepted: int, hidden=None) -> None:
        pass

    def restart(self) -> None:
        pass
