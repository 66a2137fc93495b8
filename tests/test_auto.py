"""draft = auto: the policy alone (pure), then the engine with two sources on tiny models (greedy identity,
chi-square exactness at T = 1 and T = 0.7 with top-k/top-p, a negative control), statistics per source."""

import functools
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
from mtpcli.engine import DecodeConfig, Engine
from mtpcli.costs import CostFit, Costs, prior_costs
from mtpcli.policy import AutoPolicy, fit_shift
from mtpcli.stop import Stop, passes, shifted
from mtpcli.sampling import SamplingParams
from mtpcli.tree import Spec
from stattools import fit_two
import helpers
from helpers import N, copies, target_marginals
from test_engine import PROMPTS

# ---- the policy, without a model ------------------------------------------------------------------------------

NO_MATCH = lambda s, c, k: [[] for _ in c] if s == "ngram" else None  # noqa: E731


def policy(costs=None, avail=None, batch=1, n_max=6):
    costs = costs or Costs(1.0, {"ngram": 0.05, "model": 0.3})
    return AutoPolicy(["ngram", "model"], n_max, costs, avail or (lambda s, c, k: None), batch=batch, warm=True)


def test_a_plain_step_when_no_source_pays():
    poor = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"model": [0.05, 200.0]})
    assert helpers.source_width(policy(poor, NO_MATCH).plan([[1, 2, 3]])) == (None, 0)
    good = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"model": [0.95, 200.0]})
    assert helpers.source_width(policy(good, NO_MATCH).plan([[1, 2, 3]])) == ("model", 6)  # a source known to be good drafts wide


def test_ngram_is_chosen_up_to_its_match_and_never_without_one():
    match = {"n": 3}
    kept = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"ngram": [1.0, 200.0], "model": [0.0, 200.0]})
    p = policy(kept, lambda s, c, k: [[1.0] * min(k, match["n"])] if s == "ngram" else None)
    assert helpers.source_width(p.plan([[0]])) == ("ngram", 3)  # wider than its match would verify nothing more
    match["n"] = 0
    assert p.plan([[0]]).source != "ngram"


def test_a_source_that_estimates_its_tokens_is_expected_what_it_says_not_its_kept_acceptance():
    # the kept table says every drafted token was accepted; the source's own estimates say otherwise
    kept = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"ngram": [1.0, 200.0]})
    est = {"v": [0.02, 0.02, 0.02]}
    p = AutoPolicy(["ngram", "model"], 6, kept, lambda s, c, k: [est["v"][:k]] if s == "ngram" else [[]], warm=True)
    assert helpers.source_width(p.plan([[0]])) == (None, 0)  # three tokens at 2% each are not worth verifying
    assert p.expected("ngram", 3, estimates=est["v"]) < 1.1 < p.expected("ngram", 3)
    est["v"] = [0.99] * 6
    assert helpers.source_width(p.plan([[0]])) == ("ngram", 6)
    # and the other way: a poor kept acceptance does not hold back a source sure of its tokens
    poor = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"ngram": [0.05, 200.0]})
    q = AutoPolicy(["ngram", "model"], 6, poor, lambda s, c, k: [[0.99] * k] if s == "ngram" else [[]], warm=True)
    assert helpers.source_width(q.plan([[0]])) == ("ngram", 6) and q.expected("ngram", 6) < 1.1


def test_the_shift_is_the_log_odds_move_that_explains_the_outcomes():
    assert fit_shift([], prior=0.4) == 0.4  # nothing seen: the kept shift
    assert shifted(0.5, 0.0) == 0.5 and shifted(0.5, np.log(3)) == pytest.approx(0.75)
    z = float(np.log(0.3 / 0.7))
    up = fit_shift([(z, 1.0)] * 40, sd=100.0)  # estimated 0.3, always passed: far up
    assert shifted(0.3, up) > 0.95
    half = fit_shift([(z, 1.0), (z, 0.0)] * 50, sd=100.0)  # passed half the time: 0.3 -> 0.5
    assert shifted(0.3, half) == pytest.approx(0.5, abs=1e-3)
    few = fit_shift([(z, 1.0)] * 3)  # a few tokens move it a little, towards the prior
    assert 0 < few < up and fit_shift([(z, 1.0)] * 3, prior=-1.0) < few


def test_a_rows_estimates_are_calibrated_by_how_its_drafts_fared():
    costs = Costs(1.0, {"ngram": 0.4, "model": 5.0})
    p = AutoPolicy(["ngram", "model"], 4, costs, lambda s, c, k: [[0.3] * k] * len(c) if s == "ngram" else None,
                   batch=2, warm=True)
    assert helpers.source_width(p.plan([[0], [0]])) == (None, 0)  # at 30% a token is not worth its verification (40% of a step)
    for _ in range(6):  # row 0 passes everything its lookup drafts, row 1 nothing
        p.update([4, 4], [4, 0], source="ngram", chances=[[0.3] * 4, [0.3] * 4], seconds=1.4)
    assert p.shift("ngram", 0) > 1.0 > -0.1 > p.shift("ngram", 1)
    assert p.expected("ngram", 4, 0, [0.3] * 4) > 2.0 > 1.3 > p.expected("ngram", 4, 1, [0.3] * 4)
    assert p.plan([[0], [0]]).source == "ngram"  # one plan for the batch, on the rows' own estimates
    assert p.stop("ngram").shifts == (p.shift("ngram", 0), p.shift("ngram", 1))
    p.keep([1])  # row 0 left: its evidence goes with it
    assert p.shift("ngram", 0) < -0.1 and helpers.source_width(p.plan([[0]])) == (None, 0)
    kept = p.measured()  # the run's shift, over every row's tokens (24 passed, 6 rejected), is kept for the next run
    assert kept.shift["ngram"][1] == 30 and shifted(0.3, kept.shift["ngram"][0]) == pytest.approx(0.8, abs=0.02)


