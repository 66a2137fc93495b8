"""Draft trees through the engine (issue 34): greedy identity with --draft none (full-attention and sliding-window
targets, one row and a ragged batch; a hybrid target keeps chains), and the first and second committed tokens
distributed as the target's at T = 1 and T = 0.7 with top-k, for deterministic (n-gram) and sampled (draft model)
candidates, beside a negative control that must fail."""

import types

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import assemble, models, verify
from mtpcli.controller import FixedWidth, Plan
from mtpcli.drafters import NoDraft
from mtpcli.stop import passes
from mtpcli.drafters import trees
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.errors import ModelError
from mtpcli.sampling import SamplingParams
from mtpcli.tree import Spec
from stattools import fits

import helpers
from helpers import N, target_marginals

PROMPTS = ["abxabyabzab", "def fib(n):", "the sea is "]


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    from tiny import make_hybrid_model, make_windowed_model

    root = tmp_path_factory.mktemp("treeeng")
    return models.load(str(make_windowed_model(root / "w"))), models.load(str(make_hybrid_model(root / "h")))


def engine(target, drafter, width=4, batch_size=1, **cfg):
    """An engine over `drafter`, whose target verifies trees where the drafter drafts them."""
    return Engine(target.model, drafter, FixedWidth(width if drafter.speculates else 0), (), DecodeConfig(**cfg),
                  batch_size, trees=getattr(drafter, "trees", None) is not None)


def run(eng, tok, prompts, n=1, max_tokens=40, seed=0):
    return helpers.run(eng, [Request(i, list(tok.encode(p)), max_tokens, seed, c) for i, (p, c) in
                             enumerate((p, c) for p in prompts for c in range(n))])


def tree(nodes=8, cost=None):
    return Spec(nodes, 3, cost)


def costed(nodes=8):
    """tree = auto's decision, under a cost where a node past the chain costs a fifth of a drafted token."""
    return tree(nodes, lambda k, n: 1.0 + 0.1 * k + 0.02 * (n - k))


def drafters(draft):
    return {"ngram": lambda: NgramDrafter(1, 3, tree()), "model": lambda: ModelDrafter(draft.model, trees=tree()),
            "model-auto": lambda: ModelDrafter(draft.model, trees=costed()),
            "ngram-auto": lambda: NgramDrafter(1, 3, costed())}


@pytest.mark.parametrize("kind", ["full", "window"])
@pytest.mark.parametrize("source", ["ngram", "model"])
def test_greedy_tree_decoding_equals_plain_decoding_one_row_and_a_ragged_batch(tiny, window, kind, source):
    target = tiny[0] if kind == "full" else window[0]
    tok = target.tokenizer
    plain = run(engine(target, NoDraft()), tok, PROMPTS)
    for batch in (1, 3):
        eng = engine(target, drafters(tiny[1])[source](), batch_size=batch)
        assert run(eng, tok, PROMPTS) == plain
        trees = eng.stats.to_dict()["trees"]
        assert trees["cycles"] > 0 and trees["nodes_per_cycle"] > 1


def test_a_tree_takes_later_children_and_commits_more_per_cycle_on_branching_text(tiny):
    target, draft = tiny
    eng = engine(target, ModelDrafter(draft.model, trees=tree(12)))
    run(eng, target.tokenizer, PROMPTS, max_tokens=60)
    assert eng.stats.to_dict()["trees"]["side_paths"] > 0


def test_a_hybrid_target_keeps_chains_under_auto_and_refuses_a_budget(tiny, window):
    target = window[1]
    for tree, refused in (("auto", False), ("8", True)):
        cfg = types.SimpleNamespace(tree=tree, tree_children=3, draft="ngram")
        if refused:
            with pytest.raises(ModelError, match="tree"):
                assemble.verifies_trees(cfg, target)
        else:
            assert not assemble.verifies_trees(cfg, target)
            plain = run(engine(target, NoDraft()), target.tokenizer, PROMPTS[:1])
            assert run(engine(target, NgramDrafter(1, 3)), target.tokenizer, PROMPTS[:1]) == plain


CASES = [SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=8)]


@pytest.mark.slow
@pytest.mark.parametrize("source, sp", [(s, sp) for s in ("ngram", "model") for sp in CASES] +
                         [("model-auto", CASES[0])], ids=str)
def test_tree_decoding_commits_the_targets_distribution_at_the_first_and_second_token(tiny, sp, source):
    target, draft = tiny
    prompt = PROMPTS[0]
    ids = list(target.tokenizer.encode(prompt))
    p1, p2 = target_marginals(target, ids, sp)
    eng = engine(target, drafters(draft)[source](), batch_size=250, sampling=sp)
    outs = run(eng, target.tokenizer, [prompt], n=N, max_tokens=3)  # trees two deep: both tokens from one tree
    trees = eng.stats.to_dict()["trees"]
    assert trees["cycles"] > 0 and trees["side_paths"] > 0  # trees were verified, and later children taken
    c1, c2 = (np.bincount([o[i] for o in outs], minlength=len(p1)) for i in (0, 1))
    assert fits(c1, p1) and fits(c2, p2)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["model"])
