"""Issue 58: kept costs that do not swing a user's runs, and a verify pass concave in its width (the width's and a
tree's price alike); auto with both sources drafting and trees priced by that curve stays distributed as the target
(beside a negative control that must fail), and greedy auto is token-identical to --draft none."""

import mlx.core as mx
import numpy as np
import pytest

from mtpcli.costs import CostFit, Costs, prior_costs
from mtpcli.drafters import Draft
from mtpcli.drafters.auto import AutoDrafter
from mtpcli.policy import AutoPolicy
from mtpcli.sampling import SamplingParams
from stattools import fit_two

import helpers
from helpers import N, target_marginals
from test_auto import NO_MATCH, auto_engine, run


def test_the_prior_verify_pass_is_concave_as_measured_and_a_tree_node_costs_a_fraction_of_a_chain_token():
    prior = prior_costs(["ngram", "model"], {"model": 0.25}, gpu=False)
    for k, measured in ((1, 1.11), (4, 1.35), (8, 1.50)):  # this CPU's 1.5B: 2, 5, 9 tokens against one
        assert prior.time("ngram", k) == pytest.approx(measured, abs=0.04)
        assert prior.time("model", k) == pytest.approx(measured + 0.25 * k, abs=0.04)
    node = (prior.time("model", 6, 16) - prior.time("model", 6)) / 10  # ten nodes past a chain of 6
    assert 0.03 < node < 0.06  # (measured 4-5%; the linear prior priced one at 10%)


def test_the_verify_level_is_fitted_from_the_runs_lookup_cycles_where_there_are_enough():
    truth = Costs(0.2, {"ngram": 0.0, "model": 0.05}, {"model": 0.02}, verify=0.25)
    fit = CostFit(prior_costs(["ngram", "model"], {"model": 0.25}, gpu=False))
    helpers.timed(fit, truth, (9, 7))
    got = fit.result()
    assert got.verify == pytest.approx(0.25, rel=0.1)
    assert all(got.time(s, k) == pytest.approx(truth.time(s, k), rel=0.05) for s in ("ngram", "model")
               for k in (1, 4, 8))
    few = CostFit(prior_costs(["ngram"], {}, gpu=False))
    for t in (None, 0.2, 0.2, 0.2, 0.2, 0.3, 0.3, 0.3):  # (the first timed cycle, and the first at a width, left out)
        few.add(None if t != 0.3 else "ngram", 1 if t == 0.3 else 0, t)
    assert 0.11 < few.result().verify < 0.2  # two lookup cycles: the prior's shape still weighs most


def test_a_busy_run_neither_switches_the_model_off_for_the_next_run_nor_moves_a_figure_it_did_not_measure():
    """A first run's table (runs = 1, so it moves the furthest) on which the model pays at width 4; then one busy run
    whose model cycles took three times their share of a step: the next run still drafts with the model (the table
    moved at most a factor), and a run that drafted only lookup, with plain steps twice as fast, leaves the model's
    share of a step as it was (no probe of it, no move)."""
    kept = Costs(0.1, {"ngram": 0.0, "model": 0.02}, {"model": 0.0}, accept={"model": [0.8, 200.0]}, verify=0.1)

    def plan(costs):
        return AutoPolicy(["ngram", "model"], 8, costs, NO_MATCH, warm=True).plan([[0]])

    assert plan(kept).source == "model"
    busy = kept.settled(Costs(0.1, {"model": 0.1}, {"model": 0.1}, verify=0.1))  # (the old rule: half way, off)
    assert plan(busy).source == "model"
    assert busy.time("model", 4) / busy.step < 1.25 * kept.time("model", 4) / kept.step
    quick = kept.settled(Costs(0.05, {"ngram": 0.001}, verify=0.1))
    assert quick.per_token["model"] / quick.step == pytest.approx(kept.per_token["model"] / kept.step)
    assert helpers.source_width(plan(quick)) == helpers.source_width(plan(kept))


