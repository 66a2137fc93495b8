"""The sources that draft by lookup (n-gram, history): deterministic drafts, each token with its estimate."""

from __future__ import annotations

from . import Draft, Source, trees


class Lookup(Source):
    """A source that drafts by lookup (no q: one-hot), a state per row in `rows` (`new_row(prompt)`): `looks(row,
    context, k, count)` is up to `count` drafts of up to k tokens (a tree's; the chain's first) with their estimates."""

    def add_rows(self, n: int) -> None:
        self.rows += [self.new_row([]) for _ in range(n)]

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        self.rows[row] = self.new_row(prompt)

    def available(self, contexts, k: int) -> list[list[float]]:
        """Each row's draft at width k as its tokens' estimates (what `auto` weighs, calibrated by how the row's
        drafts fared: policy.AutoPolicy.shift); empty where there is none."""
        return [self.look(b, c, k)[1] for b, c in enumerate(contexts)]

    def look(self, row: int, context: list[int], k: int) -> tuple[list[int], list[float]]:
        """A row's draft of up to k tokens and each token's estimate given the ones before."""
        return (self.looks(row, context, k, 1) or [([], [])])[0]

    def propose(self, contexts, caps, sp, keys, plan=None) -> Draft:
        """The rows' drafts padded to the longest; each row as long as its own."""
        return (self.trees and trees.lookup(self, contexts, caps, plan)) or \
            trees.as_chain([self.look(b, c, k) if k > 0 else ([], []) for b, (c, k) in enumerate(zip(contexts, caps))])
