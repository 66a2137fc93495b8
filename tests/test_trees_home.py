"""Issue 55, items 1 and 2: trees are set when things are made (a source's tree.Spec, the target's tree RoPEs, the
kept prefills' shelves), the shape answers how far a tree or a path follows its first-child chain, and a plan is a
frozen record."""

import dataclasses

import mlx.nn as nn
import numpy as np
import pytest

from mtpcli import assemble, config, models, prefix
from mtpcli.controller import Plan
from mtpcli.layout import TreeRope
from mtpcli.tree import Shape, Spec, merge


def engine(tiny_paths, prefills=None, **flags):
    """assemble.engine over fresh copies of the tiny pair (a tree target's RoPEs are swapped in its model)."""
    target, draft = (models.load(str(tiny_paths[k])) for k in ("target", "draft"))
    cfg = config.settle(config.resolve(None, {"model": str(tiny_paths["target"]), "draft_model": str(tiny_paths["draft"]),
                                              **flags}, env={}), False)
    return assemble.engine(cfg, target, draft, prefills=prefills)


def ropes(model):
    return [m["rope"] for _, m in model.named_modules() if isinstance(m.get("rope"), nn.Module)]


def test_a_source_is_made_with_its_tree_spec_and_the_target_verifies_trees_from_the_start(tiny_paths):
    eng = engine(tiny_paths, tree="8", tree_children=3)
    assert {n: d.trees for n, d in eng.drafter.sources.items()} == {n: Spec(8, 3) for n in eng.drafter.sources}
    assert ropes(eng.target.model) and all(isinstance(r, TreeRope) for r in ropes(eng.target.model))
    priced = engine(tiny_paths, tree="auto").drafter.sources["model"].trees  # where it pays, by the prior's table
    assert priced.nodes == assemble.AUTO_TREE and priced.cost(4, 12) > priced.cost(4, 4) > 0
    off = engine(tiny_paths)
    assert all(d.trees is None for d in off.drafter.sources.values())
    assert not any(isinstance(r, TreeRope) for r in ropes(off.target.model))


def test_the_kept_prefills_shelves_are_given_when_the_models_are_made(tiny_paths):
    store = prefix.Store(64)
    eng = engine(tiny_paths, prefills=store, draft="model")
    assert eng.target.shelf is not None and eng.drafter.lm.shelf is not None
    assert engine(tiny_paths, draft="model").target.shelf is None


def test_the_shape_answers_how_far_a_tree_and_a_path_follow_the_first_child_chain():
    rng = np.random.default_rng(0)
    for _ in range(200):
        cands = [list(rng.integers(0, 3, rng.integers(1, 6))) for _ in range(rng.integers(1, 5))]
        _, parents, _ = merge(cands, 10, 3)
        shape = Shape.of(np.array([parents + [-1] * 2]))  # (padding nodes: parent -1)
        depth = shape.depth[0, 1:]
        assert shape.chain(0) == int(np.argmax(np.append(depth != np.arange(1, len(depth) + 1), True)))
        for node in range(len(parents) + 1):
            path = shape.path(0, node)
            assert shape.followed(path) == next((i for i, j in enumerate(path) if j != i + 1), len(path))
            assert (shape.followed(path) == len(path)) == (path == list(range(1, len(path) + 1)))


def test_a_plan_is_a_frozen_named_record():
    plan = Plan("model", 4)
    assert (plan.source, plan.width, plan.stop, plan.cost) == ("model", 4, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.stop = (0.1, 0.2, [])
