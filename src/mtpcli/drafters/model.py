"""A smaller model of the same tokenizer drafts k tokens autoregressively."""

from __future__ import annotations

import mlx.core as mx

from ..lm import CachedLM
from ..sampling import SamplingParams
from . import Proposal, autoregress


class ModelDrafter:
    name = "model"
    needs_hidden = False

    def __init__(self, model, p_min: float = 0.0, prefill_step: int = 512):
        self.lm = CachedLM(model, role="draft model", prefill_step=prefill_step)
        self.lm.require_rollback()
        self.p_min = p_min
        self._prompt_offset = 0
        self._proposed_from = 0  # committed context length when the last proposal was made

    def begin(self, prompt: list[int], hidden=None) -> None:
        self.lm.prefill(prompt[:-1])
        self._prompt_offset = self.lm.offset

    def restart(self) -> None:
        """Back to the state right after the prompt (for the next of several completions)."""
        self.lm.rollback(self._prompt_offset)

    def propose(self, context: list[int], k: int, sp: SamplingParams, key: mx.array) -> Proposal:
        self._proposed_from = len(context)
        pending = mx.array(context[self.lm.offset :], dtype=mx.int32)  # committed tokens not yet cached

        def step(t):
            return self.lm.forward(pending if t is None else t)[0, -1]

        return autoregress(step, k, sp, key, self.p_min)

    def commit(self, context: list[int], proposal: Proposal, n_accepted: int, hidden=None) -> None:
        # The cache holds the old context plus some proposed tokens; keep what the commit confirmed.
        fed = self.lm.offset - self._proposed_from
        self.lm.rollback(self._proposed_from + min(fed, n_accepted))


class ModelBatchDrafter:
    """The draft model over a batch (ragged caches, see batch.py). Each row draws with its own keys exactly
    what ModelDrafter draws alone; rows drafting fewer than the block width get padding past their cap."""

    def __init__(self, model, p_min: float = 0.0, prefill_step: int = 512):
        from ..batch import BatchLM

        self.lm = BatchLM(model, role="draft model", prefill_step=prefill_step)
        self.p_min = p_min
        self._proposed_from: list[int] = []
        self._fed = 0

    def add_rows(self, n: int) -> None:
        self.lm.add_rows(n)

    def keep_rows(self, rows: list[int]) -> None:
        self.lm.keep_rows(rows)

    def set_row(self, row: int, prompt: list[int]) -> None:
        self.lm.set_row(row, prompt[:-1])

    def propose(self, contexts, caps, sp: SamplingParams, keys):
        import numpy as np

        from ..sampling import probs, sample

        B, k = len(contexts), max(caps)
        self._proposed_from, self._fed = [len(c) for c in contexts], 0
        if k == 0:
            return mx.zeros((B, 0), mx.int32), None, [0] * B, caps
        pending = [c[int(p):] for c, p in zip(contexts, self.lm.layout.pos)]  # committed, not yet cached
        m = max(len(p) for p in pending)
        x = np.zeros((B, m), np.int32)
        valid = np.zeros((B, m), bool)
        for b, p in enumerate(pending):
            x[b, m - len(p):], valid[b, m - len(p):] = p, True
        x = mx.array(x)
        row_keys = [None if sp.greedy else mx.random.split(key, max(c, 1)) for key, c in zip(keys, caps)]
        lengths, tokens, qs = list(caps), [], []
        for j in range(k):
            logits = self.lm.forward(x, valid)[:, -1]
            self._fed += 1
            if sp.greedy:
                t = mx.argmax(logits, axis=-1).astype(mx.int32)
            else:
                q = probs(logits, sp)
                t = mx.concatenate([sample(q[b], row_keys[b][j]).reshape(1) if j < caps[b]
                                    else mx.argmax(q[b]).reshape(1) for b in range(B)]).astype(mx.int32)
                qs.append(q)
            if self.p_min > 0.0:  # confidence floor: one host sync per step, only when asked for
                conf = mx.take_along_axis(mx.softmax(logits.astype(mx.float32)) if sp.greedy else q, t[:, None], 1)
                for b, c in enumerate(conf[:, 0].tolist()):
                    if c < self.p_min and j < lengths[b]:
                        lengths[b] = j
            tokens.append(t)
            mx.async_eval(t)
            x, valid = t[:, None], np.ones((B, 1), bool)
        q = mx.stack(qs, axis=1) if qs else None
        return mx.stack(tokens, axis=1), q, lengths, caps

    def commit(self, contexts, n_accepted) -> None:
        if not self._fed:
            return
        import numpy as np

        # the cache holds each row's old context, its pending tokens and k-1 drafts: keep what was confirmed
        keep = [f + min(self._fed - 1, n) for f, n in zip(self._proposed_from, n_accepted)]
        self.lm.truncate(np.array(keep))