def test_a_kept_shift_stays_put_near_and_moves_far():
    kept = Costs(1.0, {"model": 0.3}, shift={"ngram": [1.0, 200.0]})
    assert Costs.from_dict(kept.to_dict()).shift == {"ngram": [1.0, 200.0]}
    assert kept.settled(Costs(1.0, {"model": 0.3}, shift={"ngram": [1.3, 40.0]})) is kept
    moved = kept.settled(Costs(1.0, {"model": 0.3}, shift={"ngram": [-1.0, 100.0]}))
    assert moved.shift["ngram"] == pytest.approx([(200 - 100) / 300, 200.0])
    with pytest.raises(ValueError):
        Costs.from_dict({"step": 1.0, "per_token": {}, "shift": {"ngram": [float("nan"), 1]}, "runs": 1})


def test_a_source_never_drafts_wider_than_its_own_widest():
    always = Costs(1.0, {"ngram": 0.01, "model": 0.01}, accept={"ngram": [1.0, 200.0], "model": [1.0, 200.0]})
    p = AutoPolicy(["ngram", "model"], 16, always, warm=True, widest={"ngram": 8, "model": 4})
    assert {k for (s, k) in p.scores([[0]]) if s == "ngram"} == set(range(1, 9))
    assert max(k for (s, k) in p.scores([[0]]) if s == "model") == 4
    assert helpers.source_width(p.plan([[0]])) == ("ngram", 8)


def test_the_stop_is_what_a_token_must_bring_to_match_plain_steps():
    stop = policy(Costs(0.5, {"ngram": 0.05, "model": 0.3})).stop("model")
    keep, go_on = stop.keep, stop.go_on
    assert keep == pytest.approx(0.1)  # its verification: 0.05 s of plain steps at 0.5 s each
    assert go_on == pytest.approx(0.6)  # a draft step and its verification: 0.3 s
    assert policy(Costs(0.5, {"ngram": 0.05, "model": 0.9})).stop("model").go_on == 0.95  # never drafts for nothing
    # once a plan expects more than plain steps give, a token must match that rate (the best plan's): n-gram
    # lookup sure of 6 tokens makes 7 tokens in 0.8 s
    p = AutoPolicy(["ngram", "model"], 6, Costs(0.5, {"ngram": 0.05, "model": 0.3}),
                   lambda s, c, k: [[0.999999] * k] if s == "ngram" else None, warm=True)
    assert helpers.source_width(p.plan([[0]])) == ("ngram", 6)
    stop = p.stop("model")
    keep, go_on = stop.keep, stop.go_on
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
    from mtpcli.drafters import autoregress

    greedy = SamplingParams()
    # each position alone is above 0.5 (0.82); their product falls below it at the 4th: that token is kept (its
    # step was paid for), no 5th step is taken; with keep = 0.5 too, the 4th token is dropped as well
    assert passes(0.8, True) > 0.5 > passes(0.8, True) ** 4 and passes(0.8, True) ** 3 > 0.5
    step = _confident([[0.8] * 6])
    assert autoregress(step, [6], greedy, [None], stop=Stop(0.0, 0.5)).lengths == [4]
    assert len(step.calls) == 4  # no step run to be thrown away
    assert autoregress(_confident([[0.8] * 6]), [6], greedy, [None], stop=Stop(0.5, 0.5)).lengths == [3]
    assert autoregress(_confident([[0.8] * 6]), [6], greedy, [None]).lengths == [6]  # no stop: as asked
    # a batch drafts on together while its rows' chances, on average, stay above the stop
    d = autoregress(_confident([[0.99, 0.99, 0.3, 0.99], [0.99] * 4]), [4, 4], greedy, [None] * 2, stop=Stop(0.0, 0.5))
    assert d.lengths == [4, 4] and d.requested == [4, 4] and d.tokens[1].tolist() == [0, 1, 2, 3]
    unsure = [[0.99, 0.3, 0.9, 0.9], [0.99, 0.4, 0.9, 0.9]]  # both at the second position: (0.37 + 0.46) / 2
    assert autoregress(_confident(unsure), [4, 4], greedy, [None] * 2, stop=Stop(0.0, 0.5)).lengths == [2, 2]
    assert autoregress(_confident(unsure), [4, 4], greedy, [None] * 2, stop=Stop(0.45, 0.5)).lengths == [1, 1]
    d = autoregress(_confident([[0.99] * 4] * 2), [2, 4], greedy, [None] * 2, stop=Stop(0.0, 0.5))
    assert d.lengths == [2, 3]  # a row's own cap ends it; then the other's chance is worth half a plain step
    # at T > 0 the chance comes from sum min(p, q)'s fit: 0.59 for a draft half sure, then 0.35; near 1 where the
    # draft is sure (as sum min(p, q) is where both agree), so that sure tokens need no shift to be believed
    hot, keys = SamplingParams(temp=1.0), [mx.random.key(0)]
    assert passes(0.5, False) > 0.5 > passes(0.5, False) ** 2
    assert passes(1.0, False) == pytest.approx(1.0) and passes(0.99, False) > 0.985 > passes(0.9, False)
    assert autoregress(_confident([[0.5] * 4]), [4], hot, keys, stop=Stop(0.0, 0.5)).lengths == [2]
    assert autoregress(_confident([[0.5] * 4]), [4], hot, keys, stop=Stop(0.4, 0.5)).lengths == [1]
    # a row whose drafts passed more often than their confidence said (its shift) drafts on; the chances the
    # draft reports are the unshifted ones (the points of the next fit)
    d = autoregress(_confident([[0.5] * 4]), [4], hot, keys, stop=Stop(0.0, 0.5, [2.0]))
    assert d.lengths == [4] and d.chances == [[pytest.approx(passes(0.5, False))] * 4]
    assert autoregress(_confident([[0.8] * 6]), [6], greedy, [None], stop=Stop(0.0, 0.5, [-2.0])).lengths == [1]


