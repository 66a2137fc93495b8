"""The decode loop on tiny random models built by the tests."""

import numpy as np
import pytest

from helpers import N, decode, resampled_from_p, target_marginals
from mtpcli import verify
from mtpcli.controller import EmaController
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.sampling import SamplingParams
from stattools import fit_two

PROMPTS = ["def fib(n):", "the sea is ", "x = 1\ny = ", "abc"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_plain_decoding(tiny, prompt):
    plain, _ = decode(tiny, prompt, draft=False, max_tokens=48)
    for width in (1, 3, 6):
        spec, eng = decode(tiny, prompt, width=width, max_tokens=48)
        assert spec == plain
        assert eng.stats.cycles < eng.stats.generated_tokens  # it really speculated
    adaptive, _ = decode(tiny, prompt, controller=EmaController(1, 6), max_tokens=48)
    assert adaptive == plain
    ngram, _ = decode(tiny, prompt, draft="ngram", max_tokens=48)
    assert ngram == plain


def test_same_seed_same_output_and_seed_matters(tiny):
    kw = dict(sampling=SamplingParams(temp=1.0, top_p=0.95), max_tokens=40)
    a, _ = decode(tiny, "abc", seed=7, **kw)
    b, _ = decode(tiny, "abc", seed=7, **kw)
    c, _ = decode(tiny, "abc", seed=8, **kw)
    assert a == b and a != c


def test_max_tokens_and_stats_are_consistent(tiny):
    (out,), eng = decode(tiny, "abc", max_tokens=17, sampling=SamplingParams(temp=1.0))
    s = eng.stats
    assert len(out) == 17 == s.generated_tokens
    assert s.accepted <= s.drafted and s.cycles == sum(s.accept_lengths.values())
    assert s.generated_tokens == s.accepted + s.cycles  # each cycle: accepted drafts + one token
    assert all(0 <= x <= 1 for x in s.accept_by_position)
    assert s.ttft_s > 0 and s.decode_tps > 0


def test_confidence_floor_cuts_drafts_and_stays_lossless(tiny):
    plain, _ = decode(tiny, "the sea is ", draft=False, max_tokens=40)
    spec, eng = decode(tiny, "the sea is ", width=5, p_min=0.6, max_tokens=40)
    assert spec == plain
    assert eng.stats.cut_short > 0
    assert len(eng.stats.draft_widths) > 1


def test_adaptive_run_uses_several_widths_within_bounds(tiny):
    _, eng = decode(tiny, "def fib(n):", controller=EmaController(2, 6), max_tokens=96,
                    sampling=SamplingParams(temp=0.7))
    widths = eng.runs[0].width_trace
    assert len(set(widths)) > 1
    # the last cycles may be narrowed by max_tokens; all others lie within [n_min, n_max]
    assert all(2 <= w <= 6 for w in widths[:-2])


# ---- end-to-end exactness at T > 0 --------------------------------------------------------------


def sampled_pairs(tiny, sp, seed=0, batch_size=250, p_min=0.0):
    outs, eng = decode(tiny, "the sea is ", width=3, n=N, max_tokens=3, sampling=sp, seed=seed, eos=(),
                       batch_size=batch_size, p_min=p_min)
    arr = np.array([o[:2] for o in outs])
    return arr[:, 0], arr[:, 1], eng


EXACT_CASES = [  # (sampling, rows decoded together: 1 is the dense one-row cache, 250 the ragged one)
    (SamplingParams(temp=0.7), 250),
    (SamplingParams(temp=1.0), 1),
    (SamplingParams(temp=1.0, top_k=8, top_p=0.9), 250),
    (SamplingParams(temp=0.7, top_p=0.8), 250),
]


@pytest.mark.slow
@pytest.mark.parametrize("sp,batch_size", EXACT_CASES, ids=str)
def test_speculative_output_is_distributed_as_the_target(tiny, sp, batch_size):
    target, _ = tiny
    ids = list(target.tokenizer.encode("the sea is "))
    p1, p2 = target_marginals(target, ids, sp)
    first, second, eng = sampled_pairs(tiny, sp, batch_size=batch_size)
    assert 0.2 < eng.stats.acceptance_rate < 0.95  # partial acceptance: the law really works
    assert eng.stats.reached[1] > N / 4  # the second drafted position was exercised
    assert fit_two(first, second, p1, p2) == (True, True)


@pytest.mark.slow
def test_negative_control_a_wrong_law_fails_the_same_test(tiny, monkeypatch):
    sp = SamplingParams(temp=1.0)
    target, _ = tiny
    p1, p2 = target_marginals(target, list(target.tokenizer.encode("the sea is ")), sp)
    monkeypatch.setattr(verify, "exact", resampled_from_p)
    first, second, _ = sampled_pairs(tiny, sp)
    assert fit_two(first, second, p1, p2) != (True, True)


@pytest.mark.slow
def test_ngram_drafting_is_exact_at_t1(tiny):
    sp = SamplingParams(temp=1.0, top_k=12)
    target, _ = tiny
    prompt = "abcabcabcab"
    ids = list(target.tokenizer.encode(prompt))
    p1, p2 = target_marginals(target, ids, sp)
    outs, eng = decode(tiny, prompt, draft="ngram", width=3, n=N, max_tokens=3, sampling=sp, eos=(), batch_size=250)
    arr = np.array([o[:2] for o in outs])
    assert eng.stats.reached[0] == eng.stats.cycles or eng.stats.reached[0] > N / 2  # it proposed
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) == (True, True)


def test_ngram_proposes_the_continuation_of_the_latest_match():
    d = NgramDrafter(1, 3)
    d.add_rows(3)
    ctx = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7]
    prop = d.propose([ctx, [1, 2, 3], ctx], [3, 3, 0], None, None)
    assert prop.q is None and prop.lengths == [3, 0, 0]  # no earlier occurrence / width 0: nothing proposed
    assert prop.tokens[0].tolist() == [9, 2, 5]  # the latest "5 6 7" was followed by 9
