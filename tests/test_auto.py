"""draft = auto: the policy alone (pure), then the engine with two sources on tiny models (greedy identity,
chi-square exactness at T = 1 and T = 0.7 with top-k/top-p, a negative control), statistics per source."""

import time

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import engine as engine_mod
from mtpcli import sampling, verify
from mtpcli.drafters import Draft
from mtpcli.drafters.auto import AutoDrafter
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.policy import DECAY, VISITS_CAP, AutoPolicy, CostFit, Costs, fit_shift, prior_costs, shifted
from mtpcli.sampling import SamplingParams
from stattools import fits
from test_engine import N, PROMPTS, target_marginals

# ---- the policy, without a model ------------------------------------------------------------------------------


def policy(costs=None, avail=None, batch=1, n_max=6):
    costs = costs or Costs(1.0, {"ngram": 0.05, "model": 0.3})
    return AutoPolicy(["ngram", "model"], n_max, costs, avail or (lambda s, c, k: None), batch=batch)


def test_a_plain_step_when_no_source_pays():
    p = policy(avail=lambda s, c, k: [0] * len(c) if s == "ngram" else None)  # no n-gram match
    for _ in range(20):
        p.update([2], [0], source="model")  # the draft model is always rejected
    assert p.plan([[1, 2, 3]]) == (None, 0)


def test_ngram_is_chosen_up_to_its_match_and_never_without_one():
    match = {"n": 3}
    p = policy(avail=lambda s, c, k: [min(k, match["n"])] if s == "ngram" else None)
    for _ in range(30):
        p.update([3], [3], source="ngram")  # every n-gram draft accepted
        p.update([2], [0], source="model")
    assert p.plan([[0]]) == ("ngram", 3)  # wider than its match would verify nothing more
    match["n"] = 0
    assert p.plan([[0]])[0] != "ngram"


def test_a_source_that_estimates_its_tokens_is_expected_what_it_says_not_its_kept_acceptance():
    # the kept table says every drafted token was accepted; the source's own estimates say otherwise
    kept = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"ngram": [1.0] * 6}, visits={"ngram": [200.0] * 6})
    est = {"v": [0.02, 0.02, 0.02]}
    p = AutoPolicy(["ngram", "model"], 6, kept, lambda s, c, k: [est["v"][:k]] if s == "ngram" else [0], warm=True)
    assert p.plan([[0]]) == (None, 0)  # three tokens at 2% each are not worth verifying
    assert p.expected("ngram", 3, estimates=est["v"]) < 1.1 < p.expected("ngram", 3)
    est["v"] = [0.99] * 6
    assert p.plan([[0]]) == ("ngram", 6)
    # and the other way: a poor kept acceptance does not hold back a source sure of its tokens
    poor = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"ngram": [0.05] * 6}, visits={"ngram": [200.0] * 6})
    q = AutoPolicy(["ngram", "model"], 6, poor, lambda s, c, k: [[0.99] * k] if s == "ngram" else [0], warm=True)
    assert q.plan([[0]]) == ("ngram", 6) and q.expected("ngram", 6) < 1.1


def test_the_shift_is_the_log_odds_move_that_explains_the_outcomes():
    assert fit_shift([], prior=0.4) == 0.4  # nothing seen: the kept shift
    assert shifted(0.5, 0.0) == 0.5 and shifted(0.5, np.log(3)) == pytest.approx(0.75)
    z = float(np.log(0.3 / 0.7))
    up = fit_shift([(z, 1.0, 1.0)] * 40, sd=100.0)  # estimated 0.3, always passed: far up
    assert shifted(0.3, up) > 0.95
    half = fit_shift([(z, 1.0, 1.0), (z, 0.0, 1.0)] * 50, sd=100.0)  # passed half the time: 0.3 -> 0.5
    assert shifted(0.3, half) == pytest.approx(0.5, abs=1e-3)
    few = fit_shift([(z, 1.0, 1.0)] * 3)  # a few tokens move it a little, towards the prior
    assert 0 < few < up and fit_shift([(z, 1.0, 0.1)] * 3) < few  # faded tokens weigh less


def test_a_rows_estimates_are_calibrated_by_how_its_drafts_fared():
    costs = Costs(1.0, {"ngram": 0.4, "model": 5.0})
    p = AutoPolicy(["ngram", "model"], 4, costs, lambda s, c, k: [[0.3] * k] * len(c) if s == "ngram" else None,
                   batch=2, warm=True)
    assert p.plan([[0], [0]]) == (None, 0)  # at 30% a token is not worth its verification (40% of a step)
    for _ in range(6):  # row 0 passes everything its lookup drafts, row 1 nothing
        p.update([4, 4], [4, 0], source="ngram", chances=[[0.3] * 4, [0.3] * 4], seconds=1.4)
    assert p.shift("ngram", 0) > 1.0 > -0.1 > p.shift("ngram", 1)
    assert p.expected("ngram", 4, 0, estimates=[0.3] * 4) > 2.0 > 1.3 > p.expected("ngram", 4, 1, estimates=[0.3] * 4)
    assert p.plan([[0], [0]])[0] == "ngram"
    assert p.floor("ngram")[2] == [p.shift("ngram", 0), p.shift("ngram", 1)]
    p.keep([1])  # row 0 left: its evidence goes with it
    assert p.shift("ngram", 0) < -0.1 and p.plan([[0]]) == (None, 0)
    kept = p.measured()  # the run's shift, over every row's tokens (24 passed, 6 rejected), is kept for the next run
    assert kept.shift["ngram"][1] == 30 and shifted(0.3, kept.shift["ngram"][0]) == pytest.approx(0.8, abs=0.02)


def test_a_kept_shift_stays_put_near_and_moves_far():
    kept = Costs(1.0, {"model": 0.3}, shift={"ngram": [1.0, 200.0]})
    again = Costs.from_dict(kept.to_dict())
    assert again.shift == {"ngram": [1.0, 200.0]}
    assert kept.settled(Costs(1.0, {"model": 0.3}, shift={"ngram": [1.3, 40.0]})) is kept
    moved = kept.settled(Costs(1.0, {"model": 0.3}, shift={"ngram": [-1.0, 100.0]}))
    assert moved.shift["ngram"] == pytest.approx([(200 - 100) / 300, 200.0])
    with pytest.raises(ValueError):
        Costs.from_dict({"plain": 1.0, "per_token": {}, "shift": {"ngram": [float("nan"), 1]}})


def test_a_source_never_drafts_wider_than_its_own_widest():
    always = Costs(1.0, {"ngram": 0.01, "model": 0.01}, accept={"ngram": [1.0] * 16, "model": [1.0] * 16},
                   visits={"ngram": [200.0] * 16, "model": [200.0] * 16})
    p = AutoPolicy(["ngram", "model"], 16, always, warm=True, widest={"ngram": 8, "model": 4})
    assert {k for (s, k) in p.scores([[0]]) if s == "ngram"} == set(range(1, 9))
    assert max(k for (s, k) in p.scores([[0]]) if s == "model") == 4
    assert p.plan([[0]]) == ("ngram", 8)


