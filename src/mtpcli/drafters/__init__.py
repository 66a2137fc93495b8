"""Draft sources, behind ONE batched protocol that the engine drives (`Drafter`; one prompt is a batch of one row).

Whatever a drafter does, the exact law needs one thing of it: where a draft stops may depend on what was drafted
before, never on the token it would draft next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import mlx.core as mx
import numpy as np

from ..cache import LM
from ..controller import Plan
from ..sampling import SamplingParams, probs, sample
from ..stop import Rule, Stop
from ..tree import Shape


@dataclass
class Draft:
    tokens: mx.array  # (B, k) int32; row b's real drafts are the first lengths[b], the rest padding
    q: mx.array | None  # (B, k, V) draft distributions, or None for deterministic (one-hot) drafts
    lengths: list[int]  # realized draft length per row (a stop, p_min or auto's, may cut it short)
    requested: list[int]  # the width each row was asked for
    chances: list[list[float]] | None = None  # per row, each drafted token's chance to pass as its source
    #                                           estimates it (n-gram match, the draft's confidence), if it does
    tree: Shape | None = None  # a tree of drafts (tree.py; tokens by node, lengths its nodes), None for chains
    caught_up: list[int] | None = None  # per row, committed tokens the source prefilled before drafting (a backlog)
    kept_up: list[int] | None = None  # per row, tokens of that backlog the kept prefills held
    catch_up_s: float = 0.0  # ... and the seconds that took

    @property
    def k(self) -> int:
        return self.tokens.shape[1]


def empty(caps: list[int]) -> Draft:
    return Draft(mx.zeros((len(caps), 0), mx.int32), None, [0] * len(caps), list(caps))


def drawing(keys: list, caps: list[int]) -> Callable[[mx.array, int], mx.array]:
    """draw(q, j): each row's token at draft position j from its q (B, V), with the row's own keys (so it draws what
    it would draw alone); past the row's cap, its argmax (padding)."""
    split = [mx.random.split(key, max(c, 1)) for key, c in zip(keys, caps)]
    return lambda q, j: mx.concatenate([sample(q[b], split[b][j]).reshape(1) if j < c else
                                        mx.argmax(q[b]).reshape(1) for b, c in enumerate(caps)]).astype(mx.int32)


def autoregress(step: Callable[[mx.array | None], mx.array], caps: list[int], sp: SamplingParams, keys: list,
                p_min: float = 0.0, stop: Stop | None = None, dists: bool = False, guide=None) -> Draft:
    """Draw up to caps[b] tokens per row, one per call of `step` (the previous draws (B,) -> next-token logits
    (B, V); None for the first), through the same sampling code as the target's p; row b draws with its own keys,
    so it draws what it would draw alone. Where each row stops: stop.Rule (p_min, or draft = auto's Plan.stop).
    Under a constraint (`guide`, constrain.Guide), each step's logits are masked by the matcher after the row's
    drafts so far: q is restricted along the draft's own path."""
    B, k = len(caps), max(caps)
    draw = None if sp.greedy else drawing(keys, caps)
    rule, tokens, qs = Rule(caps, sp.greedy, p_min, stop), [], []
    lengths, t = rule.lengths, None
    along = guide.along(B) if guide is not None and guide.active else None
    for j in range(k):
        logits = step(t) if along is None else along(t, step(t))
        if sp.greedy:
            t = mx.argmax(logits, axis=-1).astype(mx.int32)
            conf = mx.softmax(logits.astype(mx.float32), axis=-1)
            if dists:  # (what a tree's siblings are chosen from; the greedy law reads no q)
                qs.append(conf)
        else:
            conf = q = probs(logits, sp)
            t = draw(q, j)
            qs.append(q)
        if rule.weighs:
            rule.weigh(j, conf.max(axis=-1).tolist())
            if max(lengths) <= j:
                break
        if rule.stop.ends:
            rule.drawn(j, t.tolist())
        tokens.append(t)
        mx.async_eval(t)
        if max(lengths) <= j + 1:
            break  # no row goes on: no further step
    if along is not None:
        along.close()
    if not tokens:
        return empty(caps)
    q = mx.stack(qs[: len(tokens)], axis=1) if qs else None
    return Draft(mx.stack(tokens, axis=1), q, lengths, rule.asked, rule.chances())


def with_forced(draft: Draft, forced: list[list[int]]) -> Draft:
    """`draft` with each row that has forced tokens (where a constraint allows one token at a time) drafting those
    instead: deterministic (a one-hot q where the draft has a q), as a chain (in a tree, the row's only line)."""
    B, k = len(forced), max(draft.k, max(len(f) for f in forced))
    old = draft.tokens.tolist() if draft.k else [[] for _ in forced]
    rows = [f or t for f, t in zip(forced, old)]
    tokens = mx.array([r + [0] * (k - len(r)) for r in rows], dtype=mx.int32).reshape(B, k)
    on = [bool(f) for f in forced]
    q = draft.q
    if q is not None:
        q = mx.pad(q, [(0, 0), (0, k - draft.k), (0, 0)]) if k > draft.k else q
        q = mx.where(mx.array(on)[:, None, None], (mx.arange(q.shape[-1]) == tokens[..., None]).astype(q.dtype), q)
    tree = None
    if draft.tree is not None:
        parents = np.full((B, k), -1)
        parents[:, : draft.k] = draft.tree.parents
        for b, f in enumerate(forced):
            if f:
                parents[b] = -1
                parents[b, : len(f)] = np.arange(len(f))
        tree = Shape.of(parents)
    lengths = [len(f) or n for f, n in zip(forced, draft.lengths)]
    requested = [len(f) or n for f, n in zip(forced, draft.requested)]
    chances = None if draft.chances is None else [[1.0] * len(f) if f else c for f, c in zip(forced, draft.chances)]
    return Draft(tokens, q, lengths, requested, chances, tree)


