"""One cache layer for a model over B rows, that knows per layer kind how to roll back.

Attention layers (mlx-lm's KVCache, and RotatingKVCache with a sliding window) become `RowKV` layers over one
shared `Layout` (layout.py): slots are shared by every row, each row keeps its own validity mask and its RoPE position is its
count of valid tokens, so a rejected draft is cut off the end when every row wrote it last, and becomes a masked
hole otherwise. Sliding windows are masked, not rotated: a rollback never loses a token. While every row is dense
the masks are mlx-lm's own fast ones. Recurrent state (ArraysCache: gated-delta, Mamba) is snapshotted before a
speculative pass; a rollback restores it and replays the kept tokens (one row). Any other cache kind is kept as
the model made it: plain decoding of one row works, and speculation is refused before decoding (`require_rollback`)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from .errors import ModelError
from .layout import STEP, Layout, RowKV, TreeRope
from .tree import Shape

BUCKETED_DEFAULT: bool | None = None  # None: bucketed on MLX's CUDA backend only (benchmarks may set it)


def layer_kind(c) -> str:
    if type(c) is KVCache:
        return "kv"
    if type(c) is RotatingKVCache and c.keep == 0:
        return "window"
    if isinstance(c, ArraysCache):
        return "state"
    return "native"


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


def tap(model, layers: tuple[int, ...]) -> dict:
    """Make the model's layers at these indices leave their outputs in the dict returned (index -> the last
    output), by a subclass of each layer's own class: no model code, the same weights and attributes."""
    sink: dict = {}
    for i in set(layers):
        layer = model.layers[i]
        if not getattr(type(layer), "tapped", False):
            base = type(layer)

            def call(self, *args, _base=base, **kw):
                out = _base.__call__(self, *args, **kw)
                type(self).sink[self.tap_index] = out[0] if isinstance(out, tuple) else out
                return out

            layer.__class__ = type(base.__name__, (base,), {"__call__": call, "tapped": True, "sink": {}})
        object.__setattr__(layer, "tap_index", i)
        type(layer).sink = sink
    return sink


def in_chunks(feed, n: int, step: int, state, start: int = 0, leave: int = 0) -> int:
    """Feed positions start..n in chunks of `step` (`feed(i, j)`: positions i..j), each evaluated (`state()`: the
    arrays it leaves) before the next, while more than `leave` are left; returns where the rest starts."""
    while n - start > leave:
        end = min(start + step, n)
        feed(start, end)
        mx.eval(state())
        start = end
    return start


def tree_ropes(model, role: str, last_hidden: bool = False) -> list:
    """The modules holding the RoPEs of a model that verifies draft trees in one pass (verify.tree); refused before
    decoding where a layer cannot take one (recurrent state; `last_hidden`: its last layer's states handed on)."""
    if last_hidden or any(layer_kind(c) in ("state", "native") for c in make_prompt_cache(model)):
        raise ModelError(f"the {role} keeps recurrent state or hands on hidden states: a draft tree cannot be "
                         "verified in one pass of it (use --spec-tree off)")
    ropes = [m for _, m in model.named_modules() if isinstance(m.get("rope"), nn.Module)]
    if not ropes:
        raise ModelError(f"no RoPE found in the {role}: a draft tree needs one position per node (use --spec-tree off)")
    return ropes