def test_the_floor_is_what_a_token_must_bring_to_match_plain_steps():
    keep, go_on, _ = policy(Costs(0.5, {"ngram": 0.05, "model": 0.3})).floor("model")
    assert keep == pytest.approx(0.1)  # its verification: 0.05 s of plain steps at 0.5 s each
    assert go_on == pytest.approx(0.6)  # a draft step and its verification: 0.3 s
    assert policy(Costs(0.5, {"ngram": 0.05, "model": 0.9})).floor("model")[1] == 0.95  # never drafts for nothing
    # once a plan expects more than plain steps give, a token must match that rate (the best plan's, with no
    # exploration bonus): n-gram lookup sure of 6 tokens makes 7 tokens in 0.8 s
    p = AutoPolicy(["ngram", "model"], 6, Costs(0.5, {"ngram": 0.05, "model": 0.3}),
                   lambda s, c, k: [[0.999999] * k] if s == "ngram" else None, warm=True)
    assert p.plan([[0]]) == ("ngram", 6)
    keep, go_on, _ = p.floor("model")
    assert keep == pytest.approx(0.05 * 7 / 0.8, rel=1e-3) and go_on == 0.95


def _confident(confs):
    """A draft step whose row b's most likely token (token j at step j) has probability confs[b][j], the rest
    spread evenly over the other 7 tokens."""
    calls = []

    def step(t):
        j = len(calls)
        calls.append(j)
        logits = np.zeros((len(confs), 8), np.float32)
        for b, c in enumerate(confs):
            logits[b] = np.log((1 - c[j]) / 7)
            logits[b, j] = np.log(c[j])
        return mx.array(logits)
    step.calls = calls
    return step


def test_autoregress_stops_once_the_chance_that_the_whole_draft_passes_is_not_worth_a_step():
    from mtpcli.drafters import autoregress, passes

    greedy = SamplingParams()
    # each position alone is above 0.5 (0.82); their product falls below it at the 4th: that token is kept (its
    # step was paid for), no 5th step is taken; with keep = 0.5 too, the 4th token is dropped as well
    assert passes(0.8, True) > 0.5 > passes(0.8, True) ** 4 and passes(0.8, True) ** 3 > 0.5
    step = _confident([[0.8] * 6])
    assert autoregress(step, [6], greedy, [None], go_on=0.5).lengths == [4]
    assert len(step.calls) == 4  # no step run to be thrown away
    assert autoregress(_confident([[0.8] * 6]), [6], greedy, [None], keep=0.5, go_on=0.5).lengths == [3]
    assert autoregress(_confident([[0.8] * 6]), [6], greedy, [None]).lengths == [6]  # no floor: as asked
    # a batch drafts on together while its rows' chances, on average, stay above the floor
    d = autoregress(_confident([[0.99, 0.99, 0.3, 0.99], [0.99] * 4]), [4, 4], greedy, [None] * 2, go_on=0.5)
    assert d.lengths == [4, 4] and d.requested == [4, 4] and d.tokens[1].tolist() == [0, 1, 2, 3]
    unsure = [[0.99, 0.3, 0.9, 0.9], [0.99, 0.4, 0.9, 0.9]]  # both at the second position: (0.37 + 0.46) / 2
    assert autoregress(_confident(unsure), [4, 4], greedy, [None] * 2, go_on=0.5).lengths == [2, 2]
    assert autoregress(_confident(unsure), [4, 4], greedy, [None] * 2, keep=0.45, go_on=0.5).lengths == [1, 1]
    d = autoregress(_confident([[0.99] * 4] * 2), [2, 4], greedy, [None] * 2, go_on=0.5)
    assert d.lengths == [2, 3]  # a row's own cap ends it; then the other's chance is worth half a plain step
    # at T > 0 the chance comes from sum min(p, q)'s fit: 0.575 for a draft half sure, then 0.33
    hot, keys = SamplingParams(temp=1.0), [mx.random.key(0)]
    assert passes(0.5, False) > 0.5 > passes(0.5, False) ** 2
    assert autoregress(_confident([[0.5] * 4]), [4], hot, keys, go_on=0.5).lengths == [2]
    assert autoregress(_confident([[0.5] * 4]), [4], hot, keys, keep=0.4, go_on=0.5).lengths == [1]
    # a row whose drafts passed more often than their confidence said (its shift) drafts on; the chances the
    # draft reports are the unshifted ones (the points of the next fit)
    d = autoregress(_confident([[0.5] * 4]), [4], hot, keys, go_on=0.5, shift=[2.0])
    assert d.lengths == [4] and d.chances == [[pytest.approx(passes(0.5, False))] * 4]
    assert autoregress(_confident([[0.8] * 6]), [6], greedy, [None], go_on=0.5, shift=[-2.0]).lengths == [1]


def test_a_draft_cut_short_after_all_passed_counts_as_rejected_where_it_stopped():
    p = policy()
    p.update([2], [2], source="model", requested=[4])  # cut at 2 by the floor, both passed: 3 tokens committed
    acc, reached = p.counts[0]["model"]
    assert reached[:4] == [1, 1, 1, 0] and acc[:3] == [1, 1, 0]
    q = policy()
    q.update([2], [2], source="model", requested=[2])  # as asked, all passed: censored past it
    assert q.counts[0]["model"][1][:3] == [1, 1, 0]
    r = policy()
    r.update([2], [1], source="model", requested=[4])  # rejected at 1: nothing counted past it
    assert r.counts[0]["model"][1][:3] == [1, 1, 0] and r.counts[0]["model"][0][:2] == [1, 0]


def test_a_full_accept_is_censored_per_position():
    p = policy()
    before = p.acceptance("model")
    p.update([2], [2], source="model")  # accepted both: positions 0 and 1 seen accepted, 2.. not tested
    after = p.acceptance("model")
    assert after[0] > before[0] and after[1] > before[1]
    # positions 2.. were not tested: not counted, and not lowered (a censored draft is no rejection there); they
    # rise with the row's shift of the kept acceptance, not past the positions seen passing
    assert p.counts[0]["model"][1][2:] == [0] * (len(after) - 2)
    assert all(b < a <= after[1] for a, b in zip(after[2:], before[2:]))
    p.update([4], [1], source="model")  # rejected at position 1: positions 2 and 3 were not tested
    acc, reached = p.counts[0]["model"]
    assert reached[2] == pytest.approx(0.0) and reached[1] == pytest.approx(1 + DECAY)


def test_a_source_not_tried_drifts_back_to_its_prior_and_is_tried_again():
    p = policy(Costs(1.0, {"ngram": 0.05, "model": 0.25}), avail=lambda s, c, k: [0] * len(c) if s == "ngram" else None)
    for _ in range(40):
        p.update([3], [0], source="model")
    chosen = []
    for cycle in range(400):
        s, k = p.plan([[0]])
        chosen.append(s)
        p.update([k], [0], source=s)  # plain steps (k = 0) and failed probes
    probes = [i for i, s in enumerate(chosen) if s == "model"]
    assert probes and probes[0] > 20  # not at once: the evidence is strong
    assert len(probes) <= 50  # and not often: a probe that fails pushes the next one back