def test_drafted_tokens_are_counted_censored_and_a_draft_cut_short_as_rejected_where_it_stopped():
    def seen(drafted, accepted, requested):
        p = policy()
        p.update([drafted], [accepted], source="model", requested=[requested])
        return p.seen["model"]

    assert seen(2, 2, 4) == [2, 3]  # cut at 2 by the stop, both passed: 3 tokens, as a rejection at 2 gives
    assert seen(2, 2, 2) == [2, 2]  # as asked, all passed: nothing past it was tested (censored)
    assert seen(4, 1, 4) == [1, 2]  # rejected at 1: nothing counted past it
    assert seen(0, 0, 3) == [0, 1]  # the stop dropped every token: rejected at the first
    p = policy()
    for _ in range(3):
        p.update([3], [1], source="model", seconds=1.0)
        p.update([0], [0], seconds=0.5)
    assert p.measured().accept == {"model": [pytest.approx(1 / 2), 6.0]}  # tested on at least 4 tokens: kept


def test_a_source_the_table_calls_poor_is_probed_at_cycles_8_16_32():
    poor = Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"model": [0.05, 200.0]})
    p = policy(poor, NO_MATCH)
    chosen = helpers.planned(p, 70, lambda s, k: p.update([k], [0], source=s, seconds=1.0))
    # two cycles in a row after 8 and 16 (the first catches up, untimed); then it has drafted four times
    assert [i for i, s in enumerate(chosen) if s == "model"] == [8, 9, 16, 17]
    assert sum(map(len, p.fit.drafts["model"].values())) == 2  # the second cycle of each probe timed, not the first
    cut = policy(poor, NO_MATCH)  # a probe its stop cut to nothing still counts as made: the next waits
    chosen = helpers.planned(cut, 20, lambda s, k: cut.update([0], [0], source=s, requested=[k], seconds=1.0))
    assert [i for i, s in enumerate(chosen) if s == "model"] == [8, 9, 16, 17] and cut.drafted["model"] == 0
    other = policy(poor, lambda s, c, k: [[1.0] * min(k, 2)] if s == "ngram" else None)
    # lookup drafting every cycle does not use up the model's probe
    helpers.planned(other, 12, lambda s, k: other.update([k], [k], source=s, requested=[k]))
    assert other.drafted["model"] == 2 and other.probe == 16
    good = policy(Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"model": [0.95, 200.0]}), NO_MATCH)
    for _ in range(20):  # a source that drafts anyway is never forced
        assert good.plan([[0]]).source == "model"
        good.update([6], [6], source="model", requested=[6])


def test_a_cold_run_decides_by_its_own_measurements_from_its_rebase_cycle_on():
    """The prior calls the model cheap; this machine's cycles say it is dear: a first run follows the prior until its
    32nd cycle, then what it measured (as the next run would), where a run that never re-bases drafts on."""
    prior = prior_costs(["ngram", "model"], {"model": 0.25}, gpu=False)
    true = Costs(0.1, {"ngram": 0.01, "model": 0.2}, {"model": 0.1})  # seconds: a draft token dearer than a step

    def first_run(rebase):
        p = AutoPolicy(["ngram", "model"], 4, prior, NO_MATCH, stops=[], rebase=rebase)
        def every_draft_passes(s, k):  # (cost decides)
            p.update([k], [k], source=s, requested=[k], seconds=true.time(s, k))

        return p, helpers.planned(p, 60, every_draft_passes)

    p, chosen = first_run(32)
    assert chosen[1:32] == ["model"] * 31 and chosen[32:] == [None] * 28  # 32-34: a plain step timed, then dear
    assert p.rebase == 0 and not p.warm  # (what it keeps is still a first run's)
    assert p.costs.step == pytest.approx(0.1) and p.costs.time("model", 1) > 2 * p.costs.step  # seconds, measured
    assert p.costs.per_token["ngram"] == pytest.approx(prior.per_token["ngram"] * 0.1)  # unmeasured: the prior's
    never, chosen = first_run(0)
    assert chosen[1:] == ["model"] * 59 and never.costs is prior