def test_a_tree_law_that_tests_later_children_against_p_instead_of_the_residual_fails(tiny, monkeypatch, source):
    """The negative control: each child tried, and the last token drawn, against p itself (not what is left of it
    once the children before were refused)."""
    target, draft = tiny
    sp = CASES[0]
    ids = list(target.tokenizer.encode(PROMPTS[0]))
    p1, _ = target_marginals(target, ids, sp)
    monkeypatch.setattr(verify, "residual", lambda p, q, d: p)
    eng = engine(target, drafters(draft)[source](), batch_size=250, sampling=sp)
    outs = run(eng, target.tokenizer, [PROMPTS[0]], n=N, max_tokens=2)
    assert not fits(np.bincount([o[0] for o in outs], minlength=len(p1)), p1)


def test_auto_trees_where_siblings_are_likely_enough_to_pay_for_their_verification():
    from mtpcli.tree import expected, pays

    assert expected([0, 1, 0], [0.5, 0.5, 0.4]) == pytest.approx(0.5 + 0.25 + 0.4)
    assert expected([0, 0], [0.8, 0.8]) == pytest.approx(1.0)  # one sibling at most is taken
    cheap, dear = (lambda k, n: 1.0 + 0.1 * k + 0.01 * (n - k)), (lambda k, n: 1.0 + 0.1 * k + 0.5 * (n - k))
    tree = [([0, 1, 0], [0.5, 0.5, 0.4])]
    assert pays(tree, [2], cheap) and not pays(tree, [2], dear)


def test_auto_drafts_the_chain_it_would_have_drafted_where_a_tree_does_not_pay():
    d = NgramDrafter(1, 3, Spec(6, 3, lambda k, n: 1.0 + 0.1 * k + 5.0 * (n - k)))  # a node past the chain: dear
    ctxs = [[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2], [7, 8, 7, 9, 7], [1, 2, 3], [4, 4, 4, 4]]  # branching, one, none
    d.add_rows(len(ctxs))
    for b, c in enumerate(ctxs):
        d.start(b, c)
    assert len(d.looks(0, ctxs[0], 4, 6)) == 3  # three earlier occurrences: a tree is there to be had
    for caps in ([4, 3, 2, 0], [2, 0, 4, 5]):
        got = trees.lookup(d, ctxs, caps, None)
        want = trees.as_chain([d.look(b, c, k) if k else ([], []) for b, (c, k) in enumerate(zip(ctxs, caps))])
        assert got.tree is None and got.tokens.tolist() == want.tokens.tolist()
        assert (got.lengths, got.requested, got.chances) == (want.lengths, want.requested, want.chances)
    assert trees.lookup(d, ctxs, [7, 1, 1, 1], None) is None  # a cap past the budget: the chain is the longer
    cheap = Plan("ngram", 4, cost=lambda k, n: 1.0 + 0.1 * k + 0.001 * (n - k))  # auto's table, nodes cheap: the tree
    assert trees.lookup(d, ctxs, [4, 3, 2, 0], cheap).tree is not None


@pytest.mark.parametrize("sp", [SamplingParams(temp=0.0), SamplingParams(temp=1.0, top_k=6)])
def test_a_model_trees_decision_sees_the_shape_and_chances_of_the_tree_it_would_draw(sp, monkeypatch):
    """tree = auto decides before drawing any sibling: the (parents, chances) it weighs are those of the tree drawn
    when it pays (each sibling at T = 0 with its draft probability, at T > 0 the sum of q^2 / q of what it is drawn
    from), and a tree that does not pay costs no sibling's draw."""
    from mtpcli.drafters import Draft

    mx.random.seed(3)
    q = mx.softmax(2.0 * mx.random.normal((2, 3, 16)), axis=-1)
    chain = Draft(mx.argmax(q, axis=-1).astype(mx.int32), q, [3, 2], [3, 2], None)
    spec = Spec(7, 3, lambda k, n: 1.0)
    weighed = []
    monkeypatch.setattr(trees, "pays", lambda trees, chain, cost: weighed.append(trees) or True)
    keys = [mx.random.key(1), mx.random.key(2)]
    got = trees.siblings(chain, sp, keys, spec, spec.cost)
    for b, (parents, chances) in enumerate(weighed[0]):
        n = got.lengths[b]
        assert parents == got.tree.parents[b][:n].tolist()
        toks, conf = got.tokens[b].tolist(), q[b].max(axis=-1).tolist()
        depth = [0] * n
        for i, par in enumerate(parents):
            depth[i] = 0 if par == 0 else depth[par - 1] + 1
        for i in range(n):
            chain_token = toks[i] == chain.tokens[b, depth[i]].item()
            if chain_token:
                assert chances[i] == pytest.approx(passes(conf[depth[i]], sp.greedy))
            elif sp.greedy:
                assert chances[i] == pytest.approx(q[b, depth[i], toks[i]].item())
            else:
                rest = mx.where(mx.arange(16) == chain.tokens[b, depth[i]], 0.0, q[b, depth[i]])
                assert chances[i] == pytest.approx(((rest * rest).sum() / rest.sum()).item())
        assert n > chain.lengths[b]  # siblings were drawn: the budget had room
    monkeypatch.setattr(trees, "pays", lambda trees, chain, cost: False)
    monkeypatch.setattr(mx.random, "gumbel", lambda *a, **k: pytest.fail("a sibling drawn for a tree not taken"))
    assert trees.siblings(chain, sp, keys, spec, spec.cost).tree is None