def test_a_batch_gets_one_choice_and_rows_keep_their_own_estimates():
    p = policy(batch=2)
    for _ in range(10):
        p.update([3, 3], [3, 0], source="model")
    assert p.expected("model", 3, 0) > 3.0 > 1.5 > p.expected("model", 3, 1)
    s, k = p.plan([[0], [0]])
    assert isinstance(k, int)  # one (source, width) for both rows
    p.keep([1])  # row 0 left the batch: the remaining row's estimates go with it
    assert p.batch == 1 and p.expected("model", 3, 0) < 1.5


def test_cost_fit_recovers_the_costs_per_source():
    fit = CostFit(prior_costs(["ngram", "model"], {"model": 0.5}, gpu=False))
    rng = np.random.default_rng(0)
    truth = Costs(0.2, {"ngram": 0.01, "model": 0.07})
    for i in range(200):
        s, k = [(None, 0), ("ngram", int(rng.integers(1, 8))), ("model", int(rng.integers(1, 6)))][i % 3]
        fit.add(s, k, truth.time(s, k) * (1 + 0.02 * rng.standard_normal()))
    got = fit.result()
    assert got.plain == pytest.approx(0.2, rel=0.05)
    assert got.per_token["ngram"] == pytest.approx(0.01, abs=0.003)
    assert got.per_token["model"] == pytest.approx(0.07, rel=0.05)


def test_each_source_is_charged_its_own_fixed_part_of_a_cycle():
    fit = CostFit(prior_costs(["ngram", "model"], {"model": 0.5}, gpu=False))
    rng = np.random.default_rng(1)
    truth = Costs(0.5, {"ngram": 0.02, "model": 0.2}, fixed={"model": 0.4})  # a draft model's catch-up: 0.4 s
    for i in range(240):
        s, k = [(None, 0), ("ngram", int(rng.integers(1, 8))), ("model", int(rng.integers(1, 8)))][i % 3]
        fit.add(s, k, truth.time(s, k) * (1 + 0.02 * rng.standard_normal()))
    got = fit.result()
    assert got.plain == pytest.approx(0.5, rel=0.05) and got.fixed["model"] == pytest.approx(0.4, rel=0.1)
    assert got.fixed["ngram"] == pytest.approx(0.0, abs=0.03) and got.per_token["model"] == pytest.approx(0.2, rel=0.1)
    assert got.time("ngram", 4) == pytest.approx(0.58, rel=0.05)  # not charged the draft model's catch-up
    # kept in the run log, validated on load, merged like the other costs
    assert Costs.from_dict(got.to_dict()).fixed == got.fixed
    with pytest.raises(ValueError):
        Costs.from_dict({**got.to_dict(), "fixed": {"model": -1.0}})
    old = Costs(0.5, {"ngram": 0.02, "model": 0.2})  # kept before there was a fixed part: it learns it
    assert old.settled(got) is not old and old.settled(got).fixed["model"] == pytest.approx(got.fixed["model"])
    assert got.settled(Costs(0.5, {"model": 0.2}, fixed={"model": got.fixed["model"] * 1.05})) is got


def test_a_row_whose_drafts_fail_early_expects_less_where_they_never_reached():
    no_match = lambda s, c, k: [0] * len(c) if s == "ngram" else None  # noqa: E731
    kept = Costs(1.0, {"ngram": 0.05, "model": 0.3}, {"model": [0.9] * 6}, {"model": [200.0] * 6}, step=0.8,
                 fixed={"model": 0.3})
    poor, good = policy(kept, no_match), policy(kept, no_match)
    assert poor.plan([[0]])[0] == "model" and good.plan([[0]])[0] == "model"
    for _ in range(4):
        poor.update([6], [0], source="model")  # rejected at the first token, four times
        good.update([6], [6], source="model")
    low, high = poor.acceptance("model"), good.acceptance("model")
    assert all(a < 0.7 for a in low[1:]) and all(a > 0.9 for a in high)  # deeper positions too, though never tested
    assert poor.plan([[0]]) == (None, 0) and good.plan([[0]])[0] == "model"


def test_a_row_the_target_is_less_sure_of_expects_less_of_the_model_before_drafting():
    no_match = lambda s, c, k: [0] * len(c) if s == "ngram" else None  # noqa: E731
    kept = Costs(1.0, {"ngram": 0.05, "model": 0.5}, {"model": [0.8] * 6}, {"model": [200.0] * 6}, step=1.0,
                 fixed={"model": 0.5}, conf={"model": [0.9, 200.0]})  # a model cycle pays from 0.8 up
    p = policy(kept, no_match, batch=3)
    p.observe([[0.5] * 12, [0.99] * 12, [0.9] * 12])  # prose-like, copy-like, like the kept table
    low, high, same = (p.acceptance("model", b) for b in range(3))
    assert all(x < 0.6 for x in low) and all(x > 0.9 for x in high) and same == pytest.approx([0.8] * 6, abs=0.01)
    plain = policy(kept, no_match)
    plain.observe([[0.5] * 12])
    assert plain.plan([[0]]) == (None, 0)  # no model cycle paid to learn it
    confident = policy(kept, no_match)
    confident.observe([[0.99] * 12])
    assert confident.plan([[0]])[0] == "model"
    old = Costs(1.0, {"ngram": 0.05, "model": 0.3}, {"model": [0.8] * 6}, {"model": [200.0] * 6}, step=1.0)
    unknown = policy(old, no_match)  # a table kept without a confidence: the row's says nothing
    unknown.observe([[0.5] * 12])
    assert unknown.acceptance("model") == pytest.approx([0.8] * 6, abs=0.01)


def test_drafts_that_failed_where_the_target_was_unsure_do_not_hold_the_model_back_where_it_is_sure():
    no_match = lambda s, c, k: [0] * len(c) if s == "ngram" else None  # noqa: E731
    kept = Costs(1.0, {"ngram": 0.05, "model": 0.3}, {"model": [0.8] * 6}, {"model": [200.0] * 6}, step=1.0,
                 conf={"model": [0.9, 200.0]})
    unsure, sure = policy(kept, no_match), policy(kept, no_match)
    unsure.observe([[0.5] * 12])
    sure.observe([[0.9] * 12])
    for _ in range(3):  # rejected at the first token, three times
        for p in (unsure, sure):
            p.update([4], [0], source="model")
            p.observe([[p.conf[0][0] / p.conf[0][1]]])  # (its confidence stays where it was)
    for p in (unsure, sure):
        p.observe([[0.9] * 40])  # then text the target is as sure of as the kept table
    assert unsure.row_shift("model") > sure.row_shift("model") + 0.3  # the failures were expected there
    assert unsure.acceptance("model")[1] > sure.acceptance("model")[1]


