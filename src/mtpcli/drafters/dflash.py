"""A DFlash drafter (dflash.py) drafts a block in one pass from the target's own hidden states.

Its cache holds the context: one entry per committed token but the newest, made of the target's states of the pass
that committed it; new entries wait in `pending` and are written at the row's next proposal. Nothing speculative is
ever cached (the block's keys live for one pass), so a rejection needs no rollback. The drafts at the block's slots
are drawn independently, each from its own q, which depends on the context only: the exact law holds as for any
proposal (at T = 0, the argmaxes: `--draft none`'s tokens)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..cache import LM
from ..sampling import SamplingParams, probs, sample
from . import Draft, Drafter, empty


class DFlashDrafter(Drafter):
    name = "dflash"
    needs_hidden = True

    def __init__(self, model, prefill_step: int = 512):
        self.model, self.io = model, model.io
        self.taps = model.io.taps
        self.lm = LM(model, role="DFlash drafter", prefill_step=prefill_step)
        self.prefill_step = prefill_step
        self.pending: list[list[mx.array]] = []  # per row: target states not yet written
        self.seen: list[int] = []  # per row: the context's length when its states were last taken

    def add_rows(self, n: int) -> None:
        self.lm.add_rows(n)
        self.pending += [[] for _ in range(n)]
        self.seen += [0] * n

    def keep_rows(self, rows: list[int]) -> None:
        self.lm.keep_rows(rows)
        self.pending, self.seen = [self.pending[r] for r in rows], [self.seen[r] for r in rows]

    def start(self, row: int, prompt: list[int], hidden: mx.array | None = None, keep: bool = False) -> None:
        keep_n = self.lm.pos.copy()
        keep_n[row] = 0
        self.lm.truncate(keep_n)
        self.pending[row] = [hidden] if hidden is not None and hidden.shape[1] else []
        self.seen[row] = len(prompt)

    def _write(self) -> None:
        """The pending states into the cache, rows left-padded, in chunks."""
        lens = [sum(h.shape[1] for h in hs) for hs in self.pending]
        m = max(lens, default=0)
        if not m:
            return
        first = next(hs[0] for hs in self.pending if hs)
        states = mx.zeros((len(lens), m, first.shape[-1]), first.dtype)
        valid = np.zeros((len(lens), m), bool)
        for b, (hs, n) in enumerate(zip(self.pending, lens)):
            if n:
                states[b, m - n :] = mx.concatenate(hs, axis=1)[0]
                valid[b, m - n :] = True
        self.pending = [[] for _ in lens]
        for i in range(0, m, self.prefill_step):
            self.io.hidden = states[:, i : i + self.prefill_step]
            self.lm.forward(mx.zeros(valid[:, i : i + self.prefill_step].shape, mx.int32),
                            valid[:, i : i + self.prefill_step], last=True)
            mx.eval([c.state for c in self.lm.caches])

    def propose(self, contexts, caps, sp: SamplingParams, keys, plan=None) -> Draft:
        self._write()
        caps = [min(c, self.io.block - 1) for c in caps]
        k = max(caps)
        if not k:
            return empty(caps)
        B, n = len(contexts), self.io.block
        blocks = np.full((B, n), self.io.mask_id, np.int32)
        blocks[:, 0] = [c[-1] for c in contexts]
        out = self.model.block(self.io.embed(mx.array(blocks)), self.lm.caches, self.lm.layout.valid,
                               self.lm.layout.pos)
        logits = self.io.lm_head(out[:, 1 : k + 1])  # slot j: the token j places after the newest
        if sp.greedy:
            return Draft(mx.argmax(logits, axis=-1).astype(mx.int32), None, caps, list(caps))
        V = logits.shape[-1]
        q = probs(logits.reshape(B * k, V), sp).reshape(B, k, V)
        row_keys = [mx.random.split(key, max(c, 1)) for key, c in zip(keys, caps)]  # a row's own: as alone
        tokens = mx.stack([mx.concatenate([sample(q[b, j], row_keys[b][j]).reshape(1) if j < caps[b] else
                                           mx.argmax(q[b, j]).reshape(1) for j in range(k)]) for b in range(B)])
        return Draft(tokens.astype(mx.int32), q, caps, list(caps))

    def commit(self, contexts, n_accepted, hidden: mx.array | None = None) -> None:
        """Each row's committed tokens but the newest become context: the states of their pass's positions."""
        for b, c in enumerate(contexts):
            n = len(c) - self.seen[b]
            if n and hidden is not None:
                self.pending[b].append(hidden[b : b + 1, :n])
            self.seen[b] = len(c)