def test_cost_fit_recovers_the_costs_per_source_through_a_busy_machines_outliers():
    truth = Costs(0.2, {"ngram": 0.01, "model": 0.07}, {"model": 0.1})
    for outliers in (0.0, 0.2):
        fit = CostFit(prior_costs(["ngram", "model"], {"model": 0.5}, gpu=False))
        helpers.timed(fit, truth, (8, 6), outliers)  # now and then a cycle ten times slower: another job ran
        got = fit.result()
        assert got.step == pytest.approx(0.2, rel=0.05)
        assert got.time("ngram", 1) == pytest.approx(0.21, rel=0.1) and got.time("ngram", 7) == pytest.approx(
            0.27, rel=0.1)
        assert got.time("model", 1) == pytest.approx(0.37, rel=0.1) and got.time("model", 5) == pytest.approx(
            0.65, rel=0.1)
        assert got.fixed["ngram"] == pytest.approx(0.0, abs=0.02)  # lookup is not charged the model's catch-up
    assert CostFit(prior_costs(["model"], {"model": 0.5}, gpu=False)).result() is None  # nothing measured
    lone = CostFit(Costs(0.2, {"model": 0.07}), known=True)
    for _ in range(6):  # one width only, no plain step: the machine was slower (a busy one), the table's ratios hold
        lone.add("model", 4, 0.58)
    assert lone.result().step == pytest.approx(0.58 / 0.48 * 0.2) and lone.result().fixed["model"] == pytest.approx(0)
    assert lone.result().per_token["model"] == pytest.approx(0.07 * 0.58 / 0.48)
    for _ in range(3):
        lone.add(None, 0, 0.2)  # with plain steps timed: the slope is the kept one, the rest of the cycle is fixed
    assert lone.result().per_token["model"] == pytest.approx(0.07) and lone.result().fixed["model"] == pytest.approx(
        0.1)


def test_cost_fit_leaves_out_each_widths_first_cycle_which_compiles_on_a_gpu():
    truth = Costs(0.005, {"history": 0.0002})  # a GPU's: a step of milliseconds, a drafted token nearly free
    fit = CostFit(truth, known=True)
    for _ in range(40):
        fit.add(None, 0, truth.step)
    compiled = set()
    for k in (2, 3, 5, 7, 10, 13, 16, 16, 13, 10, 7, 5, 3, 2, 16, 16):  # each new width: a new shape, compiled once
        fit.add("history", k, truth.time("history", k) + (2.0 if k not in compiled else 0.0))
        compiled.add(k)
    got = fit.result()
    assert got.per_token["history"] == pytest.approx(0.0002, rel=0.05) and got.fixed["history"] < 1e-4
    assert fit.cycles() == 56
    fit.add("history", 4, None)  # not timed (a probe's first cycle), its shape compiled all the same ...
    fit.add("history", 4, truth.time("history", 4))  # ... so the next at that width is timed
    fit.add("history", 6, None, None)  # a tree's cycle: no chain's shape compiled ...
    fit.add("history", 6, truth.time("history", 6) + 2.0)  # ... so the first chain at its width is left out
    fit.add("history", 3, truth.time("history", 3) + 2.0, (2,))  # two rows: another shape than one row's
    assert fit.drafts["history"][4] == [pytest.approx(truth.time("history", 4))] and 6 not in fit.drafts["history"]
    assert len(fit.drafts["history"][3]) == 1 and fit.cycles() == 61 and fit.untimed == 2


def test_a_kept_table_that_timed_a_compile_heals_from_its_two_probes_timed_cycles():
    poisoned = Costs(0.005, {"history": 0.5}, {"history": 0.0})  # a GPU table that took a compile for a cost
    fit = CostFit(poisoned, known=True)
    for _ in range(10):
        fit.add(None, 0, 0.005)
    fit.add("history", 1, None)  # the probe: its first cycle catches up, untimed; its second is timed ...
    fit.add("history", 1, 0.0052)
    fit.add("history", 1, None)  # ... and again at the next probe
    fit.add("history", 1, 0.0052)
    got = fit.result()
    assert got.per_token["history"] == pytest.approx(0.0002, rel=0.05) and got.fixed["history"] < 1e-4
    assert poisoned.settled(got).per_token["history"] < 0.5 * 0.8  # the kept table moves off its compile
    fair = CostFit(Costs(0.010, {"history": 0.0002}), known=True)  # within noise of a step: the slope stands
    for _ in range(10):
        fair.add(None, 0, 0.010)
    for t in (None, 0.0099, None, 0.0100):
        fair.add("history", 2, t)
    assert fair.result().per_token["history"] == pytest.approx(0.0002)