def test_the_confidence_is_kept_merged_and_validated():
    p = AutoPolicy(["ngram", "model"], 6, Costs(1.0, {"ngram": 0.05, "model": 0.3}, step=1.0), stops=["model"])
    for _ in range(8):
        p.observe([[0.6, 0.8]])
        p.update([3], [1], seconds=1.6, source="model")
        p.update([2], [2], seconds=1.1, source="ngram")
        p.update([0], [0], seconds=1.0)
    got = p.measured()
    assert got.conf["model"][0] == pytest.approx(0.7, abs=0.02) and got.conf["model"][1] >= 4
    assert "ngram" in got.accept and "ngram" not in got.conf  # (lookup is expected what it estimates: never read)
    back = Costs.from_dict(got.to_dict())
    assert back.conf == got.conf
    sure = AutoPolicy(["model"], 6, Costs(1.0, {"model": 0.3}, step=1.0), stops=["model"])
    for _ in range(8):  # a text the target is certain of (float32 gives exactly 1.0)
        sure.observe([[1.0, 1.0]])
        sure.update([3], [3], seconds=1.6, source="model")
    assert Costs.from_dict(sure.measured().to_dict()).conf["model"][0] < 1.0  # kept, and loads again
    older = Costs(1.0, {"model": 0.3}, {"model": [0.5]}, {"model": [100.0]})  # kept before confidences were
    gained = older.settled(Costs(1.0, {"model": 0.3}, {"model": [0.5]}, {"model": [4.0]}, conf={"model": [0.8, 9.0]}))
    assert gained.conf == {"model": [0.8, 9.0]} and gained.accept == older.accept and gained.visits == older.visits
    capped = older.settled(Costs(1.0, {"model": 0.3}, {"model": [0.5]}, {"model": [4.0]}, conf={"model": [0.8, 1e4]}))
    assert capped.conf["model"][1] == VISITS_CAP


def test_a_cycle_is_learnt_at_the_confidence_it_was_planned_with():
    kept = Costs(1.0, {"ngram": 0.05, "model": 0.3}, {"model": [0.8] * 6}, {"model": [200.0] * 6}, step=1.0,
                 conf={"model": [0.9, 200.0]})
    p = AutoPolicy(["ngram", "model"], 6, kept, stops=["model"])
    p.observe([[0.5] * 12])
    low = p.offset("model")
    p.update([4], [0], source="model")  # planned and judged while the target was unsure
    p.observe([[0.99] * 12])  # the tokens it committed (and later ones) are sure
    assert low < -1.0 and p.offs[0]["model"][0] == pytest.approx(low) and p.offset("model") > low + 1.0
    assert p.seen_conf["model"] == [pytest.approx(p.seen_conf["model"][0]), 1.0]  # one cycle, one measurement
    kept = Costs(1.0, {"model": 0.3}, {"model": [0.5]}, {"model": [100.0]}, conf={"model": [0.9, 100.0]})
    run = lambda c, n: Costs(1.0, {"model": 0.3}, {"model": [0.5]}, {"model": [4.0]}, conf={"model": [c, n]})  # noqa
    assert kept.settled(run(0.8, 4.0)) is kept  # within two standard errors of 4 cycles: kept as it is
    moved = kept.settled(run(0.8, 400.0))  # not of 400
    assert moved.conf["model"] == pytest.approx([(0.9 * 100 + 0.8 * 400) / 500, 200.0])
    other = kept.settled(Costs(1.0, {"model": 0.3}, {"model": [0.1]}, {"model": [50.0]}))  # none measured: kept
    assert other is not kept and other.conf == kept.conf
    with pytest.raises(ValueError):
        Costs.from_dict({**kept.to_dict(), "conf": {"model": [1.5, 3.0]}})


def test_a_lookup_not_chosen_is_calibrated_on_the_draft_it_would_have_made():
    from mtpcli.drafters import Lookahead

    def run(follows: bool):
        text = [7, 8, 9] * 20  # what lookup proposes at every point: the text as it goes on
        look = lambda s, c, k: [Lookahead([0.3] * 3, text[len(c):][:3])] if s == "ngram" else [0]  # noqa: E731
        p = AutoPolicy(["ngram", "model"], 3, Costs(1.0, {"ngram": 0.05, "model": 0.3}, step=0.5), look, warm=True)
        context, chosen = [], []
        for _ in range(12):
            s, k = p.plan([context])
            chosen.append(s)
            p.update([k], [k if follows else 0], source=s)  # (when lookup drafts, its tokens pass or fail)
            n = 1 + (k if follows else 0)
            context = context + (text[len(context):][:n] if follows else [4] * n)  # what the target committed
        return p, chosen

    good, chosen = run(True)
    assert chosen[0] is None and "ngram" in chosen  # a weak guess at first; its drafts come true: drafted
    assert good.shift("ngram") > 1.0 and len(good.seen_points["ngram"]) >= 3
    bad, chosen = run(False)
    assert set(chosen) == {None} and bad.shift("ngram") < 0  # never drafted, and it would not have passed


def test_a_shadow_draft_is_learnt_as_far_as_committed_when_its_source_drafts_and_follows_rows():
    from mtpcli.drafters import Lookahead

    look = lambda s, c, k: [Lookahead([0.2] * 4, [1, 1, 1, 1]) for _ in c] if s == "ngram" else [0] * len(c)  # noqa
    p = AutoPolicy(["ngram", "model"], 4, Costs(1.0, {"ngram": 0.05, "model": 0.3}, step=0.5), look, warm=True,
                   batch=2)
    assert p.plan([[0], [0]]) == (None, 0)  # a weak guess: plain; both rows' lookups wait to be decided
    p.update([0, 0], [0, 0], source=None)
    p.shadow[1] = {}  # row 1: nothing pending
    p.scores = lambda contexts: {("ngram", 4): 9.0, (None, 0): 1.0}  # the next plan drafts with lookup
    p.plan([[0, 1], [0, 5]])
    assert [y for _, y, _ in p.points[0]["ngram"]] == [1.0]  # the committed token it matched: a pass, not dropped
    assert p.points[1]["ngram"] == [] and p.shadow[0] == {}
    del p.scores
    p.plan([[0, 1, 2], [0, 5, 6]])
    p.shadow[0]["ngram"] = (9, [7], [0.5])
    p.keep([0])  # row 1 leaves the batch: the pending drafts follow their rows
    assert p.shadow == [{"ngram": (9, [7], [0.5])}]
    row = [0, 1, 2]
    p.plan([row])
    p.shadow[0] = {"ngram": (3, [7, 8], [0.5, 0.5])}
    row += [7]  # the row commits one matching token, then ends (max_tokens): a new prompt starts in its place
    before = len(p.seen_points["ngram"])
    p.reset(0)
    assert p.seen_points["ngram"][before:] == [(0.0, 1.0)] and p.shadow == [{}]  # learnt as far as it committed
    p.shadow[0]["ngram"] = (9, [7], [0.5])
    p.watching = False  # typical acceptance: a plain step's token is no test of a draft's
    p.plan([[0, 1, 2, 3, 4, 5, 6, 7, 8, 6]])
    assert p.points[0]["ngram"] == [] and p.shadow == [{"ngram": (9, [7], [0.5])}]


