"""The history drafter (suffix decoding across runs, after SuffixDecoding, arXiv:2411.04975): match the longest
suffix of a row's context in what earlier runs produced (history.Store), in what this run finished so far, and in
the row's own prompt and output; propose the continuation that most often followed that suffix.

A row's context is matched as `prompt OUT output`: stored documents are `[prompt] OUT output END` (the prompt only
where it was kept), so the first tokens of an answer match the first tokens of earlier answers even though their
prompts were not kept. Every occurrence of the longest match (the most recent CANDIDATES of each corpus) votes for
the next token; the draft follows the winning token while its estimated probability, the product over depths of
count / (votes + 1 / match length), stays above MIN_PROB. That is where a draft stops and whether there is one at
all; `auto` weighs the length found (`available`) against its costs. Drafts are deterministic functions of the
committed tokens and the store (q one-hot): the exact law accepts a token with probability p(token).
"""

from __future__ import annotations

import numpy as np

from . import Draft

END, OUT = -1, -2  # a document's end; where its output begins
MAX_MATCH = 64  # longest suffix compared
CANDIDATES = 256  # most recent occurrences of a 2-gram considered per corpus
MIN_PROB = 0.1


def _key(a, b):
    return (np.asarray(a, np.int64) + 2) * (1 << 32) + (np.asarray(b, np.int64) + 2)


class Corpus:
    """Documents concatenated, END-separated, with their 2-grams sorted (stable: the most recent last)."""

    def __init__(self, docs):
        parts = [np.array([END], np.int64)]
        for d in docs:
            if d.prompt is not None:
                parts.append(d.prompt)
            parts += [np.array([OUT], np.int64), d.output, np.array([END], np.int64)]
        self.tokens = np.concatenate(parts)
        keys = _key(self.tokens[:-1], self.tokens[1:])
        self.order = np.argsort(keys, kind="stable")
        self.sorted = keys[self.order]
        self.starts = np.flatnonzero(self.tokens == OUT)

    def occurrences(self, a: int, b: int) -> np.ndarray:
        """Positions j with tokens[j-1:j+1] == (a, b) and a token after j, the most recent CANDIDATES."""
        key = _key(a, b)
        lo, hi = np.searchsorted(self.sorted, key, "left"), np.searchsorted(self.sorted, key, "right")
        if b == OUT:  # the first token of an answer: every earlier answer's start (their prompts may be gone)
            return self.starts[-CANDIDATES:]
        return self.order[max(lo, hi - CANDIDATES):hi] + 1


class Own:
    """A row's own context as `prompt OUT output`, grown in place."""

    def __init__(self, prompt: list[int]):
        self.tokens = np.array(list(prompt) + [OUT], np.int64)
        self.prompt_len = len(prompt)

    def sync(self, context: list[int]) -> None:
        have = self.tokens.size - 1  # context tokens held
        if len(context) > have:
            self.tokens = np.concatenate([self.tokens, np.asarray(context[have:], np.int64)])

    def occurrences(self, a: int, b: int) -> np.ndarray:
        t = self.tokens
        hits = np.flatnonzero((t[:-2] == a) & (t[1:-1] == b)) + 1  # j < last: a continuation exists
        return hits[-CANDIDATES:]


def match_lengths(tokens: np.ndarray, ends: np.ndarray, query: np.ndarray) -> np.ndarray:
    """For each position j in `ends`, how many tokens before and at j equal the end of `query`."""
    n = min(MAX_MATCH, query.size)
    idx = ends[:, None] - np.arange(n)[None, :]
    vals = np.where(idx >= 0, tokens[np.clip(idx, 0, None)], END - 1)
    eq = vals == query[::-1][:n][None, :]
    return np.where(eq.all(1), n, eq.argmin(1))


def continuation(corpora: list[tuple[np.ndarray, np.ndarray]], query: np.ndarray, k: int) -> list[int]:
    """The draft for `query` (up to k tokens) from candidate positions in each corpus (tokens, ends)."""
    found = []  # (match length, continuation) per candidate, oldest first within each corpus
    for tokens, ends in corpora:
        if ends.size == 0:
            continue
        m = match_lengths(tokens, ends, query)
        top = m.max()
        for j in ends[m == top].tolist():
            found.append((int(top), tokens[j + 1:j + 1 + k]))
    if not found:
        return []
    m = max(f[0] for f in found)
    alive = [c for mm, c in found if mm == m]
    draft, prob = [], 1.0
    for d in range(k):
        toks = [int(c[d]) for c in alive if c.size > d and c[d] >= 0]
        if not toks:
            break
        counts: dict[int, int] = {}
        for t in reversed(toks):  # ties go to the most recent
            counts[t] = counts.get(t, 0) + 1
        best = max(counts, key=counts.get)
        prob *= counts[best] / (len(alive) + 1.0 / m)
        if prob < MIN_PROB:
            break
        draft.append(best)
        alive = [c for c in alive if c.size > d and c[d] == best]
    return draft


class HistoryDrafter:
    name = "history"
    needs_hidden = False
    speculates = True
    max_rows = None

    def __init__(self, store):
        self.store = store
        self.base = Corpus(store.docs) if store.docs else None
        self.session, self.version = None, -1
        self.rows: list[Own | None] = []
        self.memo: list[tuple] = []  # per row: (context length, k) -> draft, for available() then propose()

    def add_rows(self, n: int) -> None:
        self.rows += [None] * n
        self.memo += [()] * n

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]
        self.memo = [self.memo[r] for r in rows]

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        self.rows[row], self.memo[row] = Own(prompt), ()

    def _corpora(self) -> list[Corpus]:
        if self.version != self.store.version:
            self.session = Corpus(self.store.session) if self.store.session else None
            self.version = self.store.version
        return [c for c in (self.base, self.session) if c is not None]

    def lookup(self, row: int, context: list[int], k: int) -> list[int]:
        """Row `row`'s draft of up to k tokens (a draft of k is the first k tokens of any wider one)."""
        corpora = self._corpora()
        memo = self.memo[row]
        if memo and memo[0] == len(context) and memo[1] >= k and memo[2] == self.version:
            return memo[3][:k]
        own = self.rows[row]
        own.sync(context)
        a, b = int(own.tokens[-2]), int(own.tokens[-1])
        found = [(c.tokens, c.occurrences(a, b)) for c in corpora] + [(own.tokens, own.occurrences(a, b))]
        draft = continuation(found, own.tokens, k) if k > 0 else []
        self.memo[row] = (len(context), k, self.version, draft)
        return draft

    def available(self, contexts, k: int) -> list[int]:
        return [len(self.lookup(b, c, k)) for b, c in enumerate(contexts)]

    def propose(self, contexts, caps, sp, keys, source=None) -> Draft:
        import mlx.core as mx

        found = [self.lookup(b, c, k) if k > 0 else [] for b, (c, k) in enumerate(zip(contexts, caps))]
        k = max(len(f) for f in found)
        tokens = mx.array([f + [0] * (k - len(f)) for f in found], dtype=mx.int32).reshape(len(found), k)
        lengths = [len(f) for f in found]
        return Draft(tokens, None, lengths, lengths)

    def commit(self, contexts, n_accepted, hidden=None) -> None:
        pass