class LM:
    """A model over B rows of caches: prefill a row (a repeated prompt is prefilled once), feed blocks, keep
    per-row prefixes (trim, holes, or snapshot + replay)."""

    def __init__(self, model, role: str = "model", prefill_step: int = 512, hidden: bool = False,
                 bucketed: bool | None = None, taps: tuple[int, ...] = (), trees: bool = False, shelf=None):
        """`trees`: it verifies draft trees (or refuses them here); `shelf`: its prefills kept (prefix.Shelf)."""
        self.model, self.role, self.prefill_step, self.shelf = model, role, prefill_step, shelf
        native = make_prompt_cache(model)
        self.kinds = [layer_kind(c) for c in native]
        self.windows = [c.max_size if k == "window" else None for k, c in zip(self.kinds, native)]
        # bucketed: attend over a multiple of STEP slots so attention shapes change once per STEP tokens: MLX's CUDA
        # backend specialises kernels on shapes and re-plans every cycle otherwise (docs/perf/gpu.md)
        bucketed = BUCKETED_DEFAULT if bucketed is None else bucketed
        if bucketed is None:
            bucketed = mx.default_device() == mx.gpu and not mx.metal.is_available()
        self.bucketed = bucketed and "native" not in self.kinds
        self.parts = split_model(model)
        if hidden and not taps and self.parts is None:
            raise ModelError(f"the {role}'s hidden states are not reachable (model type {type(model).__module__})")
        self.keep_hidden, self.taps = hidden or bool(taps), tuple(taps)
        self._tapped = tap(model, self.taps)
        self.hidden: mx.array | None = None  # (B, n, H) of the last forward, when keep_hidden: the last layer's
        #                                      output after the final norm, or the tapped layers' outputs, joined
        self.one_row = any(k in ("state", "native") for k in self.kinds)  # no holes, no splicing: one row
        self.layout, self.caches = self._fresh(0, self.bucketed)
        self._snap = None  # recurrent rows: (write, states) before the speculative tokens, and what was fed since
        self._fed: list[mx.array] = []
        self._prefix: tuple | None = None  # the last prefilled prompt: (tokens, layout, caches, hidden)
        self.reused = False  # the last set_row took its prompt from the previous prefill
        self.cached = 0  # tokens of the last prefill taken from the shelf
        self.trims = "state" not in self.kinds  # a kept state's first n tokens are its state at n (not recurrent)
        self._expected: dict | None = None  # what a kept state of this model holds (_fits)
        for m in tree_ropes(model, role, self.keep_hidden and not self.taps) if trees else ():
            if not isinstance(m["rope"], TreeRope):
                m.rope = TreeRope(m["rope"])

    def _fresh(self, rows: int, bucketed: bool):
        layout = Layout(rows, bucketed)
        return layout, [RowKV(layout, w) if k in ("kv", "window") else c
                        for k, w, c in zip(self.kinds, self.windows, make_prompt_cache(self.model))]

    @property
    def rows(self) -> int:
        return len(self.layout.pos)

    def require_rollback(self) -> None:
        if "native" in self.kinds:
            kinds = sorted({type(c).__name__ for k, c in zip(self.kinds, self.caches) if k == "native"})
            raise ModelError(f"the {self.role}'s cache ({', '.join(kinds)}) cannot be rolled back after a rejected "
                             "draft; speculative decoding of this model is not supported (use --draft none)")

    # ---- rows -------------------------------------------------------------------------------------------------
    def add_rows(self, n: int) -> None:
        if self.one_row and self.rows + n > 1:
            raise ModelError(f"the {self.role} keeps recurrent or opaque state: one row at a time")
        lay = self.layout
        lay.valid = np.concatenate([lay.valid, np.zeros((n, lay.write), bool)])
        lay.pos = np.concatenate([lay.pos, np.zeros(n, np.int64)])
        lay.dense = lay.write == 0
        for c in self._kv():
            c.apply(lambda a: mx.concatenate([a, mx.zeros((n,) + a.shape[1:], a.dtype)]))

    def keep_rows(self, rows: list[int]) -> None:
        if not rows:
            self.layout, self.caches = self._fresh(0, self.bucketed)
            return
        lay = self.layout
        lay.valid, lay.pos = lay.valid[rows], lay.pos[rows]
        lay.truncate(lay.pos.copy())  # drop the slots only the removed rows held
        idx = mx.array(rows, dtype=mx.int32)
        for c in self._kv():
            c.apply(lambda a: a[idx])
        self._tidy()  # the rows that held the leading slots may have left

    def states(self) -> list:
        """The caches' arrays (what `in_chunks` evaluates)."""
        return [getattr(c, "state", []) for c in self.caches]

    def _kv(self) -> list[RowKV]:
        return [c for c in self.caches if isinstance(c, RowKV)]

    def _prefill(self, tokens: list[int], keep: bool):
        """Prefill `tokens` into fresh one-row caches, in chunks, without the LM head; `keep` them for the next
        set_row of the same tokens (-n), else let them go (held twice, the prompt's cache would cost twice)."""
        self.reused = self._prefix is not None and self._prefix[0] == tuple(tokens)
        if self.reused:
            prefix, self._prefix, self.cached = self._prefix[1:], self._prefix if keep else None, 0
            return prefix
        layout, caches = self._fresh(1, False)
        hidden = []
        shelf = self.shelf if "native" not in self.kinds else None  # (opaque caches are not kept)
        self.cached = self._restore(tokens, layout, caches, hidden) if shelf else 0
        last = len(tokens) // self.prefill_step * self.prefill_step  # the last chunk boundary: kept for later runs
        self._aim()

        def feed(i, j):
            chunk = mx.array(tokens[i:j])[None]
            layout.begin(chunk.shape[1], None)
            h = self.parts[0](chunk, cache=caches) if self.parts else self.model(chunk, cache=caches)
            layout.end()
            if self.keep_hidden:
                hidden.append(self._kept(h))
            if shelf and j == last:
                shelf.keep(tokens[:last], self._state(caches, hidden, last), self.trims)

        in_chunks(feed, len(tokens), self.prefill_step,
                  lambda: [getattr(c, "state", []) for c in caches] + hidden[-1:], self.cached)
        hidden = mx.concatenate(hidden, axis=1) if hidden else None
        self._prefix = None
        if keep and "native" not in self.kinds:  # opaque caches cannot be shared: those rows prefill every time
            self._prefix = (tuple(tokens), layout, caches, hidden)
        return layout, caches, hidden

    def _state(self, caches: list, hidden: list, n: int) -> dict[str, mx.array]:
        """A one-row prefill's state at n tokens, by name: each attention layer's keys and values, each recurrent
        layer's arrays, the hidden states."""
        out = {}
        for i, (k, c) in enumerate(zip(self.kinds, caches)):
            if isinstance(c, RowKV) and c.keys is not None:
                out[f"{i}.keys"], out[f"{i}.values"] = c.keys[..., :n, :], c.values[..., :n, :]
            elif k == "state":
                out |= {f"{i}.state{j}": a for j, a in enumerate(c.cache) if a is not None}
        if hidden:
            out["hidden"] = mx.concatenate(hidden, axis=1)[:, :n]
        return out

    def kept(self, tokens: list[int]) -> int:
        """How many of `tokens` a prefill would take from the shelf (its files' headers only; 0 without one)."""
        if self.shelf is None or "native" in self.kinds:
            return 0
        found = self.shelf.candidates(tokens, self.prefill_step, self.trims)
        return found[0][0] if found else 0

    def warm(self, tokens: list[int]) -> None:
        """Prefill the whole chunks of `tokens` from the shelf's longest kept prefix, in caches of their own, keeping
        the last boundary's state (after a conversation's answer: the next turn resumes there, as a cold prefill)."""
        n = len(tokens) // self.prefill_step * self.prefill_step
        if self.shelf is not None and "native" not in self.kinds and n > self.kept(tokens[:n]):
            self._prefill(tokens[:n], keep=False)

    def _restore(self, tokens: list[int], layout: Layout, caches: list, hidden: list) -> int:
        """Put the longest kept state of a prefix of `tokens` into fresh one-row caches as a cold prefill leaves it
        (the keys' slots padded as RowKV grows them); returns its length (0: none)."""
        found = self.shelf.find(tokens, self.prefill_step, self.trims, self._fits)
        if found is None:
            return 0
        n, arrays = found
        slots = [(0, 0), (0, 0), (0, -n % STEP), (0, 0)]  # RowKV's slots: a multiple of STEP, zeros past the last
        for i, (k, c) in enumerate(zip(self.kinds, caches)):
            if isinstance(c, RowKV) and f"{i}.keys" in arrays:
                c.keys, c.values = (mx.pad(arrays[f"{i}.{x}"][..., :n, :], slots) for x in ("keys", "values"))
            elif k == "state":
                c.cache = [arrays.get(f"{i}.state{j}") for j in range(len(c.cache))]
        if "hidden" in arrays:
            hidden.append(arrays["hidden"][:, :n])
        layout.valid, layout.pos = np.ones((1, n), bool), np.array([n])
        layout.write = layout.capacity = n
        mx.eval([getattr(c, "state", []) for c in caches] + hidden)
        return n

    def _fits(self, n: int, arrays: dict[str, mx.array]) -> bool:
        """A kept state holds what this model's does, shape for shape (the token axis at least n long) and dtype for
        dtype: compared with the graph of a one-token prefill, built and never evaluated."""
        if self._expected is None:
            layout, caches = self._fresh(1, False)
            self._aim()
            layout.begin(1, None)
            x = mx.zeros((1, 1), mx.int32)
            h = self.parts[0](x, cache=caches) if self.parts else self.model(x, cache=caches)
            state = self._state(caches, [self._kept(h)] if self.keep_hidden else [], 1)
            self._expected = {k: (a.shape, a.dtype) for k, a in state.items()}

        def fits(name: str, a: mx.array) -> bool:
            shape, dtype = self._expected[name]
            grows = 1 if name == "hidden" else 2 if name.endswith(("keys", "values")) else None  # the token axis
            return a.dtype == dtype and a.ndim == len(shape) and all(
                s == e or (d == grows and s >= n) for d, (s, e) in enumerate(zip(a.shape, shape)))

        return arrays.keys() == self._expected.keys() and all(fits(k, a) for k, a in arrays.items())

    def set_row(self, row: int, tokens: list[int], keep: bool = False) -> mx.array | None:
        """Prefill `tokens` and put them in `row`, replacing whatever it held (`keep`: the next set_row will be the
        same tokens, prefill them once). Returns their hidden states (1, n, H) when this model keeps them."""
        layout, caches, hidden = self._prefill(tokens, keep)
        own = mx.array if self._prefix is not None else (lambda a: a)  # prefilled arrays kept: ours must be new
        L = len(tokens)
        self._snap, self._fed = None, []
        if self.rows == 1:  # the whole state is this row's: take the prefilled caches as they are
            self.layout.valid, self.layout.pos = np.ones((1, L), bool), np.array([L])
            self.layout.write, self.layout.capacity, self.layout.dense = L, 0, True
            for k, mine, pre in zip(self.kinds, self.caches, caches):
                if isinstance(mine, RowKV):
                    mine.keys, mine.values = pre.keys, pre.values
                    mine.apply(own)  # a new array: writes stay ours
                elif k == "state":
                    mine.cache = list(pre.cache)
            self.caches = [pre if k == "native" else mine for k, mine, pre in zip(self.kinds, self.caches, caches)]
            return hidden
        lay = self.layout
        if L > lay.write:  # make room on the left for every row
            grow = L - lay.write
            lay.valid = np.concatenate([np.zeros((self.rows, grow), bool), lay.valid], axis=1)
            lay.write, lay.capacity = L, lay.capacity + grow
            for c in self._kv():
                c.apply(lambda a: mx.concatenate([mx.zeros(a.shape[:2] + (grow, a.shape[3]), a.dtype), a], axis=2))
        W = lay.write
        lay.valid[row] = False
        lay.valid[row, W - L : W] = True
        lay.pos[row] = L
        lay.dense = bool(lay.valid.all())
        for c, s in zip(self._kv(), [c for c in caches if isinstance(c, RowKV)]):
            if L and s.keys is not None:
                k, v = s.keys[..., :L, :], s.values[..., :L, :]
                c._ensure(self.rows, k.shape[1], k.shape[3], v.shape[3], k.dtype, W)
                c.keys[row : row + 1, :, W - L : W, :] = k
                c.values[row : row + 1, :, W - L : W, :] = v
        mx.eval([c.state for c in self._kv()])
        self._tidy()  # plain steps never truncate: refills are where a long batch gets compacted
        return hidden

    # ---- decoding ---------------------------------------------------------------------------------------------
    def _run(self, tokens: mx.array, valid: np.ndarray | None, head: str, tree=None):
        """Feed a (B, n) block; head: "all" logits, "last" position's logits only, "none" (hidden states)."""
        self.layout.begin(tokens.shape[1], valid, tree)
        self._tree_n = tokens.shape[1] if tree is not None else 0
        self._aim()
        if self.parts and (head == "none" or (self.keep_hidden and not self.taps)):  # (the split head is the model's own logits
            h = self.parts[0](tokens, cache=self.caches)         # only for the MTP families: not gemma's)
            out = h if head == "none" else self.parts[1](h if head == "all" else h[:, -1:])
        else:
            h = out = self.model(tokens, cache=self.caches)
            out = out[:, -1:] if head == "last" else out
        if self.keep_hidden:
            self.hidden = self._kept(h)
        self.layout.end()
        if self._snap is not None:
            self._fed.append(tokens)
        return out

    def _aim(self) -> None:
        """The tapped layers leave their outputs with this LM (another may have tapped the same model since)."""
        for i in self.taps:
            type(self.model.layers[i]).sink = self._tapped
        self._tapped.clear()

    def _kept(self, h: mx.array) -> mx.array:
        if not self.taps:
            return h
        outs = [self._tapped.get(i) for i in self.taps]
        if any(o is None or o.shape[:-1] != h.shape[:-1] or o.ndim != 3 for o in outs):
            raise ModelError(f"the {self.role}'s layers {list(self.taps)} do not each give (rows, tokens, hidden) "
                             "states: a head cannot read them")
        return mx.concatenate(outs, axis=-1)

    def forward(self, tokens: mx.array, valid: np.ndarray | None = None, last: bool = False, tree=None) -> mx.array:
        """Append a (B, n) block (rows left-padded where `valid` is False; a tree's positions, tree.Shape, with
        `tree`) and return its next-token logits, (B, n, V), or (B, 1, V) for the last position only."""
        return self._run(tokens, valid, "last" if last else "all", tree)

    @property
    def pos(self) -> np.ndarray:
        return self.layout.pos

    def checkpoint(self) -> None:
        """Before speculative tokens: remember the recurrent state (no-op for attention-only models)."""
        if "state" in self.kinds:
            self._snap = (self.layout.write, [list(c.cache) if k == "state" else None
                                               for k, c in zip(self.kinds, self.caches)])
            self._fed = []

    def truncate(self, keep: np.ndarray) -> None:
        """Row b keeps its first keep[b] tokens."""
        keep = np.minimum(np.asarray(keep, np.int64), self.layout.pos)
        if (keep == self.layout.pos).all():
            return
        self.require_rollback()
        if "state" not in self.kinds:
            self.layout.truncate(keep)
            return self._tidy()
        if self._snap is None:
            raise ModelError(f"the {self.role} cannot roll back: no snapshot before the speculative tokens")
        at, states = self._snap
        for k, c, saved in zip(self.kinds, self.caches, states):
            if k == "state":
                c.cache = list(saved)
        fed = mx.concatenate(self._fed, axis=1) if self._fed else mx.zeros((1, 0), mx.int32)
        replay = fed[:, : int(keep[0]) - at]
        self.layout.truncate(np.array([at]))
        self._snap, self._fed = None, []
        if replay.shape[1]:
            self._run(replay, None, "none")

    def keep_path(self, before: np.ndarray, paths: list[list[int]]) -> None:
        """After a tree block of n positions: row b keeps its root and the nodes at positions paths[b], moved to
        follow it (their keys were made at their depth's position: they stay right where they land)."""
        n = self._tree_n
        at = self.layout.write - n
        if any(Shape.followed(p) < len(p) for p in paths):
            idx = np.tile(np.arange(n), (self.rows, 1))
            for b, p in enumerate(paths):
                idx[b, 1 : 1 + len(p)] = p
            g = mx.array(idx, dtype=mx.int32)[:, None, :, None]

            def move(a):
                block = a[..., at : at + n, :]
                a[..., at : at + n, :] = mx.take_along_axis(block, mx.broadcast_to(g, block.shape), axis=2)
                return a

            for c in self._kv():
                c.apply(move)
            if self.hidden is not None:  # the path's states follow the root's, as its keys do
                self.hidden = mx.take_along_axis(self.hidden, mx.array(idx, dtype=mx.int32)[..., None], axis=1)
        self.truncate(np.asarray(before) + np.array([len(p) for p in paths]) + 1)

    def _tidy(self) -> None:
        """Squeeze the holes out (rows right-aligned) once they take more than half of the slots, or no row holds the
        first slot any more."""
        lay = self.layout
        if lay.dense or not lay.write or (lay.write <= 2 * int(lay.pos.max()) + 64 and lay.valid[:, 0].any()):
            return
        width = int(lay.pos.max()) if self.rows else 0
        idx = np.zeros((self.rows, width), np.int64)
        valid = np.zeros((self.rows, width), bool)
        for b in range(self.rows):
            slots = np.nonzero(lay.valid[b])[0]
            idx[b, width - len(slots):] = slots
            valid[b, width - len(slots):] = True
        gather = mx.array(idx, dtype=mx.int32)[:, None, :, None]
        for c in self._kv():
            c.apply(lambda a: mx.take_along_axis(a, mx.broadcast_to(gather, a.shape[:2] + (width, a.shape[3])), axis=2))
        lay.valid, lay.write, lay.capacity, lay.dense = valid, width, 0, bool(valid.all())
        mx.eval([c.state for c in self._kv()])
