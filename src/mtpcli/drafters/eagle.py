"""An EAGLE-3 head (eagle.py) drafts from the target's own hidden states, over the same cache layer as the target;
what its cache holds (committed pairs only, speculative entries cut at commit): docs/heads.md."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..cache import in_chunks
from ..constrain import Guide
from ..sampling import SamplingParams
from ..tree import Spec
from . import Draft, HeadDrafter, empty, trees


class EagleDrafter(HeadDrafter):
    name = "eagle3"
    stops = True

    def __init__(self, head, p_min: float = 0.0, prefill_step: int = 512, trees: Spec | None = None,
                 guide: Guide | None = None):
        super().__init__(head, "draft head", prefill_step)
        self.p_min, self.trees, self.guide = p_min, trees, guide
        self._committed: np.ndarray | None = None  # after a proposal: each row's committed entries

    def add_rows(self, n: int) -> None:
        super().add_rows(n)
        self._committed = None

    def keep_rows(self, rows: list[int]) -> None:
        super().keep_rows(rows)
        self._committed = None

    def propose(self, contexts, caps, sp: SamplingParams, keys, plan=None) -> Draft:
        lens = [len(t) for _, t in self.pending]
        caps = [c if n else 0 for c, n in zip(caps, lens)]  # (a row without a pair yet drafts nothing)
        if not max(caps):
            return empty(caps)
        self._committed = self.lm.pos + np.array(lens)
        hidden, tokens, valid = self._padded()
        # a long backlog (a prompt, cycles another source drafted): in chunks
        at = in_chunks(lambda i, j: self._feed(hidden[:, i:j], True, tokens[:, i:j], valid[:, i:j]), hidden.shape[1],
                       self.prefill_step, self.lm.states, leave=self.prefill_step + 1)
        hidden, tokens, valid = hidden[:, at:], tokens[:, at:], valid[:, at:]

        def step(t):
            if t is None:
                return self._feed(hidden, True, tokens, valid)
            return self._feed(self.io.out[:, -1:], False, t[:, None], None)

        return trees.sampled(self, step, caps, sp, keys, plan)

    def _feed(self, hidden, fuse: bool, tokens, valid) -> mx.array:
        self.io.hidden, self.io.fuse = hidden, fuse
        return self.lm.forward(mx.array(tokens), valid, last=True)[:, -1]

    def commit(self, contexts, n_accepted, hidden: mx.array | None = None) -> None:
        """Cut the speculative entries, then take each row's new pairs."""
        if self._committed is not None:
            self.lm.truncate(self._committed)
            self._committed = None
        super().commit(contexts, n_accepted, hidden)
