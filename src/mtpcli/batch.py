"""Several sequences in one batch: a KV cache whose rows may hold holes, and a model wrapper around it.

Rows of a speculative batch accept different numbers of drafted tokens, but a forward pass writes the
same slots for every row. So slots are shared and each row keeps its own validity mask: a rejected
draft becomes a hole (masked out for that row from then on), and each row's RoPE position is the number
of valid tokens it holds, not the slot index, so holes never shift positions. Blocks may be left-padded
per row (a row with fewer new tokens); padding slots are holes too. A prompt is prefilled alone and
spliced in, right-aligned at the write slot. When holes outweigh tokens, `compact` squeezes them out.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from .errors import ModelError
from .lm import CachedLM, plain_kv_cache, use_bucketed

STEP = 256


class Layout:
    """Shared by every layer's cache: slot validity per row, valid-token counts, the write slot."""

    def __init__(self):
        self.valid = np.zeros((0, 0), bool)  # (B, write)
        self.pos = np.zeros(0, np.int64)  # valid tokens per row = the next RoPE position
        self.write = 0
        self.capacity = 0
        self.offset: mx.array | None = None  # RoPE offset per row for the block being fed
        self.mask: mx.array | None = None
        self._block: np.ndarray | None = None

    def begin(self, block_valid: np.ndarray, bucketed: bool) -> None:
        B, n = block_valid.shape
        W = self.write
        pads = np.where(block_valid.any(1), block_valid.argmax(1), n)  # left padding per row
        self.offset = mx.array(self.pos - pads, dtype=mx.int32)
        self.capacity = max(self.capacity, -(-(W + n) // STEP) * STEP) if bucketed else W + n
        span = self.capacity
        full = np.zeros((B, span), bool)
        full[:, :W] = self.valid
        full[:, W : W + n] = block_valid
        slot = np.arange(span)[None, None, :]
        own = W + np.arange(n)[None, :, None]
        mask = (full[:, None, :] & (slot <= own)) | (slot == own)  # every query sees itself: no empty rows
        self.mask = mx.array(mask[:, None])  # (B, 1, n, span)
        self._block = block_valid

    def end(self) -> None:
        self.valid = np.concatenate([self.valid, self._block], axis=1)
        self.pos = self.pos + self._block.sum(1)
        self.write += self._block.shape[1]
        self._block = None


class RaggedKVCache:
    """One layer's keys and values; positions, masks and the write slot come from the shared Layout."""

    def __init__(self, layout: Layout, bucketed: bool):
        self.layout, self.bucketed = layout, bucketed
        self.keys = self.values = None

    @property
    def offset(self):
        return self.layout.offset

    def _ensure(self, B, H, D, Dv, dtype, need: int) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        if need > have:
            grow = -(-(need - have) // STEP) * STEP
            zk, zv = mx.zeros((B, H, grow, D), dtype), mx.zeros((B, H, grow, Dv), dtype)
            self.keys = zk if self.keys is None else mx.concatenate([self.keys, zk], axis=2)
            self.values = zv if self.values is None else mx.concatenate([self.values, zv], axis=2)

    def update_and_fetch(self, keys, values):
        B, H, n, D = keys.shape
        W = self.layout.write
        self._ensure(B, H, D, values.shape[3], keys.dtype, max(W + n, self.layout.capacity))
        self.keys[..., W : W + n, :] = keys
        self.values[..., W : W + n, :] = values
        span = self.layout.capacity if self.bucketed else W + n
        return self.keys[..., :span, :], self.values[..., :span, :]

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        return self.layout.mask

    @property
    def state(self):
        return [] if self.keys is None else [self.keys, self.values]

    def is_trimmable(self) -> bool:
        return False


def require_plain_cache(model, role: str) -> int:
    """The model's layer count; refuses models with recurrent or windowed state (their rows cannot hold holes)."""
    cache = make_prompt_cache(model)
    if not plain_kv_cache(cache):
        raise ModelError(f"the {role} keeps recurrent or windowed state; batched decoding needs a plain KV "
                         "cache (use --batch-size 1)")
    return len(cache)


class BatchLM:
    """A model over B rows of ragged caches: splice prompts in, feed blocks, keep per-row prefixes."""

    def __init__(self, model, role: str = "model", prefill_step: int = 512, bucketed: bool | None = None):
        layers = require_plain_cache(model, role)
        self.model, self.role, self.prefill_step = model, role, prefill_step
        self.bucketed = use_bucketed(bucketed)
        self.layout = Layout()
        self.caches = [RaggedKVCache(self.layout, self.bucketed) for _ in range(layers)]

    @property
    def rows(self) -> int:
        return len(self.layout.pos)

    def add_rows(self, n: int) -> None:
        lay = self.layout
        lay.valid = np.concatenate([lay.valid, np.zeros((n, lay.write), bool)])
        lay.pos = np.concatenate([lay.pos, np.zeros(n, np.int64)])
        for c in self.caches:
            if c.keys is not None:
                c.keys = mx.concatenate([c.keys, mx.zeros((n,) + c.keys.shape[1:], c.keys.dtype)])
                c.values = mx.concatenate([c.values, mx.zeros((n,) + c.values.shape[1:], c.values.dtype)])

    def keep_rows(self, rows: list[int]) -> None:
        lay = self.layout
        lay.valid, lay.pos = lay.valid[rows], lay.pos[rows]
        idx = mx.array(rows, dtype=mx.int32)
        for c in self.caches:
            if c.keys is not None:
                c.keys, c.values = c.keys[idx], c.values[idx]

    def set_row(self, row: int, tokens: list[int]) -> None:
        """Prefill `tokens` alone and splice them into `row`, replacing whatever it held."""
        single = CachedLM(self.model, self.role, self.prefill_step, bucketed=False)
        single.prefill(tokens)
        L, lay = len(tokens), self.layout
        if L > lay.write:  # make room on the left for every row
            grow = L - lay.write
            lay.valid = np.concatenate([np.zeros((self.rows, grow), bool), lay.valid], axis=1)
            lay.write += grow
            lay.capacity += grow
            for c in self.caches:
                if c.keys is not None:
                    B, H, _, D = c.keys.shape
                    c.keys = mx.concatenate([mx.zeros((B, H, grow, D), c.keys.dtype), c.keys], axis=2)
                    c.values = mx.concatenate([mx.zeros((B, H, grow, c.values.shape[3]), c.values.dtype), c.values], axis=2)
        W = lay.write
        lay.valid[row] = False
        lay.valid[row, W - L : W] = True
        lay.pos[row] = L
        if L:
            for c, s in zip(self.caches, single.cache):
                k, v = s.keys[..., :L, :], s.values[..., :L, :]
                B = self.rows
                c._ensure(B, k.shape[1], k.shape[3], v.shape[3], k.dtype, W)
                c.keys[row : row + 1, :, W - L : W, :] = k
                c.values[row : row + 1, :, W - L : W, :] = v
            mx.eval([c.state for c in self.caches])

    def forward(self, tokens: mx.array, block_valid: np.ndarray | None = None) -> mx.array:
        """Feed a (B, n) block (left-padded rows where block_valid is False) and return logits (B, n, V)."""
        if block_valid is None:
            block_valid = np.ones(tokens.shape, bool)
        self.layout.begin(block_valid, self.bucketed)
        logits = self.model(tokens, cache=self.caches)
        self.layout.end()
        return logits

    def truncate(self, keep: np.ndarray) -> None:
        """Row b keeps its first keep[b] valid tokens; the rest become holes."""
        lay = self.layout
        for b in np.nonzero(lay.pos > keep)[0]:
            slots = np.nonzero(lay.valid[b])[0]
            lay.valid[b, slots[keep[b]:]] = False
        lay.pos = np.minimum(lay.pos, keep)
        self.compact()

    def compact(self, force: bool = False) -> None:
        """Squeeze the holes out (rows right-aligned) once they take more than half of the slots."""
        lay = self.layout
        width = int(lay.pos.max()) if self.rows else 0
        if not force and lay.write <= 2 * width + 64:
            return
        idx = np.zeros((self.rows, width), np.int64)
        valid = np.zeros((self.rows, width), bool)
        for b in range(self.rows):
            slots = np.nonzero(lay.valid[b])[0]
            if len(slots):
                idx[b, width - len(slots):] = slots
                valid[b, width - len(slots):] = True
        gather = mx.array(idx, dtype=mx.int32)
        for c in self.caches:
            if c.keys is None:
                continue
            B, H, _, D = c.keys.shape
            g = mx.broadcast_to(gather[:, None, :, None], (B, H, width, D))
            gv = mx.broadcast_to(gather[:, None, :, None], (B, H, width, c.values.shape[3]))
            c.keys = mx.take_along_axis(c.keys, g, axis=2)
            c.values = mx.take_along_axis(c.values, gv, axis=2)
        lay.valid, lay.write, lay.capacity = valid, width, 0
        mx.eval([c.state for c in self.caches])
