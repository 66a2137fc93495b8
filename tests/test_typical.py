"""Typical acceptance (Medusa-2): an opt-in lane that is NOT distribution-exact."""

import math

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import verify
from mtpcli.sampling import SamplingParams, probs
from stattools import fits


def test_entropy_and_floor_on_hand_made_rows():
    p = mx.array([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    h = np.array(verify.typical_floor(p, 0.2, 1.0)[1])
    assert np.allclose(h, [math.log(4), 0.0, math.log(2)], atol=1e-6)
    floor, _ = verify.typical_floor(p, threshold=0.2, eps=1.0)
    assert np.allclose(np.array(floor), [0.2 / 4, 0.2, 0.1], atol=1e-6)
    floor, _ = verify.typical_floor(p, threshold=0.2, eps=0.06)  # eps caps the floor
    assert np.allclose(np.array(floor), [0.05, 0.06, 0.06], atol=1e-6)


def test_argmax_is_always_typical():
    rows = probs(mx.random.normal((500, 64), key=mx.random.key(0)) * 3, SamplingParams(temp=1.0))
    best = mx.argmax(rows, axis=-1)
    for delta in (0.09, 0.2, 0.5, 0.99):
        floor, _ = verify.typical_floor(rows, delta, 1.0)
        assert bool((mx.take_along_axis(rows, best[:, None], -1)[:, 0] > floor).all())


@pytest.mark.slow
def test_accepts_longest_typical_prefix_and_resamples_from_p():
    # position 0: draft token has p = 0.7 (typical); position 1: p = 0.01 (atypical); bonus row.
    p = mx.array([[[0.7, 0.1, 0.1, 0.1], [0.01, 0.33, 0.33, 0.33], [0.25] * 4]])
    toks = []
    for seed in range(300):
        v = verify.typical(p, mx.array([[0, 0]]), mx.random.key(seed), threshold=0.2)
        assert v.n_accepted.item() == 1
        toks.append(v.token.item())
    assert fits(np.bincount(toks, minlength=4), np.array(p[0, 1]))  # drawn from the first atypical row
    # Resample from p itself (not the residual): the rejected token can come back.
    toks = [verify.typical(p[:, 1:], mx.array([[0]]), mx.random.key(s), threshold=100.0).token.item()
            for s in range(400)]
    counts = np.bincount(toks, minlength=4)
    assert fits(counts, np.array(p[0, 1]))


def test_very_large_delta_resamples_every_position_from_p():
    p = mx.array([[[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]])
    v = verify.typical(p, mx.array([[0, 1]]), mx.random.key(0), threshold=1e9)
    assert v.n_accepted.item() == 0


@pytest.mark.slow
def test_typical_lane_is_measurably_not_exact():
    """A case built so that it must differ: a draft that always proposes a typical but unlikely token."""
    sp = SamplingParams(temp=1.0)
    p = probs(mx.array([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5]]), sp)  # target row
    N = 20000
    P = mx.broadcast_to(mx.concatenate([p, p])[None], (N, 2, 6))
    draft = mx.full((N, 1), 2, mx.int32)  # always token 2: typical under delta 0.09, p(2) ~ 0.13
    v = verify.typical(P, draft, mx.random.key(3), threshold=0.09)
    first = np.where(np.array(v.n_accepted) == 1, 2, np.array(v.token))
    assert not fits(np.bincount(first, minlength=6), np.array(p[0]))
    # the exact law on the same case is exact (the harness can tell the two apart)
    ve = verify.exact(P, None, draft, mx.random.key(3))
    first = np.where(np.array(ve.n_accepted) == 1, 2, np.array(ve.token))
    assert fits(np.bincount(first, minlength=6), np.array(p[0]))


@pytest.fixture
def run(tiny):
    from helpers import decode
    return lambda **kw: decode(tiny, "the sea is ", max_tokens=40, **kw)


def test_threshold_zero_is_the_exact_law_byte_for_byte(run):
    sp = SamplingParams(temp=1.0, top_p=0.95)
    exact, e1 = run(sampling=sp, seed=5)
    zero, e2 = run(sampling=sp, seed=5, typical_threshold=0.0)
    assert exact == zero and e1.cfg.law == e2.cfg.law == "exact"
    assert e2.stats.typical is None


def test_t0_is_a_noop(run):
    greedy, _ = run()
    typ, eng = run(typical_threshold=0.2)
    assert typ == greedy and eng.cfg.law == "greedy"


def test_typical_run_records_its_statistics(run):
    _, eng = run(sampling=SamplingParams(temp=1.0), typical_threshold=0.09, seed=1)
    t = eng.stats.typical_summary()
    assert t["distribution_exact"] is False and t["threshold"] == 0.09 and t["eps"] == 1.0
    assert t["positions"] >= t["accepted"] > 0
    assert t["resamples"] <= eng.stats.cycles
    assert t["mean_entropy"] > 0 and 0 < t["mean_floor"] <= 0.09
    assert eng.stats.to_dict()["typical_acceptance"]["enabled"] is True
