"""The acceptance laws as pure functions on hand-made probability arrays."""

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import verify
from mtpcli.sampling import SamplingParams, probs, sample
from stattools import fits, tv


def row(*xs):
    return [x / sum(xs) for x in xs]


def test_p_equal_q_accepts_everything():
    p = mx.array([[row(1, 2, 3, 4)] * 4])  # (1, 4, V): k = 3 drafts + bonus
    for seed in range(20):
        draft = mx.array([[0, 1, 3]])
        v = verify.exact(p, p[:, :3], draft, mx.random.key(seed))
        assert v.n_accepted.item() == 3


def test_disjoint_supports_reject_and_resample_from_p():
    p = mx.array([[row(0, 0, 1, 1), row(1, 1, 1, 1)]])  # target never emits tokens 0, 1
    q = mx.array([[row(1, 1, 0, 0)]])
    for seed in range(50):
        v = verify.exact(p, q, mx.array([[seed % 2]]), mx.random.key(seed))
        assert v.n_accepted.item() == 0
        assert v.token.item() in (2, 3)


def test_residual_is_normalised_and_falls_back_to_p():
    p = mx.array([row(5, 3, 2), row(1, 1, 1)])
    q = mx.array([row(2, 3, 5), row(1, 1, 1)])
    r = np.array(verify.residual(p, q, mx.array([0, 0])))
    assert np.allclose(r.sum(-1), 1.0)
    assert np.allclose(r[0], [1, 0, 0])  # (p - q)+ = (0.3, 0, 0) normalised
    assert np.allclose(r[1], np.array(p[1]))  # p == q: zero residual mass, fall back to p


def test_zero_q_at_draft_token_is_accepted_when_p_positive():
    p = mx.array([[row(1, 1), row(1, 1)]])
    q = mx.array([[row(0, 1)]])  # a drafter that proposed a token it gave probability 0
    v = verify.exact(p, q, mx.array([[0]]), mx.random.key(0))
    assert v.n_accepted.item() == 1


def test_one_hot_proposal_without_q():
    p = mx.array([[row(0, 1, 3), row(1, 1, 1)]])
    v = verify.exact(p, None, mx.array([[0]]), mx.random.key(1))  # p(0) = 0: always rejected
    assert v.n_accepted.item() == 0 and v.token.item() in (1, 2)
    r = np.array(verify.residual(p[:, :1], None, mx.array([[1]])))
    assert np.allclose(r[0, 0], [0, 0, 1])


def test_greedy_law_accepts_matching_prefix():
    logits = mx.array([[[0, 5, 1], [9, 0, 0], [0, 0, 3]]], dtype=mx.float32)
    v = verify.greedy(logits, mx.array([[1, 2]]))
    assert v.n_accepted.item() == 1 and v.token.item() == 0
    v = verify.greedy(logits, mx.array([[1, 0]]))
    assert v.n_accepted.item() == 2 and v.token.item() == 2


# ---- statistical exactness of the law on fixed rows ---------------------------------------------

V = 12
N = 40000


def _rows(seed, sp):
    rng = np.random.default_rng(seed)
    target = rng.normal(size=(3, V)) * 1.5
    draft = target + rng.normal(size=(3, V)) * 1.2
    return probs(mx.array(target, dtype=mx.float32), sp), probs(mx.array(draft, dtype=mx.float32), sp)


def wrong_law(p, q, draft, key):
    """Negative control: min(1, p/q) acceptance, but a rejection resamples from p, not the residual."""
    v = verify.exact(p, q, draft, key)
    k = draft.shape[-1]
    redo = sample(verify._at(p, v.n_accepted), mx.random.split(key)[1])
    return verify.Verdict(v.n_accepted, mx.where(v.n_accepted < k, redo, v.token))


def emitted(law, p, q, seed):
    """Emit N blocks of two drafted positions; return tokens at position 0 and at position 1."""
    kd, kv = mx.random.split(mx.random.key(seed))
    P = mx.broadcast_to(p[None], (N, 3, V))
    Q = mx.broadcast_to(q[None, :2], (N, 2, V))
    draft = sample(Q, kd).astype(mx.int32)  # (N, 2) drafted from q
    v = law(P, Q, draft, kv)
    n, tok, d = np.array(v.n_accepted), np.array(v.token), np.array(draft)
    first = np.where(n == 0, tok, d[:, 0])
    reached = n >= 1  # position 1 is emitted only when position 0 was accepted
    second = np.where(n[reached] == 1, tok[reached], d[reached, 1])
    return first, second


CASES = [
    SamplingParams(temp=0.7),
    SamplingParams(temp=1.0),
    SamplingParams(temp=1.0, top_k=5),
    SamplingParams(temp=0.7, top_p=0.8),
    SamplingParams(temp=1.3, top_k=8, top_p=0.9, min_p=0.02),
]


@pytest.mark.slow
@pytest.mark.parametrize("sp", CASES, ids=str)
def test_exact_law_reproduces_p_on_first_and_second_position(sp):
    p, q = _rows(0, sp)
    first, second = emitted(verify.exact, p, q, seed=1)
    assert fits(np.bincount(first, minlength=V), np.array(p[0]))
    assert fits(np.bincount(second, minlength=V), np.array(p[1]))
    assert tv(np.bincount(first, minlength=V), np.array(p[0])) < 0.02


@pytest.mark.slow
@pytest.mark.parametrize("sp", CASES[:2], ids=str)
def test_negative_control_wrong_law_is_rejected(sp):
    p, q = _rows(0, sp)
    first, second = emitted(wrong_law, p, q, seed=1)
    assert not fits(np.bincount(first, minlength=V), np.array(p[0]))
    assert not fits(np.bincount(second, minlength=V), np.array(p[1]))


def test_exact_law_acceptance_rate_is_sum_min_p_q():
    sp = SamplingParams(temp=1.0)
    p, q = _rows(3, sp)
    first, _ = emitted(verify.exact, p, q, seed=2)
    kd, kv = mx.random.split(mx.random.key(2))
    expected = float(mx.minimum(p[0], q[0]).sum())
    P = mx.broadcast_to(p[None], (N, 3, V))
    Q = mx.broadcast_to(q[None, :2], (N, 2, V))
    n = np.array(verify.exact(P, Q, sample(Q, kd).astype(mx.int32), kv).n_accepted)
    assert abs((n >= 1).mean() - expected) < 0.01
