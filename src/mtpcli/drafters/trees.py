"""Draft trees (tree.py) as the sources build them, to the spec each was made with (tree.Spec): a lookup's
candidates merged (n-gram, history), or a sampled chain with siblings at its least sure positions (a draft model,
EAGLE-3 heads). Under tree = auto a tree is drafted only where it pays (tree.pays)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..sampling import SamplingParams
from ..stop import passes
from ..tree import Shape, Spec, chain, merge, pays
from . import Draft, autoregress


def price(spec: Spec, plan):
    """What tree = auto weighs a tree by (None: always the tree): draft = auto's table (Plan.cost), else the spec's."""
    return spec.cost and (plan is not None and plan.cost or spec.cost)


def as_chain(found: list[tuple[list[int], list[float]]]) -> Draft:
    """Each row's draft (tokens, estimates) as one chain draft."""
    k = max(len(f) for f, _ in found)
    tokens = mx.array([f + [0] * (k - len(f)) for f, _ in found], dtype=mx.int32).reshape(len(found), k)
    lengths = [len(f) for f, _ in found]
    return Draft(tokens, None, lengths, lengths, [c for _, c in found])


def lookup(src, contexts, caps, plan) -> Draft | None:
    """A lookup source's (`src`, Lookup) tree: each row's candidates merged into a tree of at most `nodes` nodes, as
    deep as its cap; None (a chain) under tree = auto where the tree does not pay."""
    spec, cost = src.trees, price(src.trees, plan)
    rows, chances, firsts = [], [], []
    for b, (c, k) in enumerate(zip(contexts, caps)):
        cands = src.looks(b, c, min(k, spec.nodes), 2 * spec.children) if k > 0 else []
        firsts.append(cands[0] if cands else ([], []))
        tokens, parents, origins = merge([d for d, _ in cands], spec.nodes, spec.children)
        rows.append((tokens, parents, cands[0][1][:chain(parents)] if cands else []))
        chances.append((parents, [cands[o][1][i] for o, i in origins]))
    n = max(len(t) for t, _, _ in rows)
    if n == 0:
        return as_chain(firsts)  # (nothing found: nothing asked, as a chain's lookup)
    if cost is not None and (all(len(t) == len(c) for t, _, c in rows)  # (every row's tree: its chain)
                             or not pays(chances, [len(c) for _, _, c in rows], cost)):
        # the chain: a row's first candidate is its chain draft, where the tree was cut no shorter than it
        return as_chain(firsts) if all(k <= spec.nodes for k in caps) else None
    tokens = mx.array([t + [0] * (n - len(t)) for t, _, _ in rows], dtype=mx.int32)
    parents = np.array([p + [-1] * (n - len(p)) for _, p, _ in rows])
    return Draft(tokens, None, [len(t) for t, _, _ in rows], list(caps), [c for _, _, c in rows], Shape.of(parents))


def sampled(drafter, step, caps, sp: SamplingParams, keys, plan) -> Draft:
    """A sampled source's draft through `step` (autoregress): a chain, or with a tree spec its chain and siblings."""
    spec = drafter.trees
    if spec is None:
        return autoregress(step, caps, sp, keys, drafter.p_min, stop=plan and plan.stop, guide=drafter.guide)
    split = [mx.random.split(k) if k is not None else (None, None) for k in keys]
    caps = [min(c, spec.nodes) for c in caps]  # the tree's chain fits its budget
    drawn = autoregress(step, caps, sp, [a for a, _ in split], drafter.p_min, stop=plan and plan.stop,
                        dists=True, guide=drafter.guide)
    return siblings(drawn, sp, [b for _, b in split], spec, price(spec, plan))


def siblings(chain: Draft, sp: SamplingParams, keys: list, spec: Spec, cost) -> Draft:
    """The chain, and siblings at its least sure positions (where the draft's most likely token is least
    probable), spec.children - 1 at most per position and spec.nodes in all: at T = 0 the draft's next most likely
    tokens, at T > 0 drawn without replacement from its q (Gumbel-top-k), each with the proposal it was drawn
    from (q without the tokens before it). Where siblings go depends on the chain's q and lengths (an end
    token cuts a chain: its own draw), never on the siblings' tokens; so does whether the tree pays (tree = auto),
    decided before any sibling is drawn."""
    if not chain.k:
        return chain
    q, V, c = chain.q, chain.q.shape[-1], spec.children - 1
    conf = q.max(axis=-1).tolist()
    rest = mx.where(mx.arange(V) == chain.tokens[:, :, None], 0.0, q)  # q without the chain's token, per depth
    top, mass = mx.sort(mx.topk(rest, c, axis=-1), axis=-1)[..., ::-1], (rest * rest).sum(-1) / rest.sum(-1)
    top, mass, count = top.tolist(), mass.tolist(), (rest > 0).sum(-1).tolist()
    plans = []  # per row: (depth, siblings' chances) at its least sure depths, within the node budget
    for b, n in enumerate(chain.lengths):
        plan, room = [], spec.nodes - n
        for d in sorted(range(n), key=lambda d: conf[b][d]):
            if room <= 0:
                break
            take = min(c, room, count[b][d])  # (a truncated q has few tokens)
            # a sibling's chance: at T = 0 its draft probability, at T > 0 what a draw is expected to hold
            plan.append((d, top[b][d][:take] if sp.greedy else [mass[b][d]] * take))
            room -= take
        plans.append(plan)
    if cost is not None:  # (the tree's shape alone: siblings are distinct, so tokens do not change it)
        chances = []
        for b, (n, plan) in enumerate(zip(chain.lengths, plans)):
            alts = [(d, x) for d, xs in plan for x in xs]
            _, parents, origins = merge([list(range(n))] + [list(range(d)) + [-1 - i] for i, (d, _) in
                                                            enumerate(alts)], spec.nodes, spec.children)
            chances.append((parents, [passes(conf[b][i], sp.greedy) if o == 0 else alts[o - 1][1]
                                      for o, i in origins]))
        if not pays(chances, chain.lengths, cost):
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
        tokens, parents, origins = merge(cands, spec.nodes, spec.children)
        rows.append((tokens, parents, [q[b, i] if o == 0 else props[o] for o, i in origins]))
    N = max(len(t) for t, _, _ in rows)
    pad = mx.full((V,), 1.0 / V)
    return Draft(mx.array([t + [0] * (N - len(t)) for t, _, _ in rows], dtype=mx.int32),
                 mx.stack([mx.stack(r + [pad] * (N - len(r))) for _, _, r in rows]),
                 [len(t) for t, _, _ in rows], chain.requested, chain.chances,
                 Shape.of(np.array([p + [-1] * (N - len(p)) for _, p, _ in rows])))
