"""Bugs found where the single and batched stacks disagreed about caches; each test failed on the old code."""

import json

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import models
from mtpcli.controller import FixedWidth
from mtpcli.drafters import NoDraft
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.sampling import SamplingParams
from stattools import fit_two, fits
from helpers import collect, decode, run, target_marginals

N = 2500


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 250])
def test_confidence_floor_keeps_the_exact_law_at_t1(tiny, batch_size):
    """Bug 1: the drafter used to sample a token and then stop when q(token) < p_min, so whether a position was
    drafted depended on the token drawn there. Worked by hand: p = (.5, .5), q = (.9, .1), p_min = .5 emits
    (.55, .45). The floor now looks only at q (its most likely token) before drawing."""
    sp = SamplingParams(temp=1.0)
    target, _ = tiny
    ids = list(target.tokenizer.encode("the sea is "))
    p1, p2 = target_marginals(target, ids, sp)
    outs, eng = decode(tiny, "the sea is ", width=3, n=N, max_tokens=3, sampling=sp, eos=(), p_min=0.3,
                       batch_size=batch_size)
    arr = np.array([o[:2] for o in outs])
    assert eng.stats.cut_short > N / 10 and eng.stats.drafted > N  # the floor really cut drafts, drafts happened
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) == (True, True)


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    from tiny import make_windowed_model

    return models.load(str(make_windowed_model(tmp_path_factory.mktemp("swa") / "m")))


@pytest.mark.parametrize("bucketed", [False, True])
def test_sliding_window_rollback_past_the_window_stays_greedy_lossless(windowed, tiny, bucketed, monkeypatch):
    """Bug 2: a rotating (sliding-window) cache could not be trimmed once it had wrapped, yet the offset was set
    back anyway: rejected drafts stayed in the cache, wrong tokens at T = 0 past the window."""
    from mlx_lm.generate import generate_step

    from mtpcli import cache, layout

    monkeypatch.setattr(cache, "BUCKETED_DEFAULT", bucketed)  # the CUDA layout too
    monkeypatch.setattr(layout, "STEP", 32)  # several bucket edges within 80 tokens
    prompt = "abcabcab hello"
    ids = list(windowed.tokenizer.encode(prompt))
    reference = []  # mlx-lm's own decoding, with its rotating cache
    for tok, _ in generate_step(mx.array(ids), windowed.model, max_tokens=80):
        reference.append(int(tok))
    plain, _ = collect(windowed, NoDraft(), FixedWidth(0), (), prompt, max_tokens=80)
    assert plain[0] == reference
    for drafter in (NgramDrafter(1, 3), ModelDrafter(tiny[1].model)):
        spec, eng = collect(windowed, drafter, FixedWidth(4), (), prompt, max_tokens=80)
        assert spec[0] == reference
        assert 0 < eng.stats.accepted < eng.stats.drafted  # rejections past the window were rolled back
    # several rows with holes, left padding and the window, each equal to its prompt alone
    reqs = [Request(i, list(windowed.tokenizer.encode(p)), 60, i) for i, p in enumerate(["abcabcab hello", "x",
                                                                                         "the sea is the sea"])]
    eng = Engine(windowed.model, NgramDrafter(1, 3), FixedWidth(3), (), DecodeConfig(), batch_size=3)
    out = run(eng, reqs)
    for r in reqs:
        alone, _ = collect(windowed, NoDraft(), FixedWidth(0), (), windowed.tokenizer.decode(r.prompt),
                           max_tokens=60)
        assert out[r.index] == alone[0]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from tiny import make_hybrid_model

    return models.load(str(make_hybrid_model(tmp_path_factory.mktemp("hyb") / "h", seed=3)))


@pytest.mark.slow
def test_a_recurrent_draft_model_rolls_back_by_snapshot(tiny, hybrid):
    """Bug 3: a recurrent (hybrid) draft model was accepted, then crashed at its first partial rejection or at
    the second -n completion ('no snapshot'). It now rolls back like a hybrid target: snapshot + replay."""
    target, _ = tiny
    plain, _ = collect(target, NoDraft(), FixedWidth(0), (), "abcabcab", n=2, max_tokens=40)
    drafter = ModelDrafter(hybrid.model)
    spec, eng = collect(target, drafter, FixedWidth(3), (), "abcabcab", n=2, max_tokens=40)
    assert spec == plain
    assert 0 < eng.stats.accepted < eng.stats.drafted  # (rejections: rolled back, the same tokens)
    sp = SamplingParams(temp=1.0)
    ids = list(target.tokenizer.encode("abcabcab"))
    p1, p2 = target_marginals(target, ids, sp)
    outs, _ = collect(target, ModelDrafter(hybrid.model), FixedWidth(3), (), "abcabcab", n=1500, max_tokens=3,
                      sampling=sp)
    arr = np.array([o[:2] for o in outs])
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) == (True, True)


