"""A language model together with its KV cache and the number of tokens the cache holds."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from .errors import ModelError


class BucketedKVCache(KVCache):
    """A KV cache whose attention always spans its whole buffer (a multiple of `step` slots), with a mask
    hiding the slots not yet written. Attention shapes then change once per `step` tokens instead of every
    cycle, so backends that specialise kernels on shapes (MLX's CUDA backend) stop re-planning each cycle."""

    def _capacity(self, need: int) -> int:
        have = 0 if self.keys is None else self.keys.shape[2]
        return max(have, -(-need // self.step) * self.step)

    def update_and_fetch(self, keys, values):
        prev, n = self.offset, keys.shape[2]
        cap = self._capacity(prev + n)
        if self.keys is None or cap > self.keys.shape[2]:
            B, H, _, dk = keys.shape
            have = 0 if self.keys is None else self.keys.shape[2]
            grow_k = mx.zeros((B, H, cap - have, dk), keys.dtype)
            grow_v = mx.zeros((B, H, cap - have, values.shape[3]), values.dtype)
            self.keys = grow_k if self.keys is None else mx.concatenate([self.keys, grow_k], axis=2)
            self.values = grow_v if self.values is None else mx.concatenate([self.values, grow_v], axis=2)
        self.offset = prev + n
        self.keys[..., prev : self.offset, :] = keys
        self.values[..., prev : self.offset, :] = values
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        cap = self._capacity(self.offset + n)
        rows = mx.arange(self.offset, self.offset + n)[:, None]
        return rows >= mx.arange(cap)[None]  # causal, and blind to the unwritten slots


def plain_kv_cache(cache) -> bool:
    return all(type(c) is KVCache for c in cache)


BUCKETED_DEFAULT: bool | None = None  # None: bucketed on MLX's CUDA backend only (benchmarks may set it)


def use_bucketed(bucketed: bool | None = None) -> bool:
    bucketed = BUCKETED_DEFAULT if bucketed is None else bucketed
    if bucketed is None:  # by default only where it pays: MLX's CUDA backend
        bucketed = mx.default_device() == mx.gpu and not mx.metal.is_available()
    return bucketed


def kv_caches(n: int, bucketed: bool | None = None) -> list[KVCache]:
    return [BucketedKVCache() if use_bucketed(bucketed) else KVCache() for _ in range(n)]


def split_model(model):
    """(inner, head): tokens -> post-norm hidden states, and hidden -> logits; None where the model's layout is
    not the usual `model.model` + `lm_head` (or tied embeddings). The inner model alone fills the cache exactly
    as the whole model does; head(inner(x)) equals the model's logits for the MTP families (not for gemma,
    whose head also scales and soft-caps)."""
    text = getattr(model, "language_model", model)
    inner = getattr(text, "model", None)
    if inner is None or not hasattr(inner, "embed_tokens"):
        return None
    head = getattr(text, "lm_head", None)
    return inner, head if head is not None else inner.embed_tokens.as_linear


class CachedLM:
    def __init__(self, model, role: str = "model", prefill_step: int = 512, bucketed: bool | None = None,
                 hidden: bool = False):
        self.model = model
        self.cache = make_prompt_cache(model)
        if use_bucketed(bucketed) and plain_kv_cache(self.cache):
            self.cache = [BucketedKVCache() for _ in self.cache]
        self.parts = split_model(model)
        if hidden and self.parts is None:
            raise ModelError(f"the {role}'s hidden states are not reachable (model type {type(model).__module__})")
        self.keep_hidden = hidden
        self.hidden: mx.array | None = None  # (1, n, H) of the last forward, when keep_hidden
        self.role = role
        self.trimmable = can_trim_prompt_cache(self.cache)
        # Recurrent state (gated-delta, Mamba: ArraysCache) cannot be cut back; it is snapshotted instead, and a
        # rollback restores the snapshot and replays the kept tokens through the model.
        self.snapshottable = all(c.is_trimmable() or isinstance(c, ArraysCache) for c in self.cache)
        self.offset = 0
        self._snaps: dict[int, list] = {}  # offset -> recurrent states at that offset
        self._fed: list[mx.array] = []  # tokens fed since the oldest snapshot, for replay
        self._fed_from = 0
        self.replayed_tokens = 0
        self.prefill_step = prefill_step

    def _feed(self, x: mx.array):
        """Run the model on x (1, n) without the LM head where it can (prefill and replay need no logits)."""
        return self.parts[0](x, cache=self.cache) if self.parts else self.model(x, cache=self.cache)

    def prefill(self, tokens: list[int]) -> mx.array | None:
        """Feed `tokens` into the cache in chunks, without computing logits. Returns their hidden states
        (1, n, H) when this model keeps them."""
        hidden = []
        for i in range(0, len(tokens), self.prefill_step):
            chunk = mx.array(tokens[i : i + self.prefill_step])[None]
            h = self._feed(chunk)
            if self.keep_hidden:
                hidden.append(h)
            mx.eval([c.state for c in self.cache] + hidden[-1:])
            self.offset += chunk.shape[1]
        return mx.concatenate(hidden, axis=1) if self.keep_hidden and hidden else None

    def forward(self, tokens: mx.array) -> mx.array:
        """Append `tokens` (n,) to the cache and return their next-token logits, shape (1, n, V)."""
        if self.keep_hidden:
            self.hidden = self.parts[0](tokens.reshape(1, -1), cache=self.cache)
            logits = self.parts[1](self.hidden)
        else:
            logits = self.model(tokens.reshape(1, -1), cache=self.cache)
        self.offset += tokens.size
        if self._snaps:
            self._fed.append(tokens.reshape(-1))
        return logits

    def require_rollback(self) -> None:
        if not (self.trimmable or self.snapshottable):
            kinds = sorted({type(c).__name__ for c in self.cache if not c.is_trimmable()})
            raise ModelError(
                f"the {self.role}'s cache ({', '.join(kinds)}) cannot be rolled back after a rejected draft; "
                "speculative decoding and -n > 1 of this model are not supported (use --draft none)"
            )

    def mark(self, base: bool = False) -> None:
        """Remember the recurrent state at the current offset (no-op for trimmable caches). A base mark
        (after the prompt) stays until the next base mark; any other mark replaces the previous one."""
        if self.trimmable:
            return
        state = [list(c.cache) if isinstance(c, ArraysCache) else None for c in self.cache]
        if base or not self._snaps:
            self._snaps, self._fed, self._fed_from = {self.offset: state}, [], self.offset
        else:
            first = min(self._snaps)
            self._snaps = {first: self._snaps[first], self.offset: state}

    def _replay_to(self, keep: int) -> None:
        self.require_rollback()
        at = max((o for o in self._snaps if o <= keep), default=None)
        if at is None:
            raise ModelError(f"the {self.role} cannot roll back to {keep} tokens: no snapshot at or before it")
        for c, saved in zip(self.cache, self._snaps[at]):
            if saved is not None:
                c.cache = list(saved)
            elif c.is_trimmable():
                c.trim(self.offset - at)
        fed = mx.concatenate(self._fed) if self._fed else mx.zeros((0,), mx.int32)
        replay = fed[at - self._fed_from : keep - self._fed_from]
        self._fed = [fed[: keep - self._fed_from]]
        self.offset = at
        if replay.size:
            self._feed(replay.reshape(1, -1))
            self.offset += replay.size
            self.replayed_tokens += replay.size

    def rollback(self, keep: int) -> None:
        """Cut the cache back to its first `keep` tokens."""
        if keep < self.offset and not self.trimmable:
            self._replay_to(keep)
            return
        if keep < self.offset:
            self.require_rollback()
            trim_prompt_cache(self.cache, self.offset - keep)
            self.offset = keep
