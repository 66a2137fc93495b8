"""The checkpoint's own multi-token-prediction head drafts from the target's hidden states (one row); what its cache
holds (committed pairs only, speculative entries cut at commit): docs/heads.md."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ..cache import in_chunks, split_model
from ..constrain import Guide
from ..sampling import SamplingParams
from . import Draft, Source, autoregress, empty


class MtpDrafter(Source):
    name = "mtp"
    needs_hidden = True
    max_rows = 1
    stops = True

    def __init__(self, head, target_model, p_min: float = 0.0, prefill_step: int = 512, guide: Guide | None = None):
        inner, lm_head = split_model(target_model)
        self.head, self.embed, self.lm_head = head, inner.embed_tokens, lm_head
        self.p_min, self.prefill_step, self.guide = p_min, prefill_step, guide
        self.cache = KVCache()
        self.pending: tuple[list[mx.array], list[int]] | None = None  # committed pairs not yet in the cache
        self._committed = 0  # cache entries that are committed pairs (the rest are speculative)

    def _run(self, hidden: mx.array, tokens):
        return self.head(hidden, mx.array(tokens, dtype=mx.int32).reshape(1, -1), self.embed, self.lm_head,
                         self.cache)

    def start(self, row: int, prompt: list[int], hidden: mx.array | None = None, keep: bool = False) -> None:
        """`hidden`: the target's states of prompt[:-1], each paired with the token after it (fed at the first
        proposal, in chunks)."""
        self.cache, self._committed = KVCache(), 0
        n = 0 if hidden is None else hidden.shape[1]
        self.pending = ([hidden], list(prompt[1 : n + 1])) if n else None

    def propose(self, contexts, caps, sp: SamplingParams, keys, plan=None) -> Draft:
        if self.pending is None:
            return empty([0] * len(caps))  # no pair yet: nothing was asked
        (parts, tokens), self.pending = self.pending, None
        hidden = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
        # a long backlog (a prompt, cycles another source drafted): in chunks
        at = in_chunks(lambda i, j: self._run(hidden[:, i:j], tokens[i:j]), hidden.shape[1], self.prefill_step,
                       lambda: self.cache.state, leave=self.prefill_step + 1)
        hidden, tokens = hidden[:, at:], tokens[at:]
        self._committed = self.cache.offset + hidden.shape[1]  # the entries once the pending pairs are fed
        h = None

        def step(t):
            nonlocal h
            h, logits = self._run(hidden, tokens) if t is None else self._run(h[:, -1:], t)
            return logits[:, -1]

        return autoregress(step, caps, sp, keys, self.p_min, stop=plan and plan.stop, guide=self.guide)

    def commit(self, contexts, n_accepted, hidden: mx.array | None = None) -> None:
        """Cut the speculative entries; the new pairs: positions 0..n_accepted, the last n_accepted + 1 tokens."""
        if self.pending is None:  # the proposal consumed the pending pairs (if there were any)
            self.cache.trim(self.cache.offset - self._committed)
        prev_h, prev_t = self.pending or ([], [])  # nothing was proposed: the pending pairs wait with the new ones
        n = n_accepted[0] + 1
        self.pending = (prev_h + [hidden[:, :n]], prev_t + contexts[0][-n:])  # joined when it drafts
