"""The history drafter (suffix decoding across runs, after SuffixDecoding, arXiv:2411.04975): match the longest
suffix of a row's context in what earlier runs produced (history.Store), in what this run finished so far, and in
the row's own prompt and output; propose the continuation that most often followed that suffix.

A context is matched as `prompt OUT output`, stored documents as `[prompt] OUT output END` (the prompt only where
kept), so an answer's first tokens match earlier answers' first tokens even without their prompts. Candidates are
the most recent CANDIDATES occurrences of the context's last LONG tokens in each corpus, else of its last 2; every
candidate of the longest match (up to MAX_MATCH tokens) votes for the next token, and the draft follows the winner
while the product over depths of its estimates (PSEUDO) stays above MIN_PROB; a match reaching back to the answer's
start counts LONG tokens more (the start stands for a prompt not kept). `auto` weighs each token's estimate
(`available`) against its costs; PSEUDO and POWER are calibrated in docs/perf/history.md. Drafts are deterministic
(q one-hot): the exact law accepts a token with p(token)."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from ..tree import Spec
from .lookup import Lookup

END, OUT, PAD = -1, -2, -3  # a document's end; where its output begins; before the start of a context
LONG = 6  # the longer key: candidates that share the context's last 6 tokens, before those that share 2
MAX_MATCH = 64  # longest suffix compared
CANDIDATES = 256  # most recent occurrences of a key considered per corpus
MIN_PROB = 0.1
PSEUDO, POWER = 8.0, 1.5  # a token's estimate: votes / (candidates + PSEUDO / match length ** POWER)
_P = np.uint64(0x9E3779B97F4A7C15)


def _keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit key of every n tokens, at the position of their last token (positions < n - 1: none)."""
    t = (tokens + 4).astype(np.uint64)
    if n == 2:
        return (t[:-1] << np.uint64(32)) | t[1:]
    h = np.zeros(t.size - n + 1, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _P + t[j:t.size - n + 1 + j]
    return h


class Index:
    """Positions of a token array sorted by the key of the n tokens ending at each (stable: the most recent last)."""

    def __init__(self, tokens: np.ndarray, n: int):
        self.n = n
        keys = _keys(tokens, n)
        self.order = np.argsort(keys, kind="stable").astype(np.int64) + (n - 1)
        self.sorted = keys[self.order - (n - 1)]

    def find(self, query: np.ndarray) -> np.ndarray:
        if query.size < self.n:
            return self.order[:0]
        key = _keys(query[-self.n:], self.n)[0]
        lo, hi = np.searchsorted(self.sorted, key, "left"), np.searchsorted(self.sorted, key, "right")
        return self.order[max(lo, hi - CANDIDATES):hi]


class Corpus:
    """Documents concatenated, END-separated, indexed by their last LONG and last 2 tokens."""

    def __init__(self, docs: list):
        self.docs = docs
        parts = [np.array([END], np.int64)]
        for d in docs:
            if d.prompt is not None:
                parts.append(d.prompt)
            parts += [np.array([OUT], np.int64), d.output, np.array([END], np.int64)]
        self.tokens = np.concatenate(parts)
        self.indexes = [Index(self.tokens, LONG), Index(self.tokens, 2)]
        self.starts = np.flatnonzero(self.tokens == OUT)

    def occurrences(self, query: np.ndarray) -> np.ndarray:
        """Positions j where the corpus's tokens end like `query` (LONG tokens, else 2), a token after j."""
        if query[-1] == OUT:  # the first token of an answer: every earlier answer's start (their prompts may be gone)
            return self.starts[-CANDIDATES:]
        for ix in self.indexes:
            found = ix.find(query)
            found = found[found < self.tokens.size - 1]
            if found.size:
                return found
        return found


class Own:
    """A row's own context as `prompt OUT output`, grown in place."""

    def __init__(self, prompt: list[int]):
        self.tokens = np.array(list(prompt) + [OUT], np.int64)
        self.memo: tuple = ()  # its last draft: (context length, k, store version, draft, estimates)

    def sync(self, context: list[int]) -> None:
        have = self.tokens.size - 1  # context tokens held
        if len(context) > have:
            self.tokens = np.concatenate([self.tokens, np.asarray(context[have:], np.int64)])

    def occurrences(self, query: np.ndarray) -> np.ndarray:
        t = self.tokens
        for n in (LONG, 2):
            if t.size <= n:
                continue
            hit = np.ones(t.size - n, bool)  # candidate ends j = n-1 .. size-2 (a continuation exists)
            for i in range(n):
                hit &= t[i:t.size - n + i] == query[-n + i]
            found = np.flatnonzero(hit) + (n - 1)
            if found.size:
                return found[-CANDIDATES:]
        return np.zeros(0, np.int64)


def match_lengths(tokens: np.ndarray, ends: np.ndarray, query: np.ndarray) -> np.ndarray:
    """For each position j in `ends`, how many tokens up to and including j equal the end of `query`."""
    n = min(MAX_MATCH, query.size)
    idx = ends[:, None] - np.arange(n)[None, :]
    vals = np.where(idx >= 0, tokens[np.clip(idx, 0, None)], PAD)
    eq = vals == query[::-1][:n][None, :]
    return np.where(eq.all(1), n, eq.argmin(1))


def continuation(corpora: list[tuple[np.ndarray, np.ndarray]], query: np.ndarray, k: int,
                 count: int = 1) -> list[tuple[list, list]]:
    """The draft for `query` (up to k tokens) and each token's estimated probability given the ones before it, from
    candidate end positions in each corpus (tokens, ends), corpora and positions oldest first; with count > 1, up to
    count - 1 more, the likeliest other tokens voted for along it, each followed by its own winners (a tree's)."""
    conts, lengths = [], []
    for tokens, ends in corpora:
        if ends.size == 0:
            continue
        idx = ends[:, None] + 1 + np.arange(k)[None, :]
        conts.append(np.where(idx < tokens.size, tokens[np.clip(idx, None, tokens.size - 1)], END))
        lengths.append(match_lengths(tokens, ends, query))
    if not conts:
        return [([], [])]
    lengths = np.concatenate(lengths)
    m = int(lengths.max())
    c = np.concatenate(conts)[lengths == m]  # (n, k): the candidates of the longest match, the most recent last
    c = np.where(np.minimum.accumulate(c, axis=1) < 0, END, c)  # nothing past an END or OUT
    anchored = m > 0 and bool((query[query.size - m:] == OUT).any())  # the match reaches the answer's start
    shrink = PSEUDO / max(1, m + LONG * anchored) ** POWER

    def follow(alive: np.ndarray, start: int, prob: float) -> tuple[list, list]:
        """The winners of the votes from depth `start` among the `alive` candidates, while prob stays up."""
        draft, probs = [], []
        for d in range(start, k):
            votes = [v for v in c[alive, d].tolist() if v >= 0]  # (a few dozen: Python's counting is the quicker)
            if not votes:
                break
            counts = Counter(votes)
            most = max(counts.values())
            best = next(v for v in reversed(votes) if counts[v] == most)  # ties go to the most recent
            p = most / (int(alive.sum()) + shrink)
            prob *= p
            if prob < MIN_PROB:
                break
            draft.append(best)
            probs.append(float(p))
            alive = alive & (c[:, d] == best)
        return draft, probs

    draft, probs = follow(np.ones(c.shape[0], bool), 0, 1.0)
    if count <= 1:
        return [(draft, probs)]
    alts, alive, prob = [], np.ones(c.shape[0], bool), 1.0  # a tree's: the other tokens voted for along the draft
    for d, t in enumerate(draft):
        total = int(alive.sum()) + shrink
        for v, n in sorted(Counter(v for v in c[alive, d].tolist() if v >= 0).items()):
            p = n / total
            if v != t and prob * p >= MIN_PROB:
                rest, rp = follow(alive & (c[:, d] == v), d + 1, prob * p)
                alts.append((prob * p, draft[:d] + [v] + rest, probs[:d] + [float(p)] + rp))
        prob, alive = prob * probs[d], alive & (c[:, d] == t)
    alts.sort(key=lambda a: -a[0])
    return [(draft, probs)] + [(t, p) for _, t, p in alts[: count - 1]]


class HistoryDrafter(Lookup):
    name = "history"

    def __init__(self, store, vocab: int | None = None, trees: Spec | None = None):
        """`vocab`: the target's output size; a stored id past it (from a shorter output layer) ends a draft."""
        self.store, self.vocab, self.trees = store, vocab, trees
        t0 = time.perf_counter()
        docs = store.load().docs
        self.base = Corpus(docs) if docs else None
        self.load_s = time.perf_counter() - t0  # reading the store and indexing it: paid once per run
        self.tiers: list[Corpus] = []  # this run's finished answers, in indexes of doubling sizes
        self.taken = 0  # session documents indexed so far
        self.rows: list[Own] = []

    new_row = Own  # (a class: called with the prompt, not bound)

    def _corpora(self) -> list[Corpus]:
        """The store's index, then this run's answers: each new one joins the newest tier, and a tier that grows
        past the one before it merges into it (so indexing n answers costs n log n, not n squared)."""
        session = self.store.session
        if self.taken < len(session):
            docs, self.taken = list(session[self.taken:]), len(session)
            while self.tiers and len(self.tiers[-1].docs) <= len(docs):
                docs = self.tiers.pop().docs + docs
            self.tiers.append(Corpus(docs))
        return ([self.base] if self.base is not None else []) + self.tiers

    def look(self, row: int, context: list[int], k: int) -> tuple[list[int], list[float]]:
        """Row `row`'s draft of up to k tokens and each token's estimated probability given the ones before it."""
        own, version = self.rows[row], self.taken
        memo = own.memo
        if memo and memo[0] == len(context) and memo[1] >= k and memo[2] == version:
            return memo[3][:k], memo[4][:k]
        ((draft, probs),) = self.looks(row, context, k, 1)
        own.memo = (len(context), k, version, draft, probs)
        return draft, probs

    def looks(self, row: int, context: list[int], k: int, count: int) -> list[tuple[list[int], list[float]]]:
        own = self.rows[row]
        own.sync(context)
        query = own.tokens
        found = [(c.tokens, c.occurrences(query)) for c in self._corpora()] + [(own.tokens, own.occurrences(query))]
        out = []
        for draft, probs in continuation(found, query, k, count) if k > 0 else [([], [])]:
            if self.vocab is not None:
                draft = draft[:next((i for i, t in enumerate(draft) if t >= self.vocab), len(draft))]
            out.append((draft, probs[:len(draft)]))
        return out
