"""One function shapes p and q: temperature, top-k, top-p, min-p."""

import mlx.core as mx
import numpy as np

from mtpcli.sampling import SamplingParams, probs

LOGITS = mx.array([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])


def p_of(**kw):
    return np.array(probs(LOGITS, SamplingParams(**kw)))[0]


def test_rows_sum_to_one_and_temperature_sharpens():
    hot, cold = p_of(temp=2.0), p_of(temp=0.5)
    assert np.isclose(hot.sum(), 1) and np.isclose(cold.sum(), 1)
    assert cold[0] > hot[0]


def test_greedy_is_one_hot_argmax():
    assert p_of(temp=0.0).tolist() == [1, 0, 0, 0, 0, 0]


def test_top_k_keeps_k_most_likely():
    p = p_of(temp=1.0, top_k=2)
    assert (p > 0).sum() == 2 and p[0] > 0 and p[1] > 0


def test_top_p_keeps_smallest_set_reaching_mass():
    full = p_of(temp=1.0)
    p = p_of(temp=1.0, top_p=0.7)
    need = int(np.searchsorted(np.cumsum(full), 0.7) + 1)
    assert (p > 0).sum() == need
    assert np.allclose(p[:need], full[:need] / full[:need].sum())


def test_min_p_drops_tokens_below_fraction_of_top():
    full = p_of(temp=1.0)
    p = p_of(temp=1.0, min_p=0.2)
    assert ((p > 0) == (full >= 0.2 * full[0])).all()


def test_works_on_batched_rows():
    x = mx.random.normal((3, 4, 50))
    p = probs(x, SamplingParams(temp=0.8, top_k=10, top_p=0.9))
    assert p.shape == (3, 4, 50)
    assert np.allclose(np.array(p.sum(-1)), 1, atol=1e-5)
    assert (np.array((p > 0).sum(-1)) <= 10).all()


def test_partial_selection_equals_the_full_sort_wherever_it_says_it_found_the_nucleus(monkeypatch):
    from mtpcli import sampling

    found = missed = 0
    for candidates in (4096, 64):  # the shipped size on Qwen's vocabulary, then few enough to miss some nuclei
        monkeypatch.setattr(sampling, "CANDIDATES", candidates)
        for scale in (1.0, 4.0, 12.0):
            x = mx.random.normal((6, 151936), key=mx.random.key(int(scale))) * scale
            for kw in (dict(temp=1.0, top_p=0.95), dict(temp=0.7, top_p=0.9, top_k=50), dict(temp=1.3, top_p=0.5, min_p=0.05)):
                sp = SamplingParams(**kw)
                part, complete = sampling.shaped(x, sp)
                full, _ = sampling.shaped(x, sp, full=True)
                complete = np.array(complete)
                found, missed = found + complete.sum(), missed + (~complete).sum()
                assert (np.array(part)[complete] == np.array(full)[complete]).all()
                assert (np.array(part) > 0).sum(-1).min() >= 1
    assert found > 0 and missed > 0  # both kinds of row were exercised