def test_a_row_that_leaves_the_batch_learns_its_pending_drafts_first(tiny, monkeypatch):
    target, _ = tiny
    prompts = [list(target.tokenizer.encode(p)) for p in ("abcabcabcabc", "the sea is ")]
    eng = auto_engine(tiny, NONE_PAYS, batch_size=2)  # plain steps: a lookup with a match waits to be decided
    pol, events, reset, keep = eng.policy, [], eng.policy.reset, eng.policy.keep

    def spy_reset(member=None):
        pending, learnt = member is not None and bool(pol.shadow[member]), len(pol.seen_points["ngram"])
        reset(member)
        events.append(("reset", member, pending, len(pol.seen_points["ngram"]) - learnt))

    pol.reset = spy_reset
    pol.keep = lambda live: events.append(("keep", list(live))) or keep(live)
    list(eng.generate([Request(0, prompts[0], 12, 0), Request(1, prompts[1], 30, 0)]))
    keeps = [i for i, e in enumerate(events) if e[0] == "keep"]
    assert [events[i] for i in keeps] == [("keep", [1]), ("keep", [])]  # row 0 leaves, then row 1 (member 0 by then)
    _, member, pending, learnt = events[keeps[0] - 1]
    assert member == 0 and pending and learnt > 0  # its pending lookup draft was learnt before it left
    assert events[keeps[1] - 1][:2] == ("reset", 0)  # the last row too
    events.clear()
    run(eng, prompts[0])  # one prompt (its plain steps chained): its last pending draft is learnt as it ends
    assert events[-2][:3] == ("reset", 0, True) and events[-2][3] > 0 and events[-1] == ("keep", [])


def test_kept_acceptance_stays_put_under_sampling_noise_and_moves_on_real_change():
    kept = Costs(1.0, {"model": 0.3}, {"model": [0.7, 0.7, 0.7]}, {"model": [200.0, 150.0, 100.0]})
    noisy = Costs(1.0, {"model": 0.3}, {"model": [0.8, 0.55, 0.9]}, {"model": [20.0, 12.0, 5.0]})
    assert kept.settled(noisy) is kept  # within two standard errors of runs this short
    moved = kept.settled(Costs(1.0, {"model": 0.3}, {"model": [0.2]}, {"model": [100.0]}))
    assert moved.accept["model"][0] == pytest.approx((0.7 * 200 + 0.2 * 100) / 300)
    assert moved.visits["model"][0] == 200.0  # capped: the table keeps moving with later runs


def test_a_long_run_keeps_its_plain_steps_and_leaves_catch_up_cycles_out():
    fit = CostFit(prior_costs(["model"], {"model": 0.5}, gpu=False))
    fit.add(None, 0, 9.0)  # the first cycle: compilation, left out
    for _ in range(3):
        fit.add(None, 0, 1.0)
    for i in range(600):  # far past the window: the plain steps are still there
        fit.add("model", 4, (1.0 + 4 * 0.3) * (8 if i % 50 == 0 else 1))  # now and then a long catch-up
    got = fit.result()
    # (one width only: how a cycle's cost splits between its fixed part and its tokens is the priors', its sum is
    # measured)
    assert got.plain == pytest.approx(1.0, rel=0.05) and got.time("model", 4) == pytest.approx(2.2, rel=0.05)


def test_a_plain_step_is_charged_its_own_measured_time_not_the_drafting_intercept():
    # the draft model's first token passes half the time: 1.5 tokens for 1.3 s beats a plain step at the
    # intercept's 1.0 s, not a plain step that costs 0.8 s of its own
    est = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"model": [0.5] * 6}, visits={"model": [1e4] * 6})
    avail = lambda s, c, k: [0] * len(c) if s == "ngram" else None  # noqa: E731
    def seen(p):
        for i in range(60):  # half its first tokens passed, often enough that little exploration bonus is left
            p.update([1], [i % 2], source="model")
        # 1.5 tokens for 1.3 s: more than 1 / 1.0 s, less than 1 / 0.8 s
        assert p.expected("model", 1, explore=True) == pytest.approx(1.5, abs=0.02)
        return p

    assert seen(AutoPolicy(["ngram", "model"], 1, est, avail, warm=True)).plan([[0]]) == ("model", 1)
    est.step = 0.8
    p = seen(AutoPolicy(["ngram", "model"], 1, est, avail, warm=True))
    assert p.plan([[0]]) == (None, 0) and p.costs.time(None, 0) == 0.8 and p.costs.time("model", 1) == 1.3
    fresh = AutoPolicy(["ngram", "model"], 1, est, avail, warm=True)  # nothing planned yet: no best rate known
    assert fresh.floor("model")[1] == pytest.approx(0.3 / 0.8)  # a draft step must beat the plain steps' own rate
    # measured: the median of the chained plain steps; the line (its intercept 1.0) fitted to the drafting cycles and
    # the plain steps launched on their own, which the chained ones (0.8) do not drag down
    fit = CostFit(prior_costs(["model"], {"model": 0.5}, gpu=False))
    fit.add(None, 0, 9.0)  # the first cycle: compilation, left out
    for i in range(60):  # runs of three plain steps, the first launched after a draft was read, then two chained
        fit.add(*((None, 0, 1.0, False) if i % 6 == 0 else (None, 0, 0.8, True) if i % 6 < 3 else
                  ("model", 1 + i % 4, 1.0 + 0.3 * (1 + i % 4), False)))
    got = fit.result()
    assert got.step == pytest.approx(0.8) and got.plain == pytest.approx(1.0, rel=0.02)
    assert got.per_token["model"] == pytest.approx(0.3, rel=0.05)
    lone = CostFit(prior_costs(["model"], {"model": 0.5}, gpu=False))
    for i in range(60):  # no plain step chained: none measured a step, a plain step costs the intercept
        lone.add(*((None, 0, 1.0) if i % 3 == 0 else ("model", 1 + i % 4, 1.0 + 0.3 * (1 + i % 4))))
    assert lone.result().step is None and lone.result().time(None, 0) == lone.result().plain
    # through the policy: the engine says which plain steps were chained
    p = AutoPolicy(["ngram", "model"], 1, Costs(1.0, {"ngram": 0.05, "model": 0.3}), avail, warm=True)
    for i in range(12):
        p.update([0], [0], seconds=0.8 if i % 2 else 1.0, chained=bool(i % 2))
        p.update([2], [1], source="model", seconds=1.6)
    assert p.measured().step == pytest.approx(0.8) and p.measured().plain > 0.95
    only = CostFit(Costs(1.0, {"model": 0.3}), known=True)
    for _ in range(6):  # a run that never drafted: its plain steps chained after the first
        only.add(None, 0, 0.8, chained=True)
    got = only.result()
    assert got.step == pytest.approx(0.8) and got.plain == 1.0 and got.per_token == {}
    assert Costs(1.0, {"model": 0.3}).settled(got).step == pytest.approx(0.8)  # kept for the next run
    # kept: through the run log's dict, checked there, merged as the other costs
    assert Costs.from_dict(got.to_dict()).step == pytest.approx(0.8)
    assert Costs.from_dict(Costs(1.0, {}).to_dict()).step is None  # (a table kept before it is still read)
    with pytest.raises(ValueError):
        Costs.from_dict({**got.to_dict(), "step": -1.0})
    assert got.settled(Costs(got.plain, got.per_token, step=0.82)) is got
    assert got.settled(Costs(got.plain, got.per_token, step=1.6)).step == pytest.approx(1.2)
    assert Costs(1.0, {}).settled(Costs(1.0, {}, step=0.9)).step == 0.9  # an old table learns its step