def test_greedy_auto_trees_equal_plain_decoding(tiny):
    target = tiny[0]
    plain = run(engine(target, NoDraft()), target.tokenizer, PROMPTS)
    for source in ("ngram-auto", "model-auto"):
        eng = engine(target, drafters(tiny[1])[source](), batch_size=3)
        assert run(eng, target.tokenizer, PROMPTS) == plain


def history_drafter(target, prompt, seeds=6):
    """A history of earlier answers to the prompt at T = 1: several continuations per suffix (a tree's branches)."""
    from mtpcli.drafters.history import HistoryDrafter
    from mtpcli.history import Doc, Store

    ids = list(target.tokenizer.encode(prompt))
    outs = [run(engine(target, NoDraft(), sampling=SamplingParams(temp=1.0)), target.tokenizer,
                [prompt], max_tokens=12, seed=s)[0] for s in range(seeds)]
    store = Store("t")
    store.docs = [Doc(np.array(o, np.int64), np.array(ids, np.int64)) for o in outs]
    return HistoryDrafter(store, trees=tree())


@pytest.mark.slow
def test_history_trees_greedy_identity_and_the_targets_distribution(tiny):
    target = tiny[0]
    plain = run(engine(target, NoDraft()), target.tokenizer, PROMPTS[:1])
    eng = engine(target, history_drafter(target, PROMPTS[0]))
    assert run(eng, target.tokenizer, PROMPTS[:1]) == plain
    sp = CASES[0]
    ids = list(target.tokenizer.encode(PROMPTS[0]))
    p1, p2 = target_marginals(target, ids, sp)
    eng = engine(target, history_drafter(target, PROMPTS[0]), batch_size=250, sampling=sp)
    outs = run(eng, target.tokenizer, [PROMPTS[0]], n=N, max_tokens=2)
    trees = eng.stats.to_dict()["trees"]
    assert trees["cycles"] > 0 and trees["side_paths"] > 0
    c1, c2 = (np.bincount([o[i] for o in outs], minlength=len(p1)) for i in (0, 1))
    assert fits(c1, p1) and fits(c2, p2)


def test_the_cli_reports_trees_and_refuses_them_where_they_cannot_be_exact(cli, tiny_paths, tmp_path):
    import json

    from test_cli import one_line_error

    sj = tmp_path / "s.json"
    base = ("generate", "--model", tiny_paths["target"], "--draft-model", tiny_paths["draft"], "--max-tokens", 24)
    r = cli(*base, "--spec-tree", "8", "--stats-json", sj, input=b"abxabyabzab")
    assert r.returncode == 0, r.stderr.decode()
    plain = cli("generate", "--model", tiny_paths["target"], "--max-tokens", 24, "--draft", "none",
                input=b"abxabyabzab")  # (--draft none with --draft-model is refused)
    assert r.stdout == plain.stdout  # greedy: the same text
    trees = json.loads(sj.read_text())["trees"]
    assert trees["cycles"] > 0 and trees["nodes_per_cycle"] > 1
    assert json.loads(sj.read_text())["settings"]["tree"] == "8"
    assert "trees:" in r.stderr.decode()  # the statistics table's row
    for bad, needle in ((("--spec-tree", "8", "--typical-threshold", "0.1"), "--spec-tree"),
                        (("--spec-tree", "1"), "--spec-tree"), (("--spec-tree", "wide"), "--spec-tree")):
        r = cli(*base, *bad, input=b"abc")
        assert r.returncode == 2
        one_line_error(r, needle)


def test_a_budget_below_the_width_cuts_the_chain_to_it_and_auto_weighs_it(tiny):
    target, draft = tiny
    plain = run(engine(target, NoDraft()), target.tokenizer, PROMPTS)
    for make in (lambda: ModelDrafter(draft.model, trees=tree(4)), lambda: ModelDrafter(draft.model, trees=costed(4)),
                 lambda: NgramDrafter(1, 3, costed(4)), lambda: NgramDrafter(1, 3, tree(4))):
        d = make()
        eng = engine(target, d, width=8)
        assert run(eng, target.tokenizer, PROMPTS) == plain
        if d.trees.cost is None:  # (under auto a lookup chain keeps its width where its tree does not pay)
            assert max(int(k) for k in eng.stats.to_dict()["draft_width_hist"]) <= 4
        trees = eng.stats.to_dict().get("trees")
        assert trees is None or trees["chain_cycles"] >= 0
