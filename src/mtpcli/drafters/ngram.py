"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the context's suffix.

No second model and near-zero cost; the proposal is deterministic (q one-hot), which the exact law
handles: a token is accepted with probability p(token). Suffix lengths are tried longest first. One index
per row of the batch; rows propose up to their own cap (ragged lengths, padded).
"""

from __future__ import annotations


from . import Draft, deterministic


class Index:
    """n-gram -> latest start, for n in [n_min, n_max], over one growing context."""

    def __init__(self, n_min: int, n_max: int):
        self.tables: dict[int, dict[tuple, int]] = {n: {} for n in range(n_min, n_max + 1)}
        self.done = {n: 0 for n in self.tables}  # positions indexed so far, per n

    def lookup(self, context: list[int], k: int) -> list[int]:
        for n, table in self.tables.items():
            # index every start i whose n-gram has a continuation inside the context: i + n < len(context)
            for i in range(self.done[n], len(context) - n):
                table[tuple(context[i : i + n])] = i
            self.done[n] = max(self.done[n], len(context) - n)
        for n in sorted(self.tables, reverse=True):
            i = self.tables[n].get(tuple(context[-n:])) if len(context) > n else None
            if i is not None:
                return context[i + n : i + n + k]
        return []


class NgramDrafter:
    name = "ngram"
    needs_hidden = False
    speculates = True
    max_rows = None

    def __init__(self, n_min: int = 2, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram_min ({n_min}) must be >= 1 and <= ngram_max ({n_max})")
        self.n_min, self.n_max = n_min, n_max
        self.rows: list[Index] = []

    def add_rows(self, n: int) -> None:
        self.rows += [Index(self.n_min, self.n_max) for _ in range(n)]

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        self.rows[row] = Index(self.n_min, self.n_max)

    def available(self, contexts, k: int) -> list[int]:
        """How many tokens each row would get at width k (what `auto` weighs before choosing)."""
        return [len(ix.lookup(c, k)) for ix, c in zip(self.rows, contexts)]

    def propose(self, contexts, caps, sp, keys, source=None) -> Draft:
        return deterministic([ix.lookup(c, k) if k > 0 else [] for ix, c, k in zip(self.rows, contexts, caps)])

    def commit(self, contexts, n_accepted, hidden=None) -> None:
        pass