def test_kept_costs_stay_put_within_tolerance_and_move_beyond_it():
    old = Costs(1.0, {"ngram": 0.1, "model": 0.3})
    assert old.settled(Costs(1.05, {"ngram": 0.11, "model": 0.32})) is old  # same seed, same output next run
    moved = old.settled(Costs(2.0, {"ngram": 0.1, "model": 0.3}))
    assert moved.plain == pytest.approx(1.5)
    with pytest.raises(ValueError):
        Costs.from_dict({"plain": float("nan"), "per_token": {}})


# ---- the engine with two sources on tiny models -----------------------------------------------------------------

def auto_engine(tiny, costs, sp=SamplingParams(), batch_size=1, max_tokens=48, seed=0, drafter_cls=AutoDrafter):
    target, draft = tiny
    drafter = drafter_cls({"ngram": NgramDrafter(1, 3), "model": ModelDrafter(draft.model)})
    pol = AutoPolicy(["ngram", "model"], 4, costs, drafter.lookahead, warm=True,  # no calibration steps
                     stops=["model"])  # as assemble.auto_policy: the model is asked for its widest, and its plans
    #                                    say where it stops (Plan.stop: where the draft is unsure)
    return Engine(target.model, drafter, pol, (), DecodeConfig(sampling=sp, max_tokens=max_tokens, seed=seed),
                  batch_size)


def run(eng, ids, n=1):
    outs = [[] for _ in range(n)]
    for ev in eng.generate([Request(c, ids, eng.cfg.max_tokens, eng.cfg.seed, c) for c in range(n)]):
        outs[ev.request].extend(ev.tokens)
    return outs


BOTH = Costs(1.0, {"ngram": 0.02, "model": 0.05})  # both sources pay on the tiny pair


def test_auto_greedy_is_token_identical_to_plain_decoding(tiny):
    target, _ = tiny
    used = set()
    for prompt in PROMPTS + ["abcabcabcabc"]:
        ids = list(target.tokenizer.encode(prompt))
        plain = Engine(target.model, None, None, (), DecodeConfig(max_tokens=48))
        eng = auto_engine(tiny, BOTH)
        assert run(eng, ids) == run(plain, ids)
        used |= {s for s, st in eng.stats.sources.items() if st.cycles}
    assert {"ngram", "model"} <= used  # both sources drafted


@pytest.mark.parametrize("kind", ["sliding-window", "hybrid"])
def test_auto_greedy_is_token_identical_on_windowed_and_hybrid_targets(tiny, tmp_path, kind):
    """draft = auto over n-gram lookup and the draft model, on a target whose sliding-window layers are masked
    and on one whose recurrent layers roll back by snapshot and replay: the same tokens as plain decoding."""
    from mtpcli import models
    from tiny import make_target

    target = models.load(str(make_target(kind, tmp_path)))
    _, draft = tiny
    ids = list(target.tokenizer.encode("abcabcabcabc"))
    plain = run(Engine(target.model, None, None, (), DecodeConfig(max_tokens=60)), ids)
    drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "model": ModelDrafter(draft.model)})
    eng = Engine(target.model, drafter, AutoPolicy(["ngram", "model"], 4, BOTH, drafter.lookahead, warm=True,
                                                   stops=["model"]), (),
                 DecodeConfig(max_tokens=60))
    assert run(eng, ids) == plain
    assert eng.stats.drafted > 0 and eng.stats.cycles < eng.stats.generated_tokens  # it really speculated


def test_readme_documents_auto_and_its_statistics():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for text in ("`--draft auto`", "--by profile|model|draft|source", "`sources`", "`plain_steps`", "`source_trace`",
                 "`auto`", "Which to choose", "docs/perf/auto.md"):
        assert text in readme, text


def pairs(tiny, sp, costs, prompt="abcabcabcabc", drafter_cls=AutoDrafter, floor=None):
    target, _ = tiny
    ids = list(target.tokenizer.encode(prompt))
    eng = auto_engine(tiny, costs, sp, batch_size=250, max_tokens=3, drafter_cls=drafter_cls)
    if floor is not None:  # floors of the draft model's chance higher than the policy's, so that they cut often;
        shifts = eng.shifts = []  # each row's shift as the policy fits it (from the row's earlier cycles)

        policy_floor = eng.policy.floor

        def floored(source):
            shift = policy_floor(source)[2]
            shifts.extend(shift)
            return (*floor, shift)
        eng.policy.floor = floored
    arr = np.array([o[:2] for o in run(eng, ids, N)])
    return ids, arr[:, 0], arr[:, 1], eng


TWO = Costs(1.0, {"ngram": 0.02, "model": 0.25})  # n-gram lookup drafts first, then the draft model takes over
AUTO_CASES = [
    SamplingParams(temp=1.0),
    SamplingParams(temp=0.7, top_k=20, top_p=0.9),
    SamplingParams(temp=1.0, top_p=0.8),  # top-p alone: its nucleus is looked for among 6 candidates
]


@pytest.mark.parametrize("sp", AUTO_CASES, ids=str)
def test_auto_is_distributed_as_the_target(tiny, sp, monkeypatch):
    # few candidates for the partial top-p selection, so that some nuclei lie past it and are judged again
    monkeypatch.setattr(sampling, "CANDIDATES", 6)
    redone = []
    judge = verify.judge
    monkeypatch.setattr(verify, "judge", lambda *a: redone.append(a[-1] or None) or judge(*a))
    target, _ = tiny
    ids, first, second, eng = pairs(tiny, sp, TWO, floor=(0.3, 0.45))
    p1, p2 = target_marginals(target, ids, sp)
    used = {s: st.cycles for s, st in eng.stats.sources.items()}
    assert used.get("ngram", 0) > 20 and used.get("model", 0) > 20  # both sources drafted, in one run
    assert 0.2 < eng.stats.acceptance_rate < 0.98
    assert 20 < eng.stats.floor_cut < used["model"]  # the floor cut some drafts short, not all
    assert sum(abs(d) > 0.1 for d in eng.shifts) > 20  # rows' shifts moved with their earlier cycles
    if sp.top_p < 1.0 and not sp.top_k:  # cycles were judged again with the full sort, at most once each
        assert 0 < redone.count(True) <= redone.count(None)
    assert fits(np.bincount(first, minlength=len(p1)), p1)
    assert fits(np.bincount(second, minlength=len(p1)), p2)


