"""A language model together with its KV cache and the number of tokens the cache holds."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from .errors import ModelError


class CachedLM:
    def __init__(self, model, role: str = "model", prefill_step: int = 512):
        self.model = model
        self.cache = make_prompt_cache(model)
        if not can_trim_prompt_cache(self.cache):
            kinds = sorted({type(c).__name__ for c in self.cache if not c.is_trimmable()})
            raise ModelError(
                f"the {role}'s cache ({', '.join(kinds)}) cannot be rolled back after a rejected draft; "
                "speculative decoding of recurrent/hybrid models is not supported yet (use --draft none)"
            )
        self.offset = 0
        self.prefill_step = prefill_step

    def prefill(self, tokens: list[int]) -> None:
        """Feed `tokens` into the cache in chunks, without keeping any logits."""
        for i in range(0, len(tokens), self.prefill_step):
            chunk = mx.array(tokens[i : i + self.prefill_step])[None]
            self.model(chunk, cache=self.cache)
            mx.eval([c.state for c in self.cache])
            self.offset += chunk.shape[1]

    def forward(self, tokens: mx.array) -> mx.array:
        """Append `tokens` (n,) to the cache and return their next-token logits, shape (1, n, V)."""
        logits = self.model(tokens.reshape(1, -1), cache=self.cache)
        self.offset += tokens.size
        return logits

    def rollback(self, keep: int) -> None:
        """Cut the cache back to its first `keep` tokens."""
        if keep < self.offset:
            trim_prompt_cache(self.cache, self.offset - keep)
            self.offset = keep