def test_kept_costs_stay_put_within_tolerance_and_move_a_fifth_of_the_way_and_at_most_a_factor_beyond_it():
    old = Costs(1.0, {"ngram": 0.1, "model": 0.3}, {"model": 0.2}, runs=5)
    assert old.settled(Costs(1.05, {"ngram": 0.11, "model": 0.32}, {"model": 0.2})) is old  # same seed, same output
    busy = old.settled(Costs(3.0, {"ngram": 0.5, "model": 0.9}, {"model": 1.0}))  # a run on a busy machine
    assert busy.step == pytest.approx(3 ** 0.2) and busy.runs == 6  # a fifth of the way (in logs)
    # costs as a step's share (plus 0.02): a fifth of the way, ngram 0.1 -> 0.5 / 3
    assert busy.per_token["ngram"] / busy.step == pytest.approx(0.12 * ((0.5 / 3 + 0.02) / 0.12) ** 0.2 - 0.02)
    assert busy.fixed["model"] / busy.step == pytest.approx(0.22 * ((1.0 / 3 + 0.02) / 0.22) ** 0.2 - 0.02)
    young = Costs(1.0, {"model": 0.3}).settled(Costs(2.0, {"model": 0.3}))  # a table of one run: half way, bounded
    assert young.step == pytest.approx(1.25) and young.runs == 2  # (not 2 ** 0.5: at most a factor 1.25)
    assert young.per_token["model"] / young.step == pytest.approx(0.32 / 1.25 - 0.02)  # 0.3 -> 0.15: bounded too
    learnt = old.settled(Costs(1.0, {"mtp": 0.05}))  # a source the table had not measured: taken as measured
    assert learnt.per_token == {"ngram": 0.1, "model": 0.3, "mtp": 0.05}
    slow = old.settled(Costs(2.0, {"ngram": 0.2}))  # the model not drafted: its share of a step stays as kept
    assert slow.per_token["model"] / slow.step == pytest.approx(0.3) and slow.fixed["model"] / slow.step == 0.2
    swings = [old]  # ten busy runs, each measuring the model at 3 or 1/3 of its kept share: it moves boundedly
    for i in range(10):
        swings.append(swings[-1].settled(Costs(1.0, {"ngram": 0.1, "model": 0.9 if i % 2 else 0.1}, {"model": 0.2})))
    assert all(0.24 < c.per_token["model"] / c.step < 0.34 for c in swings)
    with pytest.raises(ValueError):
        Costs.from_dict({"step": float("nan"), "per_token": {}, "runs": 1})
    with pytest.raises(ValueError):
        Costs.from_dict({"step": 1.0, "per_token": {"model": 0.1}, "fixed": {"model": -1.0}, "runs": 1})


def test_kept_acceptance_stays_put_under_sampling_noise_and_moves_on_real_change():
    kept = Costs(1.0, {"model": 0.3}, accept={"model": [0.7, 200.0]})
    assert kept.settled(Costs(1.0, {"model": 0.3}, accept={"model": [0.8, 20.0]})) is kept  # within 2 s.e. of 20
    moved = kept.settled(Costs(1.0, {"model": 0.3}, accept={"model": [0.2, 100.0]}))
    assert moved.accept["model"] == pytest.approx([(0.7 * 200 + 0.2 * 100) / 300, 200.0])  # capped: it moves on
    assert Costs.from_dict(moved.to_dict()).accept == moved.accept
    gained = kept.settled(Costs(1.0, {"model": 0.3}, accept={"model": [0.7, 20.0]}, conf={"model": [0.8, 50.0]}))
    assert gained.conf == {"model": [0.8, 50.0]} and gained.accept == kept.accept  # a confidence it lacked: learnt


def test_a_table_of_an_earlier_format_is_not_read_and_the_prior_is_used():
    from mtpcli.assemble import _kept

    old = {"plain": 0.3, "step": 0.34, "per_token": {"ngram": 0.04, "model": 0.17}, "fixed": {"model": 0.16},
           "accept": {"model": [0.9, 0.8]}, "visits": {"model": [30.0, 10.0]}}  # (no `runs`: before it was kept)
    assert _kept(old) is None and _kept({"plain": 1.0, "per_token": {}}) is None


# ---- the engine with two sources on tiny models -----------------------------------------------------------------

def auto_engine(tiny, costs, sp=SamplingParams(), batch_size=1, drafter_cls=AutoDrafter, nodes=0):
    """`nodes`: both sources draft trees of at most that many nodes where they pay, priced by `costs` (the plan's)."""
    target, draft = tiny
    spec = {s: Spec(nodes, 2, functools.partial(costs.time, s)) if nodes else None for s in ("ngram", "model")}
    drafter = drafter_cls({"ngram": NgramDrafter(1, 3, spec["ngram"]), "model": ModelDrafter(draft.model,
                                                                                             trees=spec["model"])})
    pol = AutoPolicy(["ngram", "model"], 4, costs, drafter.available_of, warm=True,  # no calibration steps
                     stops=["model"])  # as assemble.auto_policy: the model is asked for its widest, and its plans
    #                                    say where it stops (Plan.stop: where the draft is unsure)
    return Engine(target.model, drafter, pol, (), DecodeConfig(sampling=sp), batch_size, trees=bool(nodes))


