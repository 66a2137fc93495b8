"""A smaller model of the same tokenizer drafts autoregressively, over the same cache layer as the target."""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from ..cache import LM, in_chunks
from ..constrain import Guide
from ..sampling import SamplingParams
from ..tree import Spec
from . import Draft, Source, trees


class ModelDrafter(Source):
    name = "model"
    stops = True

    def __init__(self, model, p_min: float = 0.0, prefill_step: int = 512, defer: bool = False,
                 trees: Spec | None = None, shelf=None, guide: Guide | None = None):
        """`defer`: a row starts with an empty cache and prefills its context when it first drafts (draft = auto
        brings it in once that pays: policy.AutoPolicy.plan); else it prefills the prompt at the start. `trees`:
        the trees it drafts (None: chains); `shelf`: its prefills kept across runs (cache.LM); `guide`: the rows'
        constraints (constrain.Guide), a sampled draft proposed under them."""
        self.lm = LM(model, role="draft model", prefill_step=prefill_step, shelf=shelf)
        self.lm.require_rollback()  # refused before decoding, not at the first rejection
        self.max_rows = 1 if self.lm.one_row else None
        self.p_min, self.defer, self.trees, self.guide = p_min, defer, trees, guide
        self._proposed_from: list[int] = []
        self._fed = 0
        self._kept: dict[int, int] = {}  # a deferred row's prompt tokens the kept prefills hold (for its price)
        self._prefilled = 0
        self._read = False  # (a deferred model's weights, evaluated before its first catch-up)

    @property
    def cached(self) -> int:
        return self.lm.cached

    @property
    def prefilled(self) -> int:
        return self._prefilled

    def add_rows(self, n: int) -> None:
        self.lm.add_rows(n)

    def keep_rows(self, rows: list[int]) -> None:
        self.lm.keep_rows(rows)
        self._kept = {i: self._kept.get(r, 0) for i, r in enumerate(rows)}

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        self.lm.set_row(row, [] if self.defer else prompt[:-1], keep and not self.defer)
        self._kept[row] = self.lm.kept(prompt[:-1]) if self.defer else 0
        self._prefilled = 0 if self.defer or self.lm.reused else len(prompt) - 1 - self.lm.cached
        self._fed = 0  # a draft proposed for the row before (and never committed) is gone with it

    def backlog(self, row: int, context: list[int]) -> int:
        """What the row would prefill before drafting now (auto prices the draft model's coming in by it): its
        context past the cache, less what the kept prefills hold of a row not prefilled yet."""
        pos = int(self.lm.pos[row])
        return len(context) - pos - (self._kept.get(row, 0) if pos == 0 else 0)

    def propose(self, contexts, caps, sp: SamplingParams, keys, plan=None) -> Draft:
        B = len(contexts)
        if self.defer and not self._read and any(self.lm.pos[b] == 0 and len(c) > 1 for b, c in enumerate(contexts)):
            mx.eval(self.lm.model.parameters())  # a lazily loaded model's weights, read once and not timed as its
            self._read = True  # catch-up: auto's kept prefill cost is per token (docs/perf/prefill.md)
        t0, caught, kept = time.perf_counter(), [0] * B, [0] * B
        for b, c in enumerate(contexts):  # a deferred row's first draft: its prefill, as at an eager start
            if self.defer and self.lm.pos[b] == 0 and len(c) > 1:
                self.lm.set_row(b, c[:-1])
                kept[b] = self.lm.cached
                caught[b] = len(c) - 1 - kept[b]
        catch_up_s = time.perf_counter() - t0 if any(caught) else 0.0
        self._proposed_from, self._fed = [len(c) for c in contexts], 0
        pending = [c[int(p):] for c, p in zip(contexts, self.lm.pos)]  # committed, not yet cached
        m = max(len(p) for p in pending)
        x, valid = np.zeros((B, m), np.int32), np.zeros((B, m), bool)
        for b, p in enumerate(pending):
            x[b, m - len(p):], valid[b, m - len(p):] = p, True
        # a long backlog (cycles another source drafted): in chunks, committed
        at = in_chunks(lambda i, j: self.lm.forward(mx.array(x[:, i:j]), valid[:, i:j], last=True), m,
                       self.lm.prefill_step, self.lm.states, leave=self.lm.prefill_step + 1)
        block = [mx.array(x[:, at:]), valid[:, at:]]
        self.lm.checkpoint()  # recurrent draft models: the state to come back to

        def step(t):
            if t is not None:
                block[:] = [t[:, None], None]
            self._fed += 1
            return self.lm.forward(*block, last=True)[:, -1]

        draft = trees.sampled(self, step, caps, sp, keys, plan)
        draft.caught_up, draft.kept_up, draft.catch_up_s = caught, kept, catch_up_s
        return draft

    def commit(self, contexts, n_accepted, hidden=None) -> None:
        if self._fed:  # the cache holds each row's old context, its pending tokens and fed-1 drafts
            self.lm.truncate(np.array([f + min(self._fed - 1, n) for f, n in zip(self._proposed_from, n_accepted)]))
        self._fed = 0
