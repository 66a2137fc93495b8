"""The slots of a model's attention layers over B rows (`Layout`, shared by every layer), each layer's keys and values
(`RowKV`) and a tree block's positions (`TreeRope`); how they roll back: cache.py's docstring. cache.LM drives them."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

STEP = 256


class Layout:
    """Shared by every attention layer: slot validity per row, valid-token counts, the write slot."""

    def __init__(self, rows: int = 0, bucketed: bool = False):
        self.valid = np.zeros((rows, 0), bool)  # (B, write)
        self.pos = np.zeros(rows, np.int64)  # valid tokens per row = the next RoPE position
        self.write = self.capacity = self.span = 0
        self.bucketed = bucketed
        self.dense = True  # every row valid in every slot < write: mlx-lm's own masks and an int offset
        self.offset: int | mx.array = 0
        self._block: np.ndarray | None = None
        self._tree = None
        self._masks: dict = {}

    def begin(self, n: int, block_valid: np.ndarray | None, tree=None) -> None:
        self._block = np.ones((len(self.pos), n), bool) if block_valid is None else block_valid
        self._tree = tree  # a tree block (tree.Shape): each node at its depth's position, seeing its ancestors
        self._block_dense = self.dense and bool(self._block.all())
        self.capacity = max(self.capacity, -(-(self.write + n) // STEP) * STEP) if self.bucketed else self.write + n
        # attended slots: the bucketed span, except for one dense token (a plain step), which attends over exactly
        # what is written and needs no mask, as in mlx-lm's own loop
        self.span = self.write + n if not self.bucketed or (self._block_dense and n == 1) else self.capacity
        if tree is not None:
            self.offset = mx.array(self.pos[:, None] + tree.depth, dtype=mx.int32)  # (B, n): TreeRope's
        elif self._block_dense:
            self.offset = self.write
        else:
            pads = np.where(self._block.any(1), self._block.argmax(1), n)  # left padding per row
            self.offset = mx.array(self.pos - pads, dtype=mx.int32)
        self._masks = {}

    def mask(self, window: int | None, return_array: bool):
        if (window, return_array) not in self._masks:
            self._masks[window, return_array] = self._make_mask(window, return_array)
        return self._masks[window, return_array]

    def _make_mask(self, window: int | None, return_array: bool):
        W, n, span = self.write, self._block.shape[1], self.span
        if self._tree is not None:
            return self._tree_mask(window)
        if self._block_dense:
            if span == W + n and (window is None or W + n <= window) and not return_array:
                return None if n == 1 else "causal"
            rinds = mx.arange(span)[None]  # causal over the span hides the unwritten slots too
            linds = mx.arange(W, W + n)[:, None]
            mask = linds >= rinds
            return mask & (linds < rinds + window) if window else mask
        full = np.zeros((len(self.pos), span), bool)
        full[:, :W] = self.valid
        full[:, W : W + n] = self._block
        slot = np.arange(span)[None, None, :]
        own = W + np.arange(n)[None, :, None]
        mask = full[:, None, :] & (slot <= own)
        if window:
            rank = np.cumsum(full, axis=1) - 1  # each slot's position in its row
            mine = rank[:, W : W + n]
            mask &= rank[:, None, :] > mine[:, :, None] - window
        mask |= slot == own  # every query sees itself: no empty rows (padding queries)
        return mx.array(mask[:, None])  # (B, 1, n, span)

    def _tree_mask(self, window: int | None) -> mx.array:
        """A tree block: each node sees the row's valid context and its own ancestors (itself included)."""
        W, n = self.write, self._block.shape[1]
        depth = self._tree.depth
        mask = np.zeros((len(self.pos), n, self.span), bool)
        mask[:, :, :W] = self.valid[:, None, :]
        mask[:, :, W : W + n] = self._tree.ancestors
        if window:
            rank, mine = np.cumsum(self.valid, axis=1) - 1, self.pos[:, None] + depth
            mask[:, :, :W] &= rank[:, None, :] > mine[:, :, None] - window
            mask[:, :, W : W + n] &= depth[:, :, None] - depth[:, None, :] < window
        return mx.array(mask[:, None])

    def end(self) -> None:
        self.valid = np.concatenate([self.valid, self._block], axis=1)
        self.pos = self.pos + self._block.sum(1)
        self.write += self._block.shape[1]
        self.dense = self._block_dense
        self._block, self._tree, self._masks = None, None, {}

    def truncate(self, keep: np.ndarray) -> None:
        """Row b keeps its first keep[b] valid tokens; the rest become holes, and slots no row holds any more
        are cut off the end."""
        if self.dense and (keep == keep[0]).all() and keep[0] <= self.write:
            self.valid, self.pos, self.write = self.valid[:, : keep[0]], np.minimum(self.pos, keep), int(keep[0])
            return
        for b in np.nonzero(self.pos > keep)[0]:
            slots = np.nonzero(self.valid[b])[0]
            self.valid[b, slots[keep[b]:]] = False
        self.pos = np.minimum(self.pos, keep)
        used = np.nonzero(self.valid.any(0))[0]
        self.write = int(used[-1]) + 1 if len(used) else 0
        self.valid = self.valid[:, : self.write]
        self.dense = bool(self.valid.all())


class RowKV:
    """One attention layer's keys and values; positions, masks and the write slot come from the shared Layout.
    `window`: the layer's sliding window (tokens a query sees, itself included), masked instead of rotated."""

    def __init__(self, layout: Layout, window: int | None = None):
        self.layout, self.window = layout, window
        self.keys = self.values = None

    @property
    def offset(self):
        return self.layout.offset

    def apply(self, fn) -> None:
        if self.keys is not None:
            self.keys, self.values = fn(self.keys), fn(self.values)

    def _ensure(self, B, H, D, Dv, dtype, need: int) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        if need > have:
            grow = -(-(need - have) // STEP) * STEP
            zk, zv = mx.zeros((B, H, grow, D), dtype), mx.zeros((B, H, grow, Dv), dtype)
            self.keys = zk if self.keys is None else mx.concatenate([self.keys, zk], axis=2)
            self.values = zv if self.values is None else mx.concatenate([self.values, zv], axis=2)

    def update_and_fetch(self, keys, values):
        B, H, n, D = keys.shape
        lay, W = self.layout, self.layout.write
        self._ensure(B, H, D, values.shape[3], keys.dtype, max(W + n, lay.capacity))
        self.keys[..., W : W + n, :] = keys
        self.values[..., W : W + n, :] = values
        return self.keys[..., : lay.span, :], self.values[..., : lay.span, :]

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        return self.layout.mask(window_size or self.window, return_array)

    @property
    def state(self):
        return [] if self.keys is None else [self.keys, self.values]


class TreeRope(nn.Module):
    """A layer's RoPE (whichever mlx-lm built) that also takes a (B, n) offset, one position per token: a tree's
    nodes each at their depth. Every token becomes a batch entry of its own, which mx.fast.rope offsets one by one."""

    def __init__(self, rope):
        super().__init__()
        self.inner = rope

    def __call__(self, x, offset=0, **kw):
        if not isinstance(offset, mx.array) or offset.ndim < 2:
            return self.inner(x, offset=offset, **kw)
        B, H, L, D = x.shape
        y = self.inner(x.transpose(0, 2, 1, 3).reshape(B * L, H, 1, D), offset=offset.reshape(-1), **kw)
        return y.reshape(B, L, H, D).transpose(0, 2, 1, 3)
