"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the context's suffix.

No second model and near-zero cost; the proposal is deterministic (q one-hot), which the exact law
handles: a token is accepted with probability p(token). Suffix lengths are tried longest first.
"""

from __future__ import annotations

import mlx.core as mx

from . import Proposal, empty


class NgramDrafter:
    name = "ngram"
    needs_hidden = False

    def __init__(self, n_min: int = 2, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram_min ({n_min}) must be >= 1 and <= ngram_max ({n_max})")
        self.n_min, self.n_max = n_min, n_max
        self.restart()

    def restart(self) -> None:
        self.index: dict[int, dict[tuple, int]] = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self.done = {n: 0 for n in self.index}  # positions indexed so far, per n

    def begin(self, prompt: list[int], hidden=None) -> None:
        self.restart()

    def _update(self, context: list[int]) -> None:
        for n, table in self.index.items():
            # index every start i whose n-gram has a continuation inside the context: i + n < len(context)
            for i in range(self.done[n], len(context) - n):
                table[tuple(context[i : i + n])] = i
            self.done[n] = max(self.done[n], len(context) - n)

    def propose(self, context: list[int], k: int, sp, key) -> Proposal:
        if k > 0:
            self._update(context)
            for n in range(self.n_max, self.n_min - 1, -1):
                if len(context) <= n:
                    continue
                i = self.index[n].get(tuple(context[-n:]))
                if i is not None:
                    cand = context[i + n : i + n + k]
                    return Proposal(mx.array(cand, dtype=mx.int32), None, len(cand), len(cand))
        return empty()

    def commit(self, context: list[int], proposal: Proposal, n_accepted: int, hidden=None) -> None:
        pass


class NgramBatch:
    """One prompt-lookup index per row of a batch; rows propose up to their own cap (ragged lengths)."""

    def __init__(self, n_min: int = 2, n_max: int = 4):
        self.n_min, self.n_max = n_min, n_max
        self.rows: list[NgramDrafter] = []

    def add_rows(self, n: int) -> None:
        self.rows += [NgramDrafter(self.n_min, self.n_max) for _ in range(n)]

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def set_row(self, row: int, prompt: list[int]) -> None:
        self.rows[row].begin(prompt)

    def propose(self, contexts, caps, sp, keys):
        props = [d.propose(c, k, sp, None) for d, c, k in zip(self.rows, contexts, caps)]
        k = max(p.k for p in props)
        tokens = [p.tokens.tolist() + [0] * (k - p.k) for p in props]
        lengths = [p.k for p in props]
        return mx.array(tokens, dtype=mx.int32).reshape(len(props), k), None, lengths, lengths

    def commit(self, contexts, n_accepted) -> None:
        pass
