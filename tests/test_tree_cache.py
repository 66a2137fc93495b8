"""A draft tree through the cache layer (cache.LM with a tree block): each node's logits are those of its path
decoded plainly, on a full-attention and a sliding-window tiny target, one row and a ragged batch; after the verdict
the cache holds exactly the accepted path (the next step's logits equal plain decoding's)."""

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import models
from mtpcli.cache import LM
from mtpcli.errors import ModelError
from mtpcli.tree import Shape, merge

PROMPTS = [[3, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 1, 3], [4, 4, 6, 9, 1]]
CANDS = [[[5, 6, 7], [5, 8], [9, 1, 2], [9, 3]], [[2, 2], [7, 1, 1, 3]]]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    from tiny import make_hybrid_model, make_model, make_windowed_model

    root = tmp_path_factory.mktemp("tree")
    return {"full": models.load(str(make_model(root / "f"))).model,
            "window": models.load(str(make_windowed_model(root / "w"))).model,
            "hybrid": models.load(str(make_hybrid_model(root / "h"))).model}


def plain_logits(model, tokens):
    lm = LM(model)
    lm.add_rows(1)
    lm.set_row(0, tokens[:-1])
    return lm.forward(mx.array([tokens[-1:]]))[0, -1]


def trees(rows):
    built = [merge(CANDS[b], budget=9, width=3)[:2] for b in rows]
    n = max(len(t) for t, _ in built)
    tokens = np.array([t + [0] * (n - len(t)) for t, _ in built])
    parents = np.array([p + [-1] * (n - len(p)) for _, p in built])
    return tokens, Shape.of(parents)


@pytest.mark.parametrize("kind", ["full", "window"])
@pytest.mark.parametrize("rows", [[0], [0, 1]], ids=["one-row", "ragged-batch"])
def test_a_tree_pass_gives_each_node_its_paths_logits_and_keeps_only_the_accepted_path(targets, kind, rows):
    model = targets[kind]
    lm = LM(model, trees=True)
    lm.add_rows(len(rows))
    for b, r in enumerate(rows):
        lm.set_row(b, PROMPTS[r][:-1])
    tokens, shape = trees(rows)
    block = np.concatenate([[[PROMPTS[r][-1]] for r in rows], tokens], axis=1)
    before = lm.pos.copy()
    logits = lm.forward(mx.array(block), tree=shape)
    for b, r in enumerate(rows):
        for pos in range(int((shape.parents[b] >= 0).sum()) + 1):
            path = PROMPTS[r] + [int(tokens[b, j - 1]) for j in shape.path(b, pos)]
            assert np.allclose(np.array(logits[b, pos]), np.array(plain_logits(model, path)), atol=1e-4)
    # keep a path off the first-child chain in row 0 (and the chain in row 1)
    side = [p for p in range(1, tokens.shape[1] + 1) if shape.path(0, p)[0] != 1][0]
    paths = [shape.path(0, side)] + [shape.path(b, 1) for b in range(1, len(rows))]
    lm.keep_path(before, paths)
    nxt = [3, 9][: len(rows)]
    out = lm.forward(mx.array([[t] for t in nxt]))
    for b, r in enumerate(rows):
        kept = PROMPTS[r] + [int(tokens[b, j - 1]) for j in paths[b]] + [nxt[b]]
        assert int(lm.pos[b]) == len(kept)
        assert np.allclose(np.array(out[b, -1]), np.array(plain_logits(model, kept)), atol=1e-4)


def test_a_hybrid_target_refuses_trees_before_decoding(targets):
    with pytest.raises(ModelError, match="tree"):
        LM(targets["hybrid"], trees=True)