def run(eng, ids, n=1, max_tokens=48):
    return helpers.run(eng, copies(ids, n, max_tokens, 0))


BOTH = Costs(1.0, {"ngram": 0.02, "model": 0.05})  # both sources pay on the tiny pair


def test_auto_greedy_is_token_identical_to_plain_decoding(tiny):
    target, _ = tiny
    used = set()
    for prompt in PROMPTS + ["abcabcabcabc"]:
        ids = list(target.tokenizer.encode(prompt))
        plain = Engine(target.model, None, None, (), DecodeConfig())
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
    plain = run(Engine(target.model, None, None, (), DecodeConfig()), ids, max_tokens=60)
    drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "model": ModelDrafter(draft.model)})
    eng = Engine(target.model, drafter, AutoPolicy(["ngram", "model"], 4, BOTH, drafter.available_of, warm=True,
                                                   stops=["model"]), (),
                 DecodeConfig())
    assert run(eng, ids, max_tokens=60) == plain
    assert eng.stats.drafted > 0 and eng.stats.cycles < eng.stats.generated_tokens  # it really speculated


def test_readme_documents_auto_and_its_statistics():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for text in ("`--draft auto`", "--by profile|model|draft|source", "`sources`", "`plain_steps`", "`source_trace`",
                 "`auto`", "Which to choose", "docs/perf/auto.md"):
        assert text in readme, text


def pairs(tiny, sp, costs, prompt="abcabcabcabc", drafter_cls=AutoDrafter, stop=None):
    target, _ = tiny
    ids = list(target.tokenizer.encode(prompt))
    eng = auto_engine(tiny, costs, sp, batch_size=250, drafter_cls=drafter_cls)
    if stop is not None:  # stops at the draft model's chance higher than the policy's, so that they cut often;
        shifts = eng.shifts = []  # each row's shift as the policy fits it (from the row's earlier cycles)

        policy_stop = eng.policy.stop

        def stopping(source):
            shift = policy_stop(source).shifts
            shifts.extend(shift)
            return Stop(*stop, shift)
        eng.policy.stop = stopping
    arr = np.array([o[:2] for o in run(eng, ids, N, 3)])
    return ids, arr[:, 0], arr[:, 1], eng


# n-gram lookup drafts first, then the draft model takes over; the model's chances are shifted (a kept shift, moved by
# each row's own drafts): where its drafts stop moves with them
TWO = Costs(1.0, {"ngram": 0.02, "model": 0.1}, shift={"model": [0.6, 20.0]})
AUTO_CASES = [
    SamplingParams(temp=1.0),
    SamplingParams(temp=0.7, top_k=20, top_p=0.9),
    SamplingParams(temp=1.0, top_p=0.8),  # top-p alone: its nucleus is looked for among 6 candidates
]


@pytest.mark.slow
@pytest.mark.parametrize("sp", AUTO_CASES, ids=str)
def test_auto_is_distributed_as_the_target(tiny, sp, monkeypatch):
    # few candidates for the partial top-p selection, so that some nuclei lie past it and are judged again
    monkeypatch.setattr(sampling, "CANDIDATES", 6)
    redone = []
    judge = verify.judge
    monkeypatch.setattr(verify, "judge", lambda *a, **k: redone.append(a[-1] or None) or judge(*a, **k))
    target, _ = tiny
    ids, first, second, eng = pairs(tiny, sp, TWO, stop=(0.3, 0.45))
    p1, p2 = target_marginals(target, ids, sp)
    used = {s: st.cycles for s, st in eng.stats.sources.items()}
    assert used.get("ngram", 0) > 20 and used.get("model", 0) > 20  # both sources drafted, in one run
    assert 0.05 < eng.stats.acceptance_rate < 0.98
    assert 20 < eng.stats.cut_short < used["model"] + used["ngram"]  # the stop cut some drafts short, not all
    assert len({round(d, 6) for d in eng.shifts}) > 3  # rows' shifts of the kept one moved with their earlier cycles
    if sp.top_p < 1.0 and not sp.top_k:  # cycles were judged again with the full sort, at most once each
        assert 0 < redone.count(True) <= redone.count(None)
    assert fit_two(first, second, p1, p2) == (True, True)


