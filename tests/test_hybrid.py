"""Rollback for caches that cannot be trimmed: a tiny Qwen3-Next-style hybrid (gated-delta + attention)."""

import numpy as np
import pytest

from mtpcli import models
from mtpcli.controller import FixedWidth
from mtpcli.drafters import NoDraft
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.sampling import SamplingParams
from stattools import fit_two
from helpers import collect, target_marginals


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from tiny import make_hybrid_model

    return models.load(str(make_hybrid_model(tmp_path_factory.mktemp("hybrid") / "h")))


def run(hybrid, drafter, width, prompt="abcabcab", n=1, **cfg):
    return collect(hybrid, drafter, FixedWidth(width), (), prompt, n, **cfg)


def test_hybrid_greedy_same_tokens_with_and_without_speculation(hybrid, tiny):
    plain, _ = run(hybrid, NoDraft(), 0, max_tokens=40)
    spec, eng = run(hybrid, NgramDrafter(1, 3), 4, max_tokens=40)
    assert spec == plain
    assert eng.stats.drafted > eng.stats.accepted  # there were rejections to roll back
    # a draft model whose cache is trimmable, on a recurrent target
    target, draft = tiny
    spec2, _ = run(hybrid, ModelDrafter(draft.model), 3, max_tokens=40)
    assert spec2 == plain


def test_hybrid_several_completions_restart_from_the_prompt(hybrid):
    outs, _ = run(hybrid, NgramDrafter(1, 3), 3, n=3, max_tokens=20)
    assert outs[0] == outs[1] == outs[2]  # greedy: every completion restarts from the same state


@pytest.mark.slow
def test_hybrid_speculation_is_exact_at_t1(hybrid):
    sp = SamplingParams(temp=1.0)
    ids = list(hybrid.tokenizer.encode("abcabcab"))
    p1, p2 = target_marginals(hybrid, ids, sp)
    N = 2000
    outs, eng = run(hybrid, NgramDrafter(1, 3), 3, n=N, max_tokens=3, sampling=sp)
    arr = np.array([o[:2] for o in outs])
    assert eng.stats.drafted > 0
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) == (True, True)