def test_auto_chains_its_plain_steps_for_one_row_and_stays_exact(tiny, monkeypatch):
    """One row: a plain step the policy plans from the committed tokens is launched while the previous one is in
    flight; one judged again (a nucleus past the partial selection) is undone and launched again. The first and
    second tokens stay distributed as the target's."""
    monkeypatch.setattr(sampling, "CANDIDATES", 6)
    chained, discarded = [], []
    launch, relaunch = Engine._launch, Engine._relaunch
    monkeypatch.setattr(Engine, "_launch", lambda self, plan, after=None, fresh=False: chained.append(after is not None)
                        or launch(self, plan, after, fresh))
    monkeypatch.setattr(Engine, "_relaunch", lambda self, f: discarded.append(1) or relaunch(self, f))
    sp = SamplingParams(temp=1.0, top_p=0.8)
    target, _ = tiny
    ids = list(target.tokenizer.encode("the sea is "))
    eng = auto_engine(tiny, Costs(1.0, {"ngram": 0.3, "model": 1.0}), sp, batch_size=1, max_tokens=3)
    arr = np.array([o[:2] for o in run(eng, ids, N)])
    assert eng.stats.sources["plain"].cycles == 3 * N  # no source pays at these costs: plain from the first cycle
    assert sum(chained) == 2 * N and len(discarded) > 50  # the 2nd and 3rd tokens' steps chained; some were redone
    p1, p2 = target_marginals(target, ids, sp)
    assert fits(np.bincount(arr[:, 0], minlength=len(p1)), p1)
    assert fits(np.bincount(arr[:, 1], minlength=len(p1)), p2)


def test_a_launch_that_computes_is_charged_to_the_cycle_it_launched(tiny, monkeypatch):
    """Where a launch itself computes (MLX on a CPU), the time between two reads of chained plain steps holds the
    next step's pass: each step is charged its own launch, so a run of equal steps measures them all equal, the
    first and the last of a chain included, and the seconds add up to the time spent."""
    real = mx.async_eval

    def computing(*arrays):  # as the CPU backend does: the pass is done before the launch returns
        real(*arrays)
        mx.eval(*arrays)
        time.sleep(0.05)

    monkeypatch.setattr(engine_mod.mx, "async_eval", computing)
    eng = auto_engine(tiny, Costs(1.0, {"ngram": 0.3, "model": 1.0}), max_tokens=8)  # plain steps only
    seen = []
    update = eng.policy.update
    eng.policy.update = lambda *a, **k: seen.append((k["seconds"], k["chained"])) or update(*a, **k)
    t0 = time.perf_counter()
    run(eng, list(tiny[0].tokenizer.encode("the sea is ")))
    assert len(seen) == 8 and not seen[0][1] and all(c for _, c in seen[1:-1])  # a chain of plain steps
    secs = [t for t, _ in seen]
    assert all(0.045 < t < 0.09 for t in secs), secs  # was: the first ~0.1 (two passes), the last ~0
    assert sum(secs) <= time.perf_counter() - t0
    assert sum(secs) == pytest.approx(eng.stats.decode_s, rel=1e-6) and sum(secs) > 8 * 0.05  # nothing lost


class PeekingDrafter(AutoDrafter):
    """NOT exact: it chooses the source after seeing this cycle's draw. Rows whose model draft did not draw its most
    likely first token take the n-gram draft instead; the rest keep a draft that is no longer distributed as q."""

    def propose(self, contexts, caps, sp, keys, source=None):
        m = self.sources["model"].propose(contexts, caps, sp, keys)
        g = self.sources["ngram"].propose(contexts, caps, sp, keys)
        if m.k == 0 or g.k == 0:
            return m
        k = min(m.k, g.k)
        swap = (m.tokens[:, 0] != mx.argmax(m.q[:, 0], axis=-1))[:, None]
        tokens = mx.where(swap, g.tokens[:, :k], m.tokens[:, :k])
        onehot = (mx.arange(m.q.shape[-1]) == g.tokens[:, :k, None]).astype(mx.float32)
        q = mx.where(swap[..., None], onehot, m.q[:, :k])
        lengths = [min(k, a, b) for a, b in zip(m.lengths, g.lengths)]
        return Draft(tokens, q, lengths, lengths)


NONE_PAYS = Costs(1.0, {"ngram": 3.0, "model": 3.0}, step=1.0)  # plain steps, chained for one row


@pytest.mark.parametrize("sp,costs,rows", [(SamplingParams(), BOTH, 1), (SamplingParams(temp=1.0, top_p=0.9), BOTH, 2),
                                           (SamplingParams(), NONE_PAYS, 1)], ids=["greedy", "top-p-batch", "chained"])