@pytest.mark.slow
def test_auto_chains_its_plain_steps_for_one_row_and_stays_exact(tiny, monkeypatch):
    """One row: a plain step the policy plans from the committed tokens is launched while the previous one is in
    flight (from the third token: the first is read before the second is launched); one judged again (a nucleus past
    the partial selection) is undone and launched again. The second and third tokens stay distributed as the
    target's."""
    monkeypatch.setattr(sampling, "CANDIDATES", 6)
    chained, discarded = [], []
    launch, relaunch = Engine._launch, Engine._relaunch
    monkeypatch.setattr(Engine, "_launch", lambda self, plan, after=None, fresh=False: chained.append(after is not None)
                        or launch(self, plan, after, fresh))
    monkeypatch.setattr(Engine, "_relaunch", lambda self, f: discarded.append(1) or relaunch(self, f))
    sp = SamplingParams(temp=1.0, top_p=0.8)
    target, _ = tiny
    ids = list(target.tokenizer.encode("the sea is "))
    eng = auto_engine(tiny, Costs(1.0, {"ngram": 0.3, "model": 1.0}), sp, batch_size=1)
    arr = np.array([o[:3] for o in run(eng, ids, N, 3)])
    probes = eng.stats.cycles - eng.stats.sources["plain"].cycles  # (each source drafts 3 times, at cycles 8, 16, ...)
    assert probes <= 6 and eng.stats.cycles > 3 * N - 20  # no source pays at these costs: plain steps
    assert N - 20 < sum(chained) <= N and len(discarded) > 25  # the 3rd token's step chained (not the 2nd's); some redone
    _, p2, p3 = target_marginals(target, ids, sp, 3)
    assert fit_two(arr[:, 1], arr[:, 2], p2, p3) == (True, True)


def test_a_launch_that_computes_is_charged_to_the_cycle_it_launched(tiny, monkeypatch):
    """Where a launch itself computes (MLX on a CPU), the time between two reads of chained plain steps holds the
    next step's pass: each step is charged its own launch, so a run of equal steps measures them all equal, the
    first and the last of a chain included, and the seconds add up to the time spent."""
    real, STEP = mx.async_eval, 0.3  # (seconds a launch spends: long beside a tiny pass, even on a busy machine)

    def computing(*arrays):  # as the CPU backend does: the pass is done before the launch returns
        real(*arrays)
        mx.eval(*arrays)
        time.sleep(STEP)

    monkeypatch.setattr(engine_mod.mx, "async_eval", computing)
    eng = auto_engine(tiny, Costs(1.0, {"ngram": 0.3, "model": 1.0}))  # plain steps only
    secs, chained = [], []
    update, launch = eng.policy.update, eng._launch
    eng.policy.update = lambda *a, **k: secs.append(k["seconds"]) or update(*a, **k)
    eng._launch = lambda plan, after=None, fresh=False: chained.append(after is not None) or launch(plan, after, fresh)
    t0 = time.perf_counter()
    run(eng, list(tiny[0].tokenizer.encode("the sea is ")), max_tokens=8)
    assert len(secs) == 8 and not any(chained[:2]) and all(chained[2:-1])  # a chain of plain steps, once the
    #                                                                         first token is out
    # was: the first ~2 STEP (two passes), the last ~0; a pass of the tiny model under load stays well under a STEP
    assert all(0.95 * STEP < t < 1.95 * STEP for t in secs), secs
    assert sum(secs) <= time.perf_counter() - t0
    assert sum(secs) == pytest.approx(eng.stats.decode_s, rel=1e-6) and sum(secs) > 8 * STEP  # nothing lost


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






@pytest.fixture(scope="module")
def quarter(tmp_path_factory):
    from mtpcli import models
    from tiny import quarter_pair

    return tuple(models.load(str(p)) for p in quarter_pair(tmp_path_factory.mktemp("quarter")))


@pytest.mark.slow
@pytest.mark.parametrize("sp", [SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=20)], ids=str)
def test_auto_with_a_draft_a_quarter_of_the_target_drafts_with_both_and_is_distributed_as_the_target(quarter, sp):
    """The policy with the prior a run starts from (a draft token costs its size over the target's, a quarter)."""
    from mlx.utils import tree_flatten

    target, draft = quarter
    size = lambda m: sum(x.size for _, x in tree_flatten(m.model.parameters()))  # noqa: E731
    assert 0.2 < size(draft) / size(target) < 0.3
    ids, first, second, eng = pairs(quarter, sp, prior_costs(["ngram", "model"], {"model": 0.25}, gpu=False))
    drafted = {s: st.drafted for s, st in eng.stats.sources.items()}
    assert drafted["ngram"] > 300 and drafted["model"] > 300  # both sources really drafted, in one run
    p1, p2 = target_marginals(target, ids, sp)
    assert fit_two(first, second, p1, p2) == (True, True)


@pytest.mark.slow
def test_a_cold_run_that_re_bases_on_its_own_timings_is_distributed_as_the_target(tiny):
    """A run that re-bases mid-run (after its 8th cycle here: its table then in seconds, with the acceptance it
    measured) keeps the law."""
    sp = SamplingParams(temp=1.0)
    target, _ = tiny
    ids = list(target.tokenizer.encode("abcabcabcabc"))
    eng = auto_engine(tiny, Costs(1.0, {}), sp, batch_size=250)
    eng.policy.use(prior_costs(["ngram", "model"], {"model": 0.25}, gpu=False), warm=False)
    eng.policy.rebase = 8
    arr = np.array([o[:2] for o in run(eng, ids, N, 3)])
    assert eng.policy.rebase == 0 and eng.policy.costs.step != 1.0  # it re-based: a table in seconds
    p1, p2 = target_marginals(target, ids, sp)
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) == (True, True)


@pytest.mark.slow
def test_negative_control_a_choice_that_sees_the_draft_fails(tiny):
    sp = SamplingParams(temp=1.0)
    target, _ = tiny
    ids, first, second, _ = pairs(tiny, sp, BOTH, drafter_cls=PeekingDrafter)
    p1, p2 = target_marginals(target, ids, sp)
    assert fit_two(first, second, p1, p2) != (True, True)


