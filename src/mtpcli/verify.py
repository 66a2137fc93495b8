"""Acceptance laws: pure functions from probability (or logit) arrays to a verdict.

Every law takes the target rows for the k drafted positions plus the bonus position, shapes
(B, k+1, V), and the drafted tokens (B, k). It returns how many leading drafts are accepted
(B,) and the one token that follows them (B,): a resample at the first rejected position, or the
bonus token when all k pass. Everything stays on the device; the caller synchronises once.

Rows of a batch may draft fewer than k tokens: `lengths` (B,) marks the real drafts, the rest are padding,
never accepted; a row whose real drafts all pass gets its bonus token from p at position lengths[b]. `key`
is one key, or a list of B keys (one per row, so a row's draws depend on its own key only; a row draws
exactly what it would draw alone with k = lengths[b]). The cycle's words (a glossary): docs/glossary.md."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .sampling import SamplingParams, sample, shaped
from .tree import Shape


@dataclass
class Verdict:
    n_accepted: mx.array  # (B,) int32: length of the accepted prefix
    token: mx.array  # (B,) int32: resampled token at position n_accepted (or the bonus token)
    entropy: mx.array | None = None  # typical law: H(p) per position, (B, k+1)
    floor: mx.array | None = None  # typical law: acceptance floor per position, (B, k+1)
    node: mx.array | None = None  # tree law: (B,) the position the accepted path ends at


def _prefix_length(accept: mx.array) -> mx.array:
    return mx.cumprod(accept.astype(mx.int32), axis=-1).sum(axis=-1)


def _at(values: mx.array, index: mx.array) -> mx.array:
    """values (B, n, ...) indexed at position index (B,) along axis 1."""
    index = index.reshape(index.shape + (1,) * (values.ndim - 1))
    return mx.take_along_axis(values, index, axis=1).squeeze(1)


def _prob_of(p: mx.array, tokens: mx.array) -> mx.array:
    return mx.take_along_axis(p, tokens[..., None], axis=-1).squeeze(-1)


def _real(draft: mx.array, lengths: list[int] | None) -> mx.array:
    """(B, k) True at real (not padding) draft positions."""
    if lengths is None:
        return mx.ones(draft.shape, mx.bool_)
    return mx.arange(draft.shape[-1])[None] < mx.array(lengths)[:, None]


def _sample_rows(rows: mx.array, keys) -> mx.array:
    if not isinstance(keys, list):
        return sample(rows, keys)
    return mx.concatenate([sample(rows[b : b + 1], key) for b, key in enumerate(keys)])


def _uniforms(key, shape: tuple, lengths: list[int] | None) -> tuple[mx.array, object]:
    """(B, k) uniforms for the accept tests and the key(s) of the final draw; per row with its own key (padded)."""
    if not isinstance(key, list):
        k_accept, k_sample = mx.random.split(key)
        return mx.random.uniform(shape=shape, key=k_accept), k_sample
    split = [mx.random.split(kk) for kk in key]  # per row: uniforms of its own length with its own key, padded
    u = [mx.random.uniform(shape=(1, n), key=a) for (a, _), n in zip(split, lengths or [shape[1]] * len(key))]
    u = mx.concatenate([mx.pad(r, [(0, 0), (0, shape[1] - r.shape[1])], constant_values=2.0) for r in u])
    return u, [b for _, b in split]


def greedy(target_logits: mx.array, draft: mx.array, lengths: list[int] | None = None) -> Verdict:
    """T = 0: accept while the draft equals the target's argmax; the next token is the argmax."""
    best = mx.argmax(target_logits, axis=-1)  # (B, k+1)
    n = _prefix_length((draft == best[:, : draft.shape[-1]]) & _real(draft, lengths))
    return Verdict(n, _at(best, n))


