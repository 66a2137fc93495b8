"""A smaller model of the same tokenizer drafts autoregressively, over the same cache layer as the target."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..cache import LM
from ..sampling import SamplingParams
from . import Draft, Drafter, autoregress


class ModelDrafter(Drafter):
    name = "model"
    stops = True

    def __init__(self, model, p_min: float = 0.0, prefill_step: int = 512):
        self.lm = LM(model, role="draft model", prefill_step=prefill_step)
        self.lm.require_rollback()  # refused before decoding, not at the first rejection
        self.max_rows = 1 if self.lm.one_row else None
        self.p_min = p_min
        self._proposed_from: list[int] = []
        self._fed = 0

    def add_rows(self, n: int) -> None:
        self.lm.add_rows(n)

    def keep_rows(self, rows: list[int]) -> None:
        self.lm.keep_rows(rows)

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        self.lm.set_row(row, prompt[:-1], keep)
        self._fed = 0  # a draft proposed for the row before (and never committed) is gone with it

    def propose(self, contexts, caps, sp: SamplingParams, keys, plan=None) -> Draft:
        B = len(contexts)
        self._proposed_from, self._fed = [len(c) for c in contexts], 0
        pending = [c[int(p):] for c, p in zip(contexts, self.lm.pos)]  # committed, not yet cached
        m = max(len(p) for p in pending)
        x, valid = np.zeros((B, m), np.int32), np.zeros((B, m), bool)
        for b, p in enumerate(pending):
            x[b, m - len(p):], valid[b, m - len(p):] = p, True
        step_n = self.lm.prefill_step
        while x.shape[1] > step_n + 1:  # a long backlog (cycles another source drafted): in chunks, committed
            self.lm.forward(mx.array(x[:, :step_n]), valid[:, :step_n], last=True)
            mx.eval([getattr(c, "state", []) for c in self.lm.caches])
            x, valid = x[:, step_n:], valid[:, step_n:]
        block = [mx.array(x), valid]
        self.lm.checkpoint()  # recurrent draft models: the state to come back to

        def step(t):
            if t is not None:
                block[:] = [t[:, None], None]
            self._fed += 1
            return self.lm.forward(*block, last=True)[:, -1]

        return autoregress(step, caps, sp, keys, self.p_min, *(plan and plan.stop or ()))

    def commit(self, contexts, n_accepted, hidden=None) -> None:
        if self._fed:  # the cache holds each row's old context, its pending tokens and fed-1 drafts
            self.lm.truncate(np.array([f + min(self._fed - 1, n) for f, n in zip(self._proposed_from, n_accepted)]))
        self._fed = 0
