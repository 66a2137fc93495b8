"""Draft sources. Each hands the verify step the same thing: k proposed tokens and, where it has
them, their draft distributions q (None means a deterministic proposal, i.e. one-hot q)."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass
class Proposal:
    tokens: mx.array  # (k,) int32
    q: mx.array | None  # (k, V) float32 draft distributions, or None for one-hot proposals
    k: int  # realized length (a confidence floor may cut a draft short)
    requested: int  # the width that was asked for


class NoDraft:
    """Plain autoregressive decoding through the same verify/commit path (k = 0)."""

    name = "none"

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int, sp, key) -> Proposal:
        return Proposal(mx.zeros((0,), mx.int32), None, 0, 0)

    def commit(self, context: list[int], proposal: Proposal, n_accepted: int) -> None:
        pass

    def restart(self) -> None:
        pass