def residual(p: mx.array, q: mx.array | None, draft: mx.array) -> mx.array:
    """Normalised (p - q)+ per drafted position. q None means a deterministic (one-hot) draft."""
    r = mx.where(mx.arange(p.shape[-1]) == draft[..., None], 0.0, p) if q is None else mx.maximum(p - q, 0.0)
    mass = r.sum(axis=-1, keepdims=True)
    # Zero mass only when p == q, where a rejection has probability 0: fall back to p.
    return mx.where(mass > 0, r / mx.where(mass > 0, mass, 1.0), p)


def exact(p: mx.array, q: mx.array | None, draft: mx.array, key, lengths: list[int] | None = None) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): output ~ p exactly.

    Draft token x at position i is accepted with probability min(1, p_i(x) / q_i(x)); the first rejection resamples
    from normalised (p_i - q_i)+ and ends the block; if all pass, the bonus token is drawn from p_k."""
    k = draft.shape[-1]
    u, k_sample = _uniforms(key, draft.shape, lengths)
    real = _real(draft, lengths)
    pd = _prob_of(p[:, :k], draft)
    qd = 1.0 if q is None else _prob_of(q, draft)
    n = _prefix_length((u * qd < pd) & real)
    res = mx.where(real[..., None], residual(p[:, :k], q, draft), p[:, :k])  # padding: no draft, so p itself
    rows = mx.concatenate([res, p[:, k:]], axis=1)
    return Verdict(n, _sample_rows(_at(rows, n), k_sample))


def tree(p: mx.array, q: mx.array | None, draft: mx.array, shape: Shape, key, lengths: list[int] | None = None,
         greedy: bool = False) -> Verdict:
    """A tree of drafts (tree.py), p (B, N+1, V) at its positions: multi-step speculative sampling (SpecInfer, Miao
    et al. 2024, s4.2), without replacement where a source draws siblings so (Jeon et al. 2024, recursive
    speculative decoding). At a reached position the children are tried in order: child c, drawn from its proposal
    r_c (q at c; one-hot for a deterministic candidate), is taken with probability min(1, p'(c) / r_c(c)), else p'
    becomes normalised (p' - r_c)+; the first child taken is followed, and where none is, the token is drawn from p'
    (p itself at a leaf: the bonus). Each try is speculative sampling of p' with a proposal drawn before, and
    independently of, the law's uniforms, so the token that leaves each position is distributed as p there. At
    T = 0 (greedy; p may be logits) the child equal to the argmax is followed. n_accepted is the path's depth."""
    B, N = draft.shape
    block = mx.concatenate([mx.zeros((B, 1), draft.dtype), draft], axis=1)  # the tokens by position
    chosen = mx.full((B, N + 1), -1, mx.int32)
    rows = mx.arange(B)[:, None]
    if greedy:
        best = mx.argmax(p, axis=-1)
    else:
        u, k_sample = _uniforms(key, (B, N), lengths)
        u = mx.concatenate([mx.zeros((B, 1)), u], axis=1)
        r_tok = mx.concatenate([mx.ones((B, 1)), _prob_of(q, draft)], axis=1) if q is not None else None
    for i in range(shape.children.shape[2]):
        c = shape.children[:, :, i]
        ci = mx.array(np.maximum(c, 0), dtype=mx.int32)
        tok = mx.take_along_axis(block, ci, axis=1)
        free = mx.array(c >= 0) & (chosen < 0)
        if greedy:
            took = free & (tok == best)
        else:
            r_c = 1.0 if q is None else mx.take_along_axis(r_tok, ci, axis=1)
            took = free & (mx.take_along_axis(u, ci, axis=1) * r_c < _prob_of(p, tok))
            r = None if q is None else q[rows, mx.maximum(ci - 1, 0)]
            p = mx.where((free & ~took)[..., None], residual(p, r, tok), p)
        chosen = mx.where(took, ci, chosen)
    par = mx.array(np.maximum(shape.parents, 0), dtype=mx.int32)
    taken = (mx.take_along_axis(chosen, par, axis=1) == mx.arange(1, N + 1)[None]) & mx.array(shape.parents >= 0)
    missed = mx.concatenate([mx.zeros((B, 1), mx.bool_), ~taken], axis=1)
    reached = ~(mx.array(shape.ancestors) & missed[:, None, :]).any(axis=-1)  # every edge down to it was taken
    depth = mx.array(shape.depth, dtype=mx.int32)
    node = mx.argmax(mx.where(reached, depth, -1), axis=1)  # the reached positions are one path: its end
    n = _at(depth, node)
    token = _at(best, node) if greedy else _sample_rows(_at(p, node), k_sample)
    return Verdict(n, token, node=node)


def typical_floor(p: mx.array, threshold: float, eps: float) -> tuple[mx.array, mx.array]:
    """min(eps, delta * exp(-H(p))) per row, and H(p) (in nats)."""
    h = -mx.where(p > 0, p * mx.log(mx.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)
    return mx.minimum(eps, threshold * mx.exp(-h)), h


def typical(p: mx.array, draft: mx.array, key, threshold: float, eps: float = 1.0,
            lengths: list[int] | None = None) -> Verdict:
    """Typical acceptance (Medusa-2, arXiv:2401.10774 s2.3.1). NOT distribution-exact.

    Accept the longest prefix of positions whose draft token has p(x) > min(eps, delta * exp(-H(p))); resample the
    first atypical position from p itself; the bonus token comes from p_k."""
    k = draft.shape[-1]
    floor, h = typical_floor(p, threshold, eps)
    real = _real(draft, lengths)
    n = _prefix_length((_prob_of(p[:, :k], draft) > floor[:, :k]) & real)
    return Verdict(n, _sample_rows(_at(p, n), key), entropy=h, floor=floor)


@dataclass
class Judged:
    verdict: Verdict
    sums: list = field(default_factory=list)  # typical law: per row, entropy and floor summed over its tested positions
    complete: mx.array | None = None  # False: a nucleus lay past the partial selection: judge again with full=True


def judge(sp: SamplingParams, threshold: float, eps: float, logits: mx.array, drafts: mx.array, q: mx.array | None,
          keys: list, lengths: list[int], full: bool = False, shape: Shape | None = None) -> Judged:
    """The configured law on one verify pass of B rows: greedy at T = 0, typical acceptance with a threshold, else
    the exact law. Where the target's p came from the partial selection (sampling.shaped), `complete` says whether
    it was exact; where not, the caller judges again with full=True and the same keys (so the same draws)."""
    k = drafts.shape[1]
    if all(n == k for n in lengths):
        lengths = None  # every row drafted the full width: no padding to mask
    if sp.greedy and shape is not None:  # a draft tree (tree.py)
        return Judged(tree(logits, None, drafts, shape, keys, lengths, greedy=True))
    if sp.greedy:
        if k == 0:  # a plain step: the argmax, in as few device operations as mlx-lm's loop
            return Judged(Verdict(mx.zeros(len(keys), mx.int32), mx.argmax(logits[:, -1], axis=-1)))
        return Judged(greedy(logits, drafts, lengths))
    p, complete = shaped(logits, sp, full)
    if complete is not None and lengths is not None:  # positions past a row's draft and bonus are not used
        complete = complete | (mx.arange(k + 1)[None] > mx.array(lengths)[:, None])
    complete = None if complete is None else complete.all()
    if shape is not None:
        return Judged(tree(p, q, drafts, shape, keys, lengths), [], complete)
    if threshold <= 0:
        return Judged(exact(p, q, drafts, keys, lengths), [], complete)
    v = typical(p, drafts, keys, threshold, eps, lengths)
    pos = mx.arange(k)[None]
    reached = (pos <= v.n_accepted[:, None]) & (pos < (k if lengths is None else mx.array(lengths)[:, None]))
    return Judged(v, [(v.entropy[:, :k] * reached).sum(1), (v.floor[:, :k] * reached).sum(1)], complete)