class Drafter(Protocol):
    """What the engine asks of a drafter; one that subclasses it declares only where it differs. Settings (a tree
    spec, the rows' constraints) are given when it is made."""

    name: str = "none"
    speculates: bool = True  # False only for plain decoding
    needs_hidden: bool = False  # asks the engine for the target's hidden states (its last layer's, after the norm)
    taps: tuple[int, ...] = ()  # ... or the outputs of these target layers, joined (an EAGLE-3 head's)
    max_rows: int | None = None  # caps the batch (None: any)
    cached: int = 0  # prompt tokens the last `start` took from kept prefills (prefix.py) instead of prefilling them
    prefilled: int = 0  # ... and those it prefilled (0: none, or a deferred draft model's, counted when it joins)

    def add_rows(self, n: int) -> None:
        """The batch grows by n rows."""

    def keep_rows(self, rows: list[int]) -> None:
        """The batch keeps these rows, in this order."""

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        """A row begins a prompt (hidden: the target's prompt states; keep: the next row starts the same prompt)."""

    def propose(self, contexts, caps, sp, keys, plan: Plan | None = None) -> Draft:
        """Up to caps[b] tokens for row b, drawn with keys[b]."""
        return empty(caps)

    def commit(self, contexts, n_accepted, hidden=None) -> None:
        """The contexts hold the committed tokens; n_accepted[b] of row b's drafts passed."""


class Source(Drafter):
    """What draft = auto asks of each of its sources besides (drafters.auto, policy.AutoPolicy)."""

    stops: bool = False  # drafts autoregressively and stops itself where a token is not worth its cost (Plan.stop)
    defer: bool = False  # prefills a row's prompt only when it first drafts (`backlog`; draft = auto weighs that)

    def backlog(self, row: int, context: list[int]) -> int | None:
        """How many committed tokens of the row the source would have to prefill before it drafts now (a draft
        model's deferred prompt, or what it missed while others drafted); None: it prefills nothing."""
        return None

    def available(self, contexts: list, k: int) -> list[list[float]] | None:
        """A deterministic source's draft of each row at width k, before drafting: each token's estimated chance to
        pass; None: no estimates (the source's kept acceptance stands for them)."""
        return None


class HeadDrafter(Source):
    """A head over the target's own hidden states (EAGLE-3, DFlash): its cache (`lm`) keeps a row per batch row, and
    each row's new states (of the pass that committed them), each with the token after it, wait in `pending` until
    the row's next proposal (`_padded`)."""

    needs_hidden = True

    def __init__(self, model, role: str, prefill_step: int = 512):
        self.model, self.io, self.taps = model, model.io, model.io.taps
        self.lm = LM(model, role=role, prefill_step=prefill_step)
        self.prefill_step = prefill_step
        self.pending: list[tuple[list[mx.array], list[int]]] = []  # per row: states and tokens not yet fed
        self.seen: list[int] = []  # per row: the context's length when its states were last taken

    def add_rows(self, n: int) -> None:
        self.lm.add_rows(n)
        self.pending += [([], []) for _ in range(n)]
        self.seen += [0] * n

    def keep_rows(self, rows: list[int]) -> None:
        self.lm.keep_rows(rows)
        self.pending, self.seen = [self.pending[r] for r in rows], [self.seen[r] for r in rows]

    def start(self, row: int, prompt: list[int], hidden: mx.array | None = None, keep: bool = False) -> None:
        """`hidden`: the target's states of prompt[:-1], each paired with the token after it."""
        keep_n = self.lm.pos.copy()
        keep_n[row] = 0
        self.lm.truncate(keep_n)
        n = 0 if hidden is None else hidden.shape[1]
        self.pending[row] = ([hidden], list(prompt[1 : n + 1])) if n else ([], [])
        self.seen[row] = len(prompt)

    def commit(self, contexts, n_accepted, hidden: mx.array | None = None) -> None:
        """Each row's new pairs: its committed tokens with the states of their pass."""
        for b, c in enumerate(contexts):
            n = len(c) - self.seen[b]
            if n and hidden is not None:
                hs, ts = self.pending[b]
                self.pending[b] = (hs + [hidden[b : b + 1, :n]], ts + list(c[-n:]))
            self.seen[b] = len(c)

    def _padded(self) -> tuple[mx.array, np.ndarray, np.ndarray] | None:
        """The pending states (B, m, H), tokens and validity (B, m), rows left-padded, taken out of `pending`."""
        lens = [len(t) for _, t in self.pending]
        if not (m := max(lens, default=0)):
            return None
        first = next(hs[0] for hs, _ in self.pending if hs)
        states = mx.zeros((len(lens), m, first.shape[-1]), first.dtype)
        tokens, valid = np.zeros((len(lens), m), np.int32), np.zeros((len(lens), m), bool)
        for b, ((hs, ts), n) in enumerate(zip(self.pending, lens)):
            if n:
                states[b, m - n :] = mx.concatenate(hs, axis=1)[0] if len(hs) > 1 else hs[0][0]
                tokens[b, m - n :], valid[b, m - n :] = ts, True
        self.pending = [([], []) for _ in lens]
        return states, tokens, valid


class NoDraft(Drafter):
    """Plain autoregressive decoding through the same verify/commit path (k = 0)."""

    speculates = False