def test_a_run_without_plain_steps_takes_its_step_from_its_drafted_cycles_not_the_kept_seconds():
    """A warm run on a machine twice as slow that only drafts: every cycle took twice the table's; its table is the
    kept one scaled (not a model three times dearer than a step that did not slow down)."""
    kept = Costs(0.1, {"ngram": 0.0, "model": 0.02}, {"model": 0.01}, verify=0.1)
    fit = CostFit(kept, known=True)
    for k in (4, 4, 4, 6, 6, 6, 4, 6):
        fit.add("model", k, 2 * kept.time("model", k))
    got = fit.result()
    assert got.step == pytest.approx(0.2, rel=0.05)
    assert kept.settled(got) is kept  # as shares of a step it agrees: the next run decides the same




# a concave verify pass: a node past the chain at a few percent of a step, a drafted token cheap, so that both sources
# draft and trees are taken where they pay, chains elsewhere
CONCAVE = Costs(1.0, {"ngram": 0.0, "model": 0.05}, accept={"model": [0.6, 50.0]}, verify=0.06)


class CuttingDrafter(AutoDrafter):
    """NOT exact: a row's draft is dropped where its first drawn token is not the draft's most likely one (how wide
    a row drafts depends on the token it would draft)."""

    def propose(self, contexts, caps, sp, keys, plan=None):
        d = super().propose(contexts, caps, sp, keys, plan)
        if d.q is None or d.k == 0 or d.tree is not None:
            return d
        top = np.array(mx.argmax(d.q[:, 0], axis=-1)).tolist()
        first = np.array(d.tokens[:, 0]).tolist()
        lengths = [n if t == a else 0 for n, t, a in zip(d.lengths, first, top)]
        return Draft(d.tokens, d.q, lengths, d.requested, chances=None)


def sampled_pairs(tiny, sp, drafter_cls=AutoDrafter, nodes=8):
    target, _ = tiny
    ids = list(target.tokenizer.encode("abcabcabcabc"))
    eng = auto_engine(tiny, CONCAVE, sp, batch_size=250, drafter_cls=drafter_cls, nodes=nodes)
    arr = np.array([o[:2] for o in run(eng, ids, N, 3)])
    p1, p2 = target_marginals(target, ids, sp)
    return eng, *fit_two(arr[:, 0], arr[:, 1], p1, p2)


@pytest.mark.slow
@pytest.mark.parametrize("sp", [SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=20)], ids=str)
def test_auto_with_both_sources_and_trees_priced_by_the_concave_pass_is_distributed_as_the_target(tiny, sp):
    eng, first, second = sampled_pairs(tiny, sp)
    st = eng.stats.to_dict()
    assert all(s["drafted"] > 100 for name, s in st["sources"].items() if name != "plain")  # both drafted
    assert st["trees"]["cycles"] > 20  # trees were taken
    assert first and second


@pytest.mark.slow
def test_negative_control_a_width_that_depends_on_the_drawn_token_fails(tiny):
    _, first, second = sampled_pairs(tiny, SamplingParams(temp=1.0), CuttingDrafter, nodes=0)
    assert not (first and second)


@pytest.mark.parametrize("prompt", ["abcabcabcabc", "the sea is ", "def fib(n):"])
def test_auto_greedy_with_trees_and_the_concave_table_is_token_identical_to_plain_decoding(tiny, prompt):
    from mtpcli.drafters import NoDraft
    from mtpcli.controller import FixedWidth
    from mtpcli.engine import DecodeConfig, Engine

    target, _ = tiny
    ids = list(target.tokenizer.encode(prompt))
    plain = Engine(target.model, NoDraft(), FixedWidth(0), (), DecodeConfig())
    auto = auto_engine(tiny, CONCAVE, nodes=8)
    assert run(auto, ids, max_tokens=40) == run(plain, ids, max_tokens=40)
    assert auto.stats.drafted > 0


def test_the_cli_at_t0_under_auto_with_tree_auto_prints_what_draft_none_prints(cli, tiny_paths):
    """Twice (the second run decides with the table the first kept), against --draft none."""
    base = ("generate", "--model", tiny_paths["target"], "--max-tokens", 40, "--no-chat", "--temp", 0)
    plain = cli(*base, "--draft", "none", input=b"abcabcabcabc")
    assert plain.returncode == 0 and plain.stdout, plain.stderr.decode()
    for _ in range(2):
        r = cli(*base, "--draft", "auto", "--draft-model", tiny_paths["draft"], "--spec-tree", "auto",
                input=b"abcabcabcabc")
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout == plain.stdout
