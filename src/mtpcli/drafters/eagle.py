"""An EAGLE-3 head (eagle.py) drafts from the target's own hidden states, over the same cache layer as the target.

The head's cache holds one entry per committed pair (h_t, x_{t+1}): the target's tapped states at position t and
the token that followed. Each row's new pairs (its committed tokens with the states of the pass they came from:
a tree's path, gathered) wait in `pending` and are fed at the row's next proposal, whose last position gives the
first draft; deeper drafts feed the head's own output with the token it drew. Those entries are speculative and
are cut at commit, so the cache only ever holds pairs made of the target's states (as EAGLE's stable_kv does)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..cache import LM
from ..sampling import SamplingParams
from . import Draft, Drafter, empty
from .model import ModelDrafter, chain_or_tree


class EagleDrafter(Drafter):
    name = "eagle3"
    needs_hidden = True
    stops = True
    trees = True
    tree = ModelDrafter.tree  # the chain, and siblings at its least sure positions

    def __init__(self, head, p_min: float = 0.0, prefill_step: int = 512):
        self.head, self.io = head, head.io
        self.taps = head.io.taps
        self.lm = LM(head, role="draft head", prefill_step=prefill_step)
        self.p_min, self.prefill_step = p_min, prefill_step
        self.pending: list[tuple[list[mx.array], list[int]]] = []  # per row: states and tokens not yet fed
        self.seen: list[int] = []  # per row: the context's length when its pairs were last taken
        self._committed: np.ndarray | None = None  # after a proposal: each row's committed entries

    def add_rows(self, n: int) -> None:
        self.lm.add_rows(n)
        self._committed = None
        self.pending += [([], []) for _ in range(n)]
        self.seen += [0] * n

    def keep_rows(self, rows: list[int]) -> None:
        self.lm.keep_rows(rows)
        self._committed = None
        self.pending, self.seen = [self.pending[r] for r in rows], [self.seen[r] for r in rows]

    def start(self, row: int, prompt: list[int], hidden: mx.array | None = None, keep: bool = False) -> None:
        """`hidden`: the target's states of prompt[:-1], each paired with the token after it."""
        keep_n = self.lm.pos.copy()
        keep_n[row] = 0
        self.lm.truncate(keep_n)
        n = 0 if hidden is None else hidden.shape[1]
        self.pending[row] = ([hidden], list(prompt[1 : n + 1])) if n else ([], [])
        self.seen[row] = len(prompt)

    def propose(self, contexts, caps, sp: SamplingParams, keys, plan=None) -> Draft:
        B = len(contexts)
        lens = [len(t) for _, t in self.pending]
        caps = [c if n else 0 for c, n in zip(caps, lens)]  # (a row without a pair yet drafts nothing)
        if not max(caps):
            return empty(caps)
        m = max(lens)
        width = self.pending[lens.index(m)][0][0].shape[-1]
        hidden = mx.zeros((B, m, width), self.pending[lens.index(m)][0][0].dtype)
        tokens, valid = np.zeros((B, m), np.int32), np.zeros((B, m), bool)
        for b, ((hs, ts), n) in enumerate(zip(self.pending, lens)):
            if n:
                hidden[b, m - n :] = mx.concatenate(hs, axis=1)[0] if len(hs) > 1 else hs[0][0]
                tokens[b, m - n :], valid[b, m - n :] = ts, True
        self._committed = self.lm.pos + np.array(lens)
        self.pending = [([], []) for _ in range(B)]
        step_n = self.prefill_step
        while hidden.shape[1] > step_n + 1:  # a long backlog (a prompt, cycles another source drafted): in chunks
            self._feed(hidden[:, :step_n], True, tokens[:, :step_n], valid[:, :step_n])
            mx.eval([c.state for c in self.lm.caches])
            hidden, tokens, valid = hidden[:, step_n:], tokens[:, step_n:], valid[:, step_n:]

        def step(t):
            if t is None:
                return self._feed(hidden, True, tokens, valid)
            return self._feed(self.io.out[:, -1:], False, t[:, None], None)

        return chain_or_tree(self, step, caps, sp, keys, plan)

    def _feed(self, hidden, fuse: bool, tokens, valid) -> mx.array:
        self.io.hidden, self.io.fuse = hidden, fuse
        return self.lm.forward(mx.array(tokens), valid, last=True)[:, -1]

    def commit(self, contexts, n_accepted, hidden: mx.array | None = None) -> None:
        """Cut the speculative entries; each row's new pairs: its committed tokens with the states of their pass."""
        if self._committed is not None:
            self.lm.truncate(self._committed)
            self._committed = None
        for b, c in enumerate(contexts):
            n = len(c) - self.seen[b]
            if n and hidden is not None:
                hs, ts = self.pending[b]
                self.pending[b] = (hs + [hidden[b : b + 1, :n]], ts + list(c[-n:]))
            self.seen[b] = len(c)
