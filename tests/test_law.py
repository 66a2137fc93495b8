"""mtpcli samples mlx-lm's law under mlx-lm's flags: top-p, min-p and top-k truncate the untempered log-probabilities,
and the temperature shapes what is left (mlx_lm.sample_utils.make_sampler). Draws of mtpcli's plain decoding and of
its speculative decoding are tested against mlx-lm's own sampler on the same logits, with all four set together;
the law mtpcli had before (the temperature first, then top-k, top-p and min-p) is the negative control."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_sampler

from mtpcli.sampling import SamplingParams
from stattools import fits, same, tv
from helpers import N, decode, marginals, model_law

PROMPT = "abcabcab"
CASES = [SamplingParams(temp=0.7, top_p=0.9, top_k=10, min_p=0.05), SamplingParams(temp=1.5, top_p=0.7, top_k=8,
                                                                                 min_p=0.1)]


def mlx_lm_law(logits: mx.array, sp: SamplingParams) -> np.ndarray:
    """The distribution mlx-lm's sampler draws from: its own filters, in its order, then the temperature."""
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    lp = apply_top_k(apply_min_p(apply_top_p(lp, sp.top_p), sp.min_p), sp.top_k)
    return np.array(mx.softmax(lp / sp.temp, axis=-1))


def todays_law(logits: mx.array, sp: SamplingParams) -> np.ndarray:
    """mtpcli's law before it followed mlx-lm's: the temperature first, then top-k, top-p (of what top-k kept), min-p."""
    p = np.array(mx.softmax(logits / sp.temp, axis=-1), dtype=np.float64)
    p = np.where(p >= np.sort(p)[-sp.top_k], p, 0.0)
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    p = np.where(p >= p[order][before < sp.top_p * p.sum()].min(), p, 0.0)
    p = np.where(p >= sp.min_p * p.max(), p, 0.0)
    return p / p.sum()


@pytest.mark.slow
@pytest.mark.parametrize("sp", CASES, ids=str)
def test_plain_and_speculative_draws_follow_mlx_lms_sampler_and_not_todays_law(tiny, sp):
    target, _ = tiny
    ids = list(target.tokenizer.encode(PROMPT))
    p1, p2 = marginals(model_law(target.model, lambda x: mlx_lm_law(x, sp)), ids)
    o1, o2 = marginals(model_law(target.model, lambda x: todays_law(x, sp)), ids)
    assert tv(p1 * N, o1) > 0.05  # the two laws differ on this prompt: the test can tell them apart
    logits = target.model(mx.array([ids]))[:, -1]
    mx.random.seed(11)
    sampler = make_sampler(temp=sp.temp, top_p=sp.top_p, min_p=sp.min_p, top_k=sp.top_k)
    theirs = np.bincount(np.array(sampler(mx.repeat(logits - mx.logsumexp(logits), N, axis=0))), minlength=len(p1))
    plain, _ = decode(tiny, PROMPT, draft=False, n=N, max_tokens=2, sampling=sp, eos=(), batch_size=250)
    spec, eng = decode(tiny, PROMPT, width=3, n=N, max_tokens=2, sampling=sp, eos=(), batch_size=250)
    assert 0 < eng.stats.accepted < eng.stats.drafted  # it speculated, and the law rejected some drafts
    counts = {name: [np.bincount([o[i] for o in outs], minlength=len(p1)) for i in (0, 1)]
              for name, outs in (("plain", plain), ("speculative", spec))}
    assert fits(theirs, p1)  # (mlx-lm's sampler draws its own law)
    for name, (first, second) in counts.items():
        assert fits(first, p1) and fits(second, p2), name
        assert same(first, theirs), name  # the same distribution as mlx-lm's own draws
        assert not fits(first, o1) and not fits(second, o2), name  # negative control: today's law is told apart
    assert not fits(theirs, o1)
