"""A smaller model of the same tokenizer drafts autoregressively, over the same cache layer as the target."""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from ..cache import LM
from ..sampling import SamplingParams
from ..tree import Shape, merge, pays
from ..stop import passes
from . import Draft, Drafter, autoregress


def chain_or_tree(drafter, step, caps, sp: SamplingParams, keys, plan) -> Draft:
    """A sampled source's draft through `step` (autoregress): a chain, or with a node budget the drafter's tree."""
    if not drafter.nodes:
        return autoregress(step, caps, sp, keys, drafter.p_min, stop=plan and plan.stop, guide=drafter.guide)
    split = [mx.random.split(k) if k is not None else (None, None) for k in keys]
    caps = [min(c, drafter.nodes) for c in caps]  # the tree's chain fits its budget
    chain = autoregress(step, caps, sp, [a for a, _ in split], drafter.p_min, stop=plan and plan.stop,
                        dists=True, guide=drafter.guide)
    return drafter.tree(chain, sp, [b for _, b in split])


class ModelDrafter(Drafter):
    name = "model"
    stops = True
    trees = True

    def __init__(self, model, p_min: float = 0.0, prefill_step: int = 512, defer: bool = False):
        """`defer`: a row starts with an empty cache and prefills its context when it first drafts (draft = auto
        brings it in once that pays: policy.AutoPolicy.plan); else it prefills the prompt at the start."""
        self.lm = LM(model, role="draft model", prefill_step=prefill_step)
        self.lm.require_rollback()  # refused before decoding, not at the first rejection
        self.max_rows = 1 if self.lm.one_row else None
        self.p_min, self.defer = p_min, defer
        self._proposed_from: list[int] = []
        self._fed = 0
        self._kept: dict[int, int] = {}  # a deferred row's prompt tokens the kept prefills hold (for its price)
        self._prefilled = 0

    @property
    def cached(self) -> int:
        return self.lm.cached

    @property
    def prefilled(self) -> int:
        return self._prefilled

    def add_rows(self, n: int) -> None:
        self.lm.add_rows(n)

    def keep_rows(self, rows: list[int]) -> None:
        self.lm.keep_rows(rows)
        self._kept = {i: self._kept.get(r, 0) for i, r in enumerate(rows)}

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        self.lm.set_row(row, [] if self.defer else prompt[:-1], keep and not self.defer)
        self._kept[row] = self.lm.kept(prompt[:-1]) if self.defer else 0
        self._prefilled = 0 if self.defer or self.lm.reused else len(prompt) - 1 - self.lm.cached
        self._fed = 0  # a draft proposed for the row before (and never committed) is gone with it

    def backlog(self, row: int, context: list[int]) -> int:
        """What the row would prefill before drafting now (auto prices the draft model's coming in by it): its
        context past the cache, less what the kept prefills hold of a row not prefilled yet."""
        pos = int(self.lm.pos[row])
        return len(context) - pos - (self._kept.get(row, 0) if pos == 0 else 0)

    def propose(self, contexts, caps, sp: SamplingParams, keys, plan=None) -> Draft:
        B = len(contexts)
        t0, caught, kept = time.perf_counter(), [0] * B, [0] * B
        for b, c in enumerate(contexts):  # a deferred row's first draft: its prefill, as at an eager start
            if self.defer and self.lm.pos[b] == 0 and len(c) > 1:
                self.lm.set_row(b, c[:-1])
                kept[b] = self.lm.cached
                caught[b] = len(c) - 1 - kept[b]
        catch_up_s = time.perf_counter() - t0 if any(caught) else 0.0
        self._proposed_from, self._fed = [len(c) for c in contexts], 0
        pending = [c[int(p):] for c, p in zip(contexts, self.lm.pos)]  # committed, not yet cached
        m = max(len(p) for p in pending)
        x, valid = np.zeros((B, m), np.int32), np.zeros((B, m), bool)
        for b, p in enumerate(pending):
            x[b, m - len(p):], valid[b, m - len(p):] = p, True
        step_n = self.lm.prefill_step
        while x.shape[1] > step_n + 1:  # a long backlog (cycles another source drafted): in chunks, committed
            self.lm.forward(mx.array(x[:, :step_n]), valid[:, :step_n], last=True)
            mx.eval([getattr(c, "state", []) for c in self.lm.caches])
            x, valid = x[:, step_n:], valid[:, step_n:]
        block = [mx.array(x), valid]
        self.lm.checkpoint()  # recurrent draft models: the state to come back to

        def step(t):
            if t is not None:
                block[:] = [t[:, None], None]
            self._fed += 1
            return self.lm.forward(*block, last=True)[:, -1]

        draft = chain_or_tree(self, step, caps, sp, keys, plan)
        draft.caught_up, draft.kept_up, draft.catch_up_s = caught, kept, catch_up_s
        return draft

    def tree(self, chain: Draft, sp: SamplingParams, keys: list) -> Draft:
        """The chain, and siblings at its least sure positions (where the draft's most likely token is least
        probable), `children` - 1 at most per position and `nodes` in all: at T = 0 the draft's next most likely
        tokens, at T > 0 drawn without replacement from its q (Gumbel-top-k), each with the proposal it was drawn
        from (q without the tokens before it). Where siblings go depends on the chain's q, never on their tokens;
        so does whether the tree pays (tree = auto), decided before any sibling is drawn."""
        if not chain.k:
            return chain
        q, V, c = chain.q, chain.q.shape[-1], self.children - 1
        conf = q.max(axis=-1).tolist()
        rest = mx.where(mx.arange(V) == chain.tokens[:, :, None], 0.0, q)  # q without the chain's token, per depth
        top, mass = mx.sort(mx.topk(rest, c, axis=-1), axis=-1)[..., ::-1], (rest * rest).sum(-1) / rest.sum(-1)
        top, mass, count = top.tolist(), mass.tolist(), (rest > 0).sum(-1).tolist()
        plans = []  # per row: (depth, siblings' chances) at its least sure depths, within the node budget
        for b, n in enumerate(chain.lengths):
            plan, room = [], self.nodes - n
            for d in sorted(range(n), key=lambda d: conf[b][d]):
                if room <= 0:
                    break
                take = min(c, room, count[b][d])  # (a truncated q has few tokens)
                # a sibling's chance: at T = 0 its draft probability, at T > 0 what a draw is expected to hold
                plan.append((d, top[b][d][:take] if sp.greedy else [mass[b][d]] * take))
                room -= take
            plans.append(plan)
        if self.cost is not None:  # (the tree's shape alone: siblings are distinct, so tokens do not change it)
            chances = []
            for b, (n, plan) in enumerate(zip(chain.lengths, plans)):
                alts = [(d, x) for d, xs in plan for x in xs]
                _, parents, origins = merge([list(range(n))] + [list(range(d)) + [-1 - i] for i, (d, _) in
                                                                enumerate(alts)], self.nodes, self.children)
                chances.append((parents, [passes(conf[b][i], sp.greedy) if o == 0 else alts[o - 1][1]
                                          for o, i in origins]))
            if not pays(chances, chain.lengths, self.cost):
                return Draft(chain.tokens, None if sp.greedy else chain.q, chain.lengths, chain.requested,
                             chain.chances)
        rows = []
        for b, (n, plan) in enumerate(zip(chain.lengths, plans)):
            toks, split = chain.tokens[b].tolist()[:n], None if sp.greedy else mx.random.split(keys[b], n)
            cands, props = [toks], {}
            for d, xs in plan:
                r = rest[b, d]  # at T = 0 its largest, at T > 0 the Gumbel-top-k (draws without replacement, in order)
                key = -r if sp.greedy else -(mx.log(r) + mx.random.gumbel(shape=(V,), key=split[d]))
                idx = mx.argpartition(key, len(xs) - 1)[: len(xs)]
                alts = idx[mx.argsort(key[idx])].tolist()
                for a in alts:
                    props[len(cands)] = r / r.sum()
                    r = mx.where(mx.arange(V) == a, 0.0, r)
                    cands.append(toks[:d] + [a])
            tokens, parents, origins = merge(cands, self.nodes, self.children)
            rows.append((tokens, parents, [q[b, i] if o == 0 else props[o] for o, i in origins]))
        N = max(len(t) for t, _, _ in rows)
        pad = mx.full((V,), 1.0 / V)
        return Draft(mx.array([t + [0] * (N - len(t)) for t, _, _ in rows], dtype=mx.int32),
                     mx.stack([mx.stack(r + [pad] * (N - len(r))) for _, _, r in rows]),
                     [len(t) for t, _, _ in rows], chain.requested, chain.chances,
                     Shape.of(np.array([p + [-1] * (N - len(p)) for _, p, _ in rows])))

    def commit(self, contexts, n_accepted, hidden=None) -> None:
        if self._fed:  # the cache holds each row's old context, its pending tokens and fed-1 drafts
            self.lm.truncate(np.array([f + min(self._fed - 1, n) for f, n in zip(self._proposed_from, n_accepted)]))
        self._fed = 0
