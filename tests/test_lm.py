"""The KV-cached model wrapper and its bucketed cache."""

import mlx.core as mx
import numpy as np

from mtpcli.lm import BucketedKVCache, CachedLM


def test_bucketed_cache_gives_the_same_logits_and_rolls_back(tiny):
    target, _ = tiny
    ids = list(target.tokenizer.encode("def fib(n):"))
    a, b = CachedLM(target.model, bucketed=False), CachedLM(target.model, bucketed=True)
    assert isinstance(b.cache[0], BucketedKVCache)
    BucketedKVCache.step = 8  # cross several bucket edges
    try:
        for lm in (a, b):
            lm.prefill(ids[:-1])
        for step in range(6):
            toks = mx.array([ids[-1], 5, 6, 7][: 1 + step % 4], dtype=mx.int32)
            la, lb = a.forward(toks), b.forward(toks)
            assert np.allclose(np.array(la), np.array(lb), atol=1e-4)
            keep = a.offset - step % 3
            a.rollback(keep)
            b.rollback(keep)
        assert b.cache[0].keys.shape[2] % 8 == 0
    finally:
        BucketedKVCache.step = 256


def test_a_cache_that_cannot_be_trimmed_is_one_clear_error():
    import pytest

    from mtpcli.errors import ModelError

    class Opaque:  # a state that can neither be trimmed nor snapshotted
        def is_trimmable(self):
            return False

    class Recurrent:
        layers = [0]

        def make_cache(self):
            return [Opaque()]

    lm = CachedLM(Recurrent(), role="target model")  # plain decoding of one completion never rolls back
    with pytest.raises(ModelError, match="cannot be rolled back.*--draft none"):
        lm.require_rollback()
    from mtpcli.drafters.ngram import NgramDrafter
    from mtpcli.engine import Engine

    with pytest.raises(ModelError, match="target model's cache"):
        Engine(Recurrent(), NgramDrafter())