def test_statistics_per_source_add_up(tiny):
    target, _ = tiny
    eng = auto_engine(tiny, BOTH)
    run(eng, list(target.tokenizer.encode("abcabcabcabc")), max_tokens=80)
    st = eng.stats
    d = st.to_dict()
    assert sum(x["cycles"] for x in d["sources"].values()) == st.cycles == len(d["source_trace"])
    assert sum(x["drafted"] for x in d["sources"].values()) == st.drafted
    assert sum(x["committed"] for x in d["sources"].values()) == st.generated_tokens
    assert sum(x["time_share"] for x in d["sources"].values()) == pytest.approx(1.0)
    assert d["plain_steps"] == d["sources"].get("plain", {}).get("cycles", 0)


@pytest.mark.slow
def test_plain_decoding_with_the_partial_top_p_redoes_a_chained_step_and_stays_exact(tiny, monkeypatch):
    """Plain steps are chained (launched before the previous one is read, once the rows' first tokens are out); when
    the previous one is judged again with the full sort, the chained step that started from its old token is undone
    and launched again: the second and third tokens stay distributed as the target's."""
    monkeypatch.setattr(sampling, "CANDIDATES", 6)
    discarded = []
    relaunch = Engine._relaunch
    monkeypatch.setattr(Engine, "_relaunch", lambda self, f: discarded.append(1) or relaunch(self, f))
    target, _ = tiny
    sp = SamplingParams(temp=1.0, top_p=0.8)
    ids = list(target.tokenizer.encode("abcabcab"))
    eng = Engine(target.model, None, None, (), DecodeConfig(sampling=sp), 250)
    arr = np.array([o[:3] for o in run(eng, ids, N, 3)])
    _, p2, p3 = target_marginals(target, ids, sp, 3)
    assert discarded
    assert fit_two(arr[:, 1], arr[:, 2], p2, p3) == (True, True)


def test_a_long_backlog_is_fed_in_chunks_and_greedy_stays_identical(tiny):
    """With a tiny prefill step, the draft model catches up on what n-gram cycles committed in several chunks."""
    target, draft = tiny
    ids = list(target.tokenizer.encode("abcabcabcabc"))
    plain = run(Engine(target.model, None, None, (), DecodeConfig()), ids, max_tokens=60)
    drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "model": ModelDrafter(draft.model, prefill_step=3)})
    pol = AutoPolicy(["ngram", "model"], 4, Costs(1.0, {"ngram": 0.01, "model": 0.2}, accept={"model": [0.99, 9.0]}),
                     drafter.available_of)
    eng = Engine(target.model, drafter, pol, (), DecodeConfig())
    assert run(eng, ids, max_tokens=60) == plain
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
    assert docs[1]["auto"]["costs"]["step"] != 1.0  # seconds measured, not the prior's units
    assert "plain_steps:" in r.stderr.decode() or "source " in r.stderr.decode()
    r = cli("stats", "--by", "source", "--json")
    groups = json.loads(r.stdout)
    # (the tiny draft model is as large as the target, so it never pays: n-gram lookup and plain steps)
    assert "ngram" in groups and all(g["cycles"] > 0 for g in groups.values())
    assert sum(g["time_share"] for g in groups.values()) == pytest.approx(1.0)
    r = cli("stats", "--by", "source")
    assert r.returncode == 0 and "time share" in r.stdout.decode()  # (the table's headers are words)


def _settle_add_one(home):
    import os

    from mtpcli import runlog

    os.environ["XDG_DATA_HOME"] = home
    for _ in range(5):
        runlog.update_costs("k", lambda cur: {"n": (cur or {"n": 0})["n"] + 1})


@pytest.mark.slow
def test_concurrent_runs_settle_the_kept_table_one_after_another():
    import multiprocessing as mp
    import os

    from mtpcli import runlog

    home = os.environ["XDG_DATA_HOME"]
    runlog.update_costs("k", lambda cur: {"n": 0})
    with mp.get_context("spawn").Pool(6) as pool:
        pool.map(_settle_add_one, [home] * 6)
    assert runlog.load_costs("k") == {"n": 30}


def test_a_cold_run_whose_first_cycles_are_all_untimed_trees_still_rebases_once_it_has_timed_some():
    pol = AutoPolicy(["ngram"], 8, prior_costs(["ngram"], {}, gpu=True), lambda s, c, k: [[0.9] * k], rebase=32)
    for i in range(60):
        p = pol.plan([[1, 2, 3]])
        pol.update([p.width], [p.width], seconds=0.01 + 0.001 * p.width, source=p.source if p.width else None,
                   requested=[p.width], chances=[[0.9] * p.width], tree=i < 40 and p.width > 0)
        if i == 32:
            assert pol.rebase == 32 and pol.costs.step == 1.0  # nothing timed yet: the prior, the re-base pending
    assert pol.rebase == 0 and pol.costs.step == pytest.approx(0.01)  # decided by what it timed, as the next run
