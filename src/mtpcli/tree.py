"""Draft trees: several candidates per position, verified in one target pass (verify.tree). Node i of a row's tree sits
at position i + 1 of its block (0: the root), `parents[i]` at most i; depth-first, first child first, so the
first-child chain is positions 1..d (no gather in the cache); siblings never repeat a deterministic token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Spec:
    """The trees a source drafts, set when it is made: at most `nodes` nodes, at most `children` children per node;
    tree = auto: `cost`, a cycle drafting a chain of k and verifying n nodes costs cost(k, n) seconds (under draft =
    auto, the plan's table: Plan.cost), and a tree is drafted where it pays (`pays`); None: always."""

    nodes: int
    children: int = 1
    cost: Callable[[int, int], float] | None = None


@dataclass(frozen=True)
class Shape:
    """What the law and the cache need of a batch's trees (host arrays; padding nodes have parent -1)."""
    parents: np.ndarray  # (B, N)
    depth: np.ndarray  # (B, N+1): a position's depth (its RoPE offset past the root)
    children: np.ndarray  # (B, N+1, K): each position's children in order, -1 where there are fewer
    ancestors: np.ndarray  # (B, N+1, N+1) bool: [b, i, j] position j is i or one of its ancestors

    @staticmethod
    def of(parents: np.ndarray) -> Shape:
        B, N = parents.shape
        depth = np.zeros((B, N + 1), np.int64)
        anc = np.zeros((B, N + 1, N + 1), bool)
        anc[:, np.arange(N + 1), np.arange(N + 1)] = True
        kids = [[[] for _ in range(N + 1)] for _ in range(B)]
        for b in range(B):
            for i, par in enumerate(parents[b]):
                if par >= 0:
                    depth[b, i + 1] = depth[b, par] + 1
                    anc[b, i + 1] |= anc[b, par]
                    kids[b][par].append(i + 1)
        K = max(1, max(len(k) for row in kids for k in row))
        children = np.full((B, N + 1, K), -1, np.int64)
        for b, row in enumerate(kids):
            for v, k in enumerate(row):
                children[b, v, : len(k)] = k
        return Shape(parents, depth, children, anc)

    def path(self, b: int, node: int) -> list[int]:
        """The positions from the root's child down to `node` (empty for the root)."""
        out = []
        while node > 0:
            out.append(node)
            node = int(self.parents[b, node - 1])
        return out[::-1]

    def chain(self, b: int) -> int:
        """Row b's first-child chain: its nodes at positions 1..d."""
        return chain(self.parents[b])

    @staticmethod
    def followed(path: list[int]) -> int:
        """How far a path (positions from the root's child down) follows the first-child chain."""
        return chain([j - 1 for j in path])  # (on the chain, position j's parent is j - 1)


def chain(parents) -> int:
    """How many nodes of a tree (their parents' positions, depth-first) are its first-child chain: parents 0, 1, ..."""
    return next((i for i, par in enumerate(parents) if par != i), len(parents))


def merge(candidates: list[list[int]], budget: int, width: int) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """A tree from candidate continuations in order of preference (the first is the chain a chain draft would be):
    each is inserted as a path, sharing the prefix it has with those before; a node gets at most `width` children and
    the tree at most `budget` nodes. Returns the nodes' tokens and parents in depth-first order, and for each node the
    (candidate, index) it came from first."""
    kids: list[list[int]] = [[]]  # trie nodes: 0 is the root
    token, origin = [-1], [(-1, -1)]
    for c, cand in enumerate(candidates):
        v = 0
        for i, t in enumerate(cand):
            nxt = next((u for u in kids[v] if token[u] == t), None)
            if nxt is None:
                if len(token) > budget or len(kids[v]) >= width:
                    break
                nxt = len(token)
                token.append(t)
                origin.append((c, i))
                kids.append([])
                kids[v].append(nxt)
            v = nxt
    tokens, parents, origins = [], [], []
    stack = [(u, 0) for u in reversed(kids[0])]
    while stack:  # depth first, first child first
        u, par = stack.pop()
        tokens.append(token[u])
        parents.append(par)
        origins.append(origin[u])
        stack += [(w, len(tokens)) for w in reversed(kids[u])]
    return tokens, parents, origins


def expected(parents: list[int], chances: list[float]) -> float:
    """Expected accepted nodes of a tree whose node i passes with chances[i] once its parent is reached (siblings'
    chances scaled to sum to at most 1: one of them at most is taken)."""
    total = [0.0] * (len(parents) + 1)
    for i, par in enumerate(parents):
        total[par] += chances[i]
    reach, out = [1.0] + [0.0] * len(parents), 0.0
    for i, par in enumerate(parents):
        reach[i + 1] = reach[par] * chances[i] / max(1.0, total[par])
        out += reach[i + 1]
    return out


def pays(trees: list[tuple[list[int], list[float]]], chain: list[int], cost) -> bool:
    """Whether the rows' trees (parents, chances) are expected to commit more tokens per second than their
    first-child chains (`chain`: each row's chain length), a cycle drafting a chain of k and verifying n nodes
    costing cost(k, n) seconds."""
    n, k = max(len(p) for p, _ in trees), max(chain)
    gain = sum(1.0 + expected(p, c) for p, c in trees) / cost(k, n)
    alone = sum(1.0 + expected(list(range(m)), c[:m]) for (_, c), m in zip(trees, chain)) / cost(k, k)
    return gain > alone
