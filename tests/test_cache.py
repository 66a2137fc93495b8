"""The cache layer: every layer kind rolls back, or speculation is refused before decoding."""

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import layout
from mtpcli.cache import LM
from mtpcli.errors import ModelError


def _logits(lm, rows, block, keep):
    out = lm.forward(mx.array(block, dtype=mx.int32))
    lm.truncate(lm.pos - keep)
    return np.array(out)


def test_bucketed_and_ragged_layouts_give_the_same_logits_and_roll_back(tiny, monkeypatch):
    """The dense one-row cache (mlx-lm's own masks), the bucketed one (CUDA layout, several STEP edges crossed)
    and a two-row batch with holes all compute the same logits through feeds and rollbacks."""
    target, _ = tiny
    ids = list(target.tokenizer.encode("def fib(n):"))
    monkeypatch.setattr(layout, "STEP", 8)
    lms = [LM(target.model, bucketed=False), LM(target.model, bucketed=True), LM(target.model, bucketed=False)]
    lms[0].add_rows(1), lms[1].add_rows(1), lms[2].add_rows(2)
    for lm in lms[:2]:
        lm.set_row(0, ids[:-1])
    lms[2].set_row(0, ids[:-1])
    lms[2].set_row(1, ids[:3])  # a shorter neighbour: left padding, then holes
    last = [ids[-1], ids[-1]]
    for step in range(8):
        block = [[last[0], 5, 6, 7][: 1 + step % 4]]
        cut = step % 3 if len(block[0]) > step % 3 else 0
        a = _logits(lms[0], 1, block, cut)
        b = _logits(lms[1], 1, block, cut)
        c = _logits(lms[2], 2, [block[0], block[0]], np.array([cut, 0]))
        assert np.allclose(a, b, atol=1e-4) and np.allclose(a, c[:1], atol=1e-4)
    assert not lms[2].layout.dense and lms[0].layout.dense
    assert lms[1].caches[0].keys.shape[2] % 8 == 0


def test_an_opaque_cache_decodes_plainly_and_refuses_speculation_before_decoding():
    class Opaque:  # a state that can neither be trimmed nor snapshotted
        def is_trimmable(self):
            return False

    class Model:
        layers = [0]

        def make_cache(self):
            return [Opaque()]

    lm = LM(Model(), role="target model")
    with pytest.raises(ModelError, match="cannot be rolled back.*--draft none"):
        lm.require_rollback()
    from mtpcli.drafters.ngram import NgramDrafter
    from mtpcli.engine import Engine

    with pytest.raises(ModelError, match="target model's cache"):
        Engine(Model(), NgramDrafter())
    assert Engine(Model()).batch_size == 1  # plain decoding is fine, one row at a time
