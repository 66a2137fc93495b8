"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the context's suffix.

No second model and near-zero cost; the proposal is deterministic (q one-hot), which the exact law
handles: a token is accepted with probability p(token). Suffix lengths are tried longest first. One index
per row of the batch; rows propose up to their own cap (ragged lengths, padded).

Before drafting, `auto` asks each row's draft as each token's estimated probability given the ones before it
(`available`): with m the true match length (how far the context's end and the occurrence's end agree, looking
back past the n-gram, up to MAX_MATCH), draft token d is estimated 1 / (1 + PSEUDO / (m + d) ** POWER) (once the
d tokens before it are right, the match is d longer). A 2-token match of common tokens is a guess; a repeated
passage is not. On text the estimates fall a little short of how often a draft token is right (prose by ~8%,
code by ~14%): better an n-gram draft skipped than one verified for nothing."""

from __future__ import annotations

from ..tree import Spec
from .lookup import Lookup

MAX_MATCH = 32  # longest true match measured
# bench/ngram_calibrate.py at b092569 (stdlib and /usr/share/doc, not the benchmark): 8 fits best; 10 leans under
PSEUDO, POWER = 10.0, 1.5


class Index:
    """n-gram -> latest start, for n in [shortest, longest], over one growing context."""

    def __init__(self, shortest: int, longest: int):
        self.tables: dict[int, dict[tuple, int]] = {n: {} for n in range(shortest, longest + 1)}
        self.before: dict[int, dict[int, int]] = {n: {} for n in self.tables}  # start -> the n-gram's previous start
        self.done = {n: 0 for n in self.tables}  # positions indexed so far, per n

    def find(self, context: list[int], count: int = 1) -> list[tuple[int, int]]:
        """Up to `count` (end, m), latest first: earlier occurrences of the context's last n tokens (the longest n
        that has one) end before `end`, and m tokens before `end` equal the context's last m (n or more, <=
        MAX_MATCH); empty without a match."""
        for n, table in self.tables.items():
            # index every start i whose n-gram has a continuation inside the context: i + n < len(context)
            for i in range(self.done[n], len(context) - n):
                key = tuple(context[i : i + n])
                if key in table:
                    self.before[n][i] = table[key]
                table[key] = i
            self.done[n] = max(self.done[n], len(context) - n)
        for n in sorted(self.tables, reverse=True):
            i = self.tables[n].get(tuple(context[-n:])) if len(context) > n else None
            found = []
            while i is not None and len(found) < count:
                end, m = i + n, n
                while m < MAX_MATCH and m < end and context[end - 1 - m] == context[-1 - m]:
                    m += 1
                found.append((end, m))
                i = self.before[n].get(i)
            if found:
                return found
        return []


class NgramDrafter(Lookup):
    name = "ngram"

    def __init__(self, shortest: int = 2, longest: int = 4, trees: Spec | None = None):  # (n-gram lengths: settings ngram_min, ngram_max)
        self.shortest, self.longest, self.trees = shortest, longest, trees
        self.rows: list[Index] = []

    def new_row(self, prompt: list[int]) -> Index:
        return Index(self.shortest, self.longest)

    def looks(self, row: int, context: list[int], k: int, count: int) -> list[tuple[list[int], list[float]]]:
        """The drafts of up to `count` earlier occurrences, latest first (a tree's candidates)."""
        found = [(context[end : end + k], m) for end, m in self.rows[row].find(context, count)]
        return [(d, [1.0 / (1.0 + PSEUDO / (m + i) ** POWER) for i in range(len(d))]) for d, m in found]