def test_tokens_after_an_eos_inside_a_block_are_not_counted(tiny):
    """Bug 4a: generated_tokens counted the tokens committed after an EOS inside the last block."""
    target, draft = tiny
    outs, eng = collect(target, ModelDrafter(draft.model), FixedWidth(4), (), "the sea is ", max_tokens=60)
    trace = eng.runs[0].tpc_trace
    ends = np.cumsum(trace)  # where each cycle's committed block ends
    inner = next(i for i in range(len(outs[0]) - 1) if i + 1 not in ends and outs[0][i] not in outs[0][:i])
    stop = outs[0][inner]  # a token first seen strictly inside a block: call it EOS
    outs2, eng2 = collect(target, ModelDrafter(draft.model), FixedWidth(4), (stop,), "the sea is ", max_tokens=60)
    assert outs2[0] == outs[0][:inner]
    s = eng2.stats
    assert s.generated_tokens == inner + 1  # the tokens before EOS, and EOS itself; nothing after it
    assert s.accepted <= s.generated_tokens and s.tpc_trace[-1] == inner + 1 - sum(s.tpc_trace[:-1])


def test_batch_totals_sum_prompt_tokens_and_a_failing_batch_on_a_recurrent_target_exits_1(cli, tiny_paths, tmp_path):
    """Bug 4b: merged statistics took the max of prompt_tokens where a batch needs the sum; when every prompt
    failed on a recurrent target, the exit status was 3 (a model error), not 1."""
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("abc", "hello world", "x")))
    r = cli("generate", "-m", tiny_paths["target"], "--prompts-jsonl", src, "--format", "json", "--max-tokens", "4",
            "--no-chat", "-q")
    doc = json.loads(r.stdout)
    assert doc["stats"]["prompt_tokens"] == 3 + 11 + 1
    one = cli("generate", "-m", tiny_paths["target"], "-p", "abc", "-n", "3", "--format", "json", "--max-tokens", "4",
              "--no-chat", "-q")
    assert json.loads(one.stdout)["stats"]["prompt_tokens"] == 3  # -n: one prompt, prefilled once
    from tiny import make_hybrid_model

    hyb = make_hybrid_model(tmp_path / "h")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": " "}) + "\n{broken\n")
    r = cli("generate", "-m", hyb, "--prompts-jsonl", bad, "--format", "jsonl", "--no-chat", "-q")
    assert r.returncode == 1, r.stderr.decode()
    assert [("error" in json.loads(x)) for x in r.stdout.decode().splitlines()] == [True, True]


@pytest.mark.slow
def test_sliding_window_speculation_is_exact_at_t1(windowed, tiny):
    """The masked (not rotated) window at T = 1, past the window, in a ragged batch: the first and second tokens
    fit the target's own distribution (the model run whole, mlx-lm's window mask); a wrong temperature does not."""
    sp = SamplingParams(temp=1.0)
    prompt = "the sea is the sea is the sea"  # 29 tokens: the window of 16 binds from the first token
    ids = list(windowed.tokenizer.encode(prompt))
    p1, p2 = target_marginals(windowed, ids, sp)
    outs, eng = collect(windowed, ModelDrafter(tiny[1].model), FixedWidth(3), (), prompt, n=N, max_tokens=3,
                        sampling=sp, batch_size=250)
    arr = np.array([o[:2] for o in outs])
    c1, c2 = np.bincount(arr[:, 0], minlength=len(p1)), np.bincount(arr[:, 1], minlength=len(p1))
    assert 0 < eng.stats.accepted < eng.stats.drafted
    assert fits(c1, p1) and fits(c2, p2)
    q1, _ = target_marginals(windowed, ids, SamplingParams(temp=0.6))
    assert not fits(c1, q1)  # negative control: the test tells distributions apart