def test_the_policy_sees_the_targets_confidence_at_committed_tokens_only(tiny, monkeypatch, sp, costs, rows):
    monkeypatch.setattr(sampling, "CANDIDATES", 6)  # some nuclei lie past the partial selection: judged again
    target, _ = tiny
    prompts = [list(target.tokenizer.encode(p)) for p in ("abcabcabcabc", "the sea is ")[:rows]]
    eng = auto_engine(tiny, costs, sp, batch_size=rows, max_tokens=40)
    seen, observe = {i: [] for i in range(rows)}, eng.policy.observe

    def spy(confs):  # per member: the engine's rows, before a refill or a row leaving
        for b, cs in enumerate(confs):
            seen[eng.rows[b].req.index].extend(cs)
        observe(confs)
    eng.policy.observe = spy
    calls, update = [], eng.policy.update
    eng.policy.update = lambda *a, **k: calls.append("update") or update(*a, **k)
    observe_spied = eng.policy.observe
    eng.policy.observe = lambda confs: calls.append("observe") or observe_spied(confs)
    outs = [[] for _ in range(rows)]
    for ev in eng.generate([Request(i, ids, 40, 0) for i, ids in enumerate(prompts)]):
        outs[ev.request].extend(ev.tokens)
    if costs is BOTH:
        assert eng.stats.drafted > 10 and eng.stats.acceptance_rate < 1.0  # drafts were rejected: positions after
    else:
        assert eng.stats.drafted == 0 and eng.stats.cycles == 40 and len(eng.policy.fit.chained) > 20
    assert calls == ["update", "observe"] * (len(calls) // 2)  # each cycle learnt at what it was planned with
    for i, ids in enumerate(prompts):
        logits = target.model(mx.array([ids + outs[i]]))[0, len(ids) - 1: -1].astype(mx.float32)
        want = np.array(mx.exp(logits.max(-1) - mx.logsumexp(logits, -1)))  # at each committed token
        assert len(seen[i]) == len(want) and np.allclose(seen[i], want, atol=1e-4)


CONF = Costs(1.0, {"ngram": 0.02, "model": 0.25}, {"model": [0.7] * 4}, {"model": [100.0] * 4},
             conf={"model": [0.6, 100.0]})  # a row's confidence moves what it expects of the model


def test_auto_choosing_by_the_targets_confidence_is_distributed_as_the_target(tiny, monkeypatch):
    sp = SamplingParams(temp=1.0, top_k=20, top_p=0.9)
    target, _ = tiny
    offsets = []
    offset = AutoPolicy.offset

    def spy(self, source, member=0):
        offsets.append(offset(self, source, member))
        return offsets[-1]
    monkeypatch.setattr(AutoPolicy, "offset", spy)
    ids, first, second, eng = pairs(tiny, sp, CONF)
    assert sum(abs(o) > 0.1 for o in offsets) > 100  # the rows' confidence moved what they expected
    assert {"ngram", "model"} <= set(eng.stats.sources)
    p1, p2 = target_marginals(target, ids, sp)
    assert fits(np.bincount(first, minlength=len(p1)), p1)
    assert fits(np.bincount(second, minlength=len(p1)), p2)


def test_negative_control_a_choice_that_sees_the_draft_fails(tiny):
    sp = SamplingParams(temp=1.0)
    target, _ = tiny
    ids, first, second, _ = pairs(tiny, sp, BOTH, drafter_cls=PeekingDrafter)
    p1, p2 = target_marginals(target, ids, sp)
    assert not (fits(np.bincount(first, minlength=len(p1)), p1) and fits(np.bincount(second, minlength=len(p1)), p2))


def test_statistics_per_source_add_up(tiny):
    target, _ = tiny
    eng = auto_engine(tiny, BOTH, max_tokens=80)
    run(eng, list(target.tokenizer.encode("abcabcabcabc")))
    st = eng.stats
    d = st.to_dict()
    assert sum(x["cycles"] for x in d["sources"].values()) == st.cycles == len(d["source_trace"])
    assert sum(x["drafted"] for x in d["sources"].values()) == st.drafted
    assert sum(x["committed"] for x in d["sources"].values()) == st.generated_tokens
    assert sum(x["time_share"] for x in d["sources"].values()) == pytest.approx(1.0)
    assert d["plain_steps"] == d["sources"].get("plain", {}).get("cycles", 0)


def test_the_kept_acceptance_is_the_prior_and_a_poor_source_is_still_tried():
    no_match = lambda s, c, k: [0] * len(c) if s == "ngram" else None  # noqa: E731
    good = Costs(1.0, {"ngram": 0.05, "model": 0.3}, {"model": [0.95] * 6})
    assert policy(good, no_match).plan([[0]]) == ("model", 6)  # a source known to be good drafts wide at once
    poor = Costs(1.0, {"ngram": 0.05, "model": 0.3}, {"model": [0.1] * 6})
    p = policy(poor, no_match)
    assert p.plan([[0]]) == ("model", 1)  # untried this run: the bonus says try one token
    p.update([1], [0], source="model")
    chosen = []
    for _ in range(300):  # plain steps; the evidence decays, the bonus for the untried grows
        s, k = p.plan([[0]])
        chosen.append(s)
        p.update([k], [0], source=s)
    probes = [i for i, s in enumerate(chosen) if s == "model"]
    later = [i for i in probes if i > 3]  # (a second probe may follow the first at once)
    assert later and later[0] > 20 and len(probes) < 30
    p.update([3], [3], source="model")
    assert p.measured() is None  # too few cycles timed to keep anything


def test_plain_decoding_with_the_partial_top_p_redoes_a_chained_step_and_stays_exact(tiny, monkeypatch):
    """Plain steps are chained (launched before the previous one is read); when the previous one is judged again
    with the full sort, the chained step that started from its old token is undone and launched again."""
    monkeypatch.setattr(sampling, "CANDIDATES", 6)
    discarded = []
    relaunch = Engine._relaunch
    monkeypatch.setattr(Engine, "_relaunch", lambda self, f: discarded.append(1) or relaunch(self, f))
    target, _ = tiny
    sp = SamplingParams(temp=1.0, top_p=0.8)
    ids = list(target.tokenizer.encode("abcabcab"))
    eng = Engine(target.model, None, None, (), DecodeConfig(sampling=sp, max_tokens=3), 250)
    arr = np.array([o[:2] for o in run(eng, ids, N)])
    p1, p2 = target_marginals(target, ids, sp)
    assert discarded
    assert fits(np.bincount(arr[:, 0], minlength=len(p1)), p1)
    assert fits(np.bincount(arr[:, 1], minlength=len(p1)), p2)


def test_a_long_backlog_is_fed_in_chunks_and_greedy_stays_identical(tiny):
    """With a tiny prefill step, the draft model catches up on what n-gram cycles committed in several chunks."""
    target, draft = tiny
    ids = list(target.tokenizer.encode("abcabcabcabc"))
    plain = run(Engine(target.model, None, None, (), DecodeConfig(max_tokens=60)), ids)
    drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "model": ModelDrafter(draft.model, prefill_step=3)})
    pol = AutoPolicy(["ngram", "model"], 4, Costs(1.0, {"ngram": 0.01, "model": 0.2}, {"model": [0.99] * 4}),
                     drafter.lookahead)
    eng = Engine(target.model, drafter, pol, (), DecodeConfig(max_tokens=60))
    assert run(eng, ids) == plain
    assert eng.stats.sources["ngram"].cycles and eng.stats.sources["model"].cycles


# ---- the command line: the kept table, statistics per source -------------------------------------------------

def test_generate_keeps_the_costs_and_reports_every_source(cli, tiny_paths, tmp_path):
    import json

    docs = []
    for i in range(2):
        sj = tmp_path / f"run{i}.json"
        r = cli("generate", "--model", tiny_paths["target"], "--draft-model", tiny_paths["draft"], "--max-tokens", 60,
                "--no-chat", "--stats-json", sj, input=b"abcabcabcabc")
        assert r.returncode == 0, r.stderr.decode()
        docs.append(json.loads(sj.read_text()))
    assert docs[0]["settings"]["draft"] == "auto" and docs[0]["auto"]["sources"] == ["ngram", "model"]
    assert not docs[0]["auto"]["warm"] and docs[1]["auto"]["warm"]  # the second run decides with the kept table
    assert docs[1]["auto"]["costs"]["plain"] != 1.0  # seconds measured, not the prior's units
    assert "plain_steps:" in r.stderr.decode() or "source " in r.stderr.decode()
    r = cli("stats", "--by", "source", "--json")
    groups = json.loads(r.stdout)
    # (the tiny draft model is as large as the target, so it never pays: n-gram lookup and plain steps)
    assert "ngram" in groups and all(g["cycles"] > 0 for g in groups.values())
    assert sum(g["time_share"] for g in groups.values()) == pytest.approx(1.0)
    r = cli("stats", "--by", "source")
    assert r.returncode == 0 and "time_share" in r.stdout.decode()


def _settle_add_one(home):
    import os

    from mtpcli import runlog

    os.environ["XDG_DATA_HOME"] = home
    for _ in range(5):
        runlog.update_costs("k", lambda cur: {"n": (cur or {"n": 0})["n"] + 1})


def test_concurrent_runs_settle_the_kept_table_one_after_another():
    import multiprocessing as mp
    import os

    from mtpcli import runlog

    home = os.environ["XDG_DATA_HOME"]
    runlog.update_costs("k", lambda cur: {"n": 0})
    with mp.get_context("spawn").Pool(6) as pool:
        pool.map(_settle_add_one, [home] * 6)
    assert runlog.load_costs("k") == {"n": 30}
