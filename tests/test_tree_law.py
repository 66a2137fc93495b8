"""The tree law alone (verify.tree), on a tiny vocabulary without a model: the first and second committed tokens
follow the target's distribution for deterministic candidates and for candidates sampled from a draft (siblings
without replacement), at T = 1 and T = 0.7 with top-k; a law that takes a sibling on the wrong proposal must fail."""

import functools

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import verify
from mtpcli.sampling import SamplingParams, probs
from mtpcli.tree import Shape, merge
from stattools import fits

from helpers import marginals

V, N = 6, 6000
CASES = [SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=4)]


@functools.lru_cache(maxsize=None)
def dist(ctx: tuple, draft: bool, sp) -> np.ndarray:
    """A fixed random 'model': logits depend on the whole context; the draft's are the target's plus noise."""
    rng = np.random.default_rng(hash(ctx) % 2**32)
    x = rng.normal(0, 1.5, V)
    if draft:
        x = x + np.random.default_rng(hash(ctx) % 2**32 + 7).normal(0, 1.0, V)
    return np.array(probs(mx.array(x, dtype=mx.float32), sp), dtype=np.float64)


def draw(p: np.ndarray, rng) -> int:
    return int(rng.choice(V, p=p / p.sum()))


def draft_tree(ctx: tuple, sp, rng, sampled: bool):
    """A main chain of 3 from the draft; at the root two more children, the first with a child of its own; at depth
    1 a second child. Siblings are the draft's next most likely tokens (deterministic) or drawn without replacement
    from its q (sampled), each with the proposal it was drawn from."""
    pick = (lambda q: draw(q, rng)) if sampled else (lambda q: int(np.argmax(q)))
    chain, qs = [], []
    for j in range(3):
        qs.append(dist(ctx + tuple(chain), True, sp))
        chain.append(pick(qs[-1]))

    def without(q, tokens):
        r = np.where(np.isin(np.arange(V), tokens), 0.0, q)
        return r / r.sum()

    r1 = without(qs[0], [chain[0]])
    a1 = pick(r1)
    q_a1 = dist(ctx + (a1,), True, sp)
    t1 = pick(q_a1)
    r2 = without(qs[0], [chain[0], a1])
    a2 = pick(r2)
    r3 = without(qs[1], [chain[1]])
    a3 = pick(r3)
    cands = [chain, [a1, t1], [a2], chain[:1] + [a3]]
    rows = {(1, 0): (r1, qs[0]), (1, 1): (q_a1, q_a1), (2, 0): (r2, qs[0]), (3, 1): (r3, qs[1])}
    tokens, parents, origins = merge(cands, budget=8, width=3)
    q = np.stack([rows[(c, i)][0] if c else qs[i] for c, i in origins])
    wrong = np.stack([rows[(c, i)][1] if c else qs[i] for c, i in origins])  # siblings' q without the exclusions
    return tokens, parents, q, wrong


def run(sp, sampled: bool, wrong: bool, seed: int = 0):
    """N draws of the first two committed tokens: one tree per row of one batch, one law call."""
    ctx, rng = (1, 2), np.random.default_rng(seed)
    trees = [draft_tree(ctx, sp, rng, sampled) for _ in range(N)]
    width = max(len(t[0]) for t in trees)

    def pad(a, fill):
        return np.array([list(x) + [fill] * (width - len(x)) for x in a])

    tokens, parents = pad([t[0] for t in trees], 0), pad([t[1] for t in trees], -1)
    shape = Shape.of(parents)
    paths = [[[tokens[b][j - 1] for j in shape.path(b, pos)] for pos in range(width + 1)] for b in range(N)]
    p = np.stack([[dist(ctx + tuple(path), False, sp) for path in row] for row in paths])
    q = np.stack([np.concatenate([t[3 if wrong else 2], np.full((width - len(t[0]), V), 1.0 / V)]) for t in trees])
    q = mx.array(q, dtype=mx.float32) if sampled or wrong else None
    v = verify.tree(mx.array(p, dtype=mx.float32), q, mx.array(tokens), shape, mx.random.key(seed),
                    [len(t[0]) for t in trees])
    first, second, side = [], [], 0
    for b, (node, tok) in enumerate(zip(v.node.tolist(), v.token.tolist())):
        out = paths[b][node] + [tok]
        side += shape.path(b, node) != list(range(1, len(out)))  # the path left the first-child chain
        if len(out) < 2:  # the next cycle: a plain step
            out.append(draw(dist(ctx + tuple(out), False, sp), rng))
        first.append(out[0])
        second.append(out[1])
    return np.bincount(first, minlength=V), np.bincount(second, minlength=V), side / N


def exact(sp):
    """The first and second tokens' distributions under the target alone."""
    return marginals(lambda ctx: dist(tuple(ctx), False, sp), [1, 2])


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
@pytest.mark.parametrize("sp", CASES, ids=str)
def test_tree_law_commits_the_targets_distribution_at_the_first_and_second_token(sp, sampled):
    p1, p2 = exact(sp)
    c1, c2, side = run(sp, sampled, wrong=False)
    assert side > 0.05  # siblings were taken, not only the chain
    assert fits(c1, p1) and fits(c2, p2)


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_tree_law_with_a_siblings_wrong_proposal_fails(sampled):
    sp = CASES[0]
    p1, _ = exact(sp)
    c1, _, _ = run(sp, sampled, wrong=True)
    assert not fits(c1, p1)


def test_greedy_tree_follows_the_argmax_path():
    # root -> [3 -> [4], 5]: the target's argmax is 5 at the root, then 2: the path is the second child
    tokens, parents, _ = merge([[3, 4], [5]], budget=8, width=2)
    logits = np.zeros((1, 4, V), np.float32)
    logits[0, 0, 5] = logits[0, 3, 2] = 9.0
    v = verify.tree(mx.array(logits), None, mx.array([tokens]), Shape.of(np.array([parents])), None, greedy=True)
    assert (int(v.node[0]), int(v.n_accepted[0]), int(v.token[0])) == (3, 1, 2)
