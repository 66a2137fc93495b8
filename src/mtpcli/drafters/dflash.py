"""A DFlash drafter (dflash.py) drafts a block in one pass from the target's own hidden states; what its cache holds
(nothing speculative) and why its independent slots keep the exact law: docs/heads.md."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..cache import in_chunks
from ..sampling import SamplingParams, probs
from . import Draft, HeadDrafter, drawing, empty


class DFlashDrafter(HeadDrafter):
    name = "dflash"

    def __init__(self, model, prefill_step: int = 512):
        super().__init__(model, "DFlash drafter", prefill_step)

    def _write(self) -> None:
        """The pending states into the cache, in chunks."""
        if (padded := self._padded()) is None:
            return
        states, _, valid = padded

        def feed(i, j):
            self.io.hidden = states[:, i:j]
            self.lm.forward(mx.zeros(valid[:, i:j].shape, mx.int32), valid[:, i:j], last=True)

        in_chunks(feed, valid.shape[1], self.prefill_step, self.lm.states)

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
        draw = drawing(keys, caps)
        return Draft(mx.stack([draw(q[:, j], j) for j in range(k)], axis=1), q, caps, list(caps))
