"""A smaller model of the same tokenizer drafts k tokens autoregressively."""

from __future__ import annotations

import mlx.core as mx

from ..lm import CachedLM
from ..sampling import SamplingParams, probs, sample
from . import Proposal


class ModelDrafter:
    name = "model"

    def __init__(self, model, p_min: float = 0.0, prefill_step: int = 512):
        self.lm = CachedLM(model, role="draft model", prefill_step=prefill_step)
        self.lm.require_rollback()
        self.p_min = p_min
        self._prompt_offset = 0
        self._proposed_from = 0  # context length when the last proposal was made

    def begin(self, prompt: list[int]) -> None:
        self.lm.prefill(prompt[:-1])
        self._prompt_offset = self.lm.offset

    def restart(self) -> None:
        """Back to the state right after the prompt (for the next of several completions)."""
        self.lm.rollback(self._prompt_offset)

    def propose(self, context: list[int], k: int, sp: SamplingParams, key: mx.array) -> Proposal:
        self._proposed_from = len(context)
        x = mx.array(context[self.lm.offset :], dtype=mx.int32)  # committed tokens not yet cached
        tokens, qs = [], []
        keys = None if sp.greedy else mx.random.split(key, max(k, 1))  # greedy drafting draws nothing
        for i in range(k):
            logits = self.lm.forward(x)[0, -1]
            if sp.greedy:
                t = mx.argmax(logits, axis=-1, keepdims=True).astype(mx.int32)
            else:
                q = probs(logits, sp)
                t = sample(q, keys[i]).reshape(1).astype(mx.int32)
            if self.p_min > 0.0:  # confidence floor: a host sync per draft step, only when asked for
                conf = mx.softmax(logits.astype(mx.float32))[t] if sp.greedy else q[t]
                if conf.item() < self.p_min:
                    break
            tokens.append(t)
            if not sp.greedy:
                qs.append(q)
            mx.async_eval(t)
            x = t
        toks = mx.concatenate(tokens) if tokens else mx.zeros((0,), mx.int32)
        q = mx.stack(qs) if qs else None
        return Proposal(toks, q, len(tokens), k)

    def commit(self, context: list[int], proposal: Proposal, n_accepted: int) -> None:
        # The cache holds the old context plus some proposed tokens; keep what the commit confirmed.
        fed = self.lm.offset - self._proposed_from
        self.lm.rollback(self._proposed_from + min(fed, n_accepted))
