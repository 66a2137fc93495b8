"""Draft width policies. Pure: no model, no arrays; they see only drafted/accepted counts.

Both policies share one batch API: `width()` returns ONE width for the whole batch this cycle, and
`update(drafted, accepted)` takes, for every member, the number of tokens it REALLY drafted (after a
confidence floor may have cut the draft short) and how many of those the target accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence


def _round(x: float) -> int:
    return math.floor(x + 0.5)  # half up, not Python's banker's rounding


@dataclass
class FixedWidth:
    """Every draft is `n` tokens wide."""

    n: int
    batch: int = 1
    history: list[list[int]] = field(default_factory=list)

    def __post_init__(self):
        self.history = [[] for _ in range(self.batch)]

    def width(self) -> int:
        return self.n

    def update(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        for member, n in enumerate(drafted):
            self.history[member].append(n)

    def estimate(self, member: int = 0) -> float | None:
        return None


@dataclass
class EmaController:
    """Censoring-aware EMA of accepted tokens per draft, one estimate per sequence.

    After a verify with `a` accepted of the `n` actually drafted:
      a < n  (partial, the exact stopping point is observed):  E <- (1 - alpha) E + alpha a
      a == n (full accept, censored: only proves acceptance >= n): E <- min(E + probe, n_max)
    The width of a member is clamp(round(E), n_min, n_max); the batch drafts the max of its members'
    widths, so sequences decoded together never split into ragged blocks.
    """

    n_min: int = 1
    n_max: int = 4
    alpha: float = 0.25
    probe: float = 1.0
    init: float = 2.0
    batch: int = 1
    estimates: list[float] = field(default_factory=list)
    history: list[list[int]] = field(default_factory=list)

    def __post_init__(self):
        if self.n_min < 1:
            raise ValueError(f"n_min must be >= 1 (got {self.n_min})")
        if self.n_min > self.n_max:
            raise ValueError(f"n_min ({self.n_min}) must not exceed n_max ({self.n_max})")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"ema_alpha must be in (0, 1] (got {self.alpha})")
        self.reset()

    def reset(self, member: int | None = None) -> None:
        """Start a new prompt: all members, or one member of the batch."""
        if member is None:
            self.estimates = [min(self.init, self.n_max) for _ in range(self.batch)]
            self.history = [[] for _ in range(self.batch)]
        else:
            self.estimates[member] = min(self.init, self.n_max)
            self.history[member] = []

    def member_width(self, member: int) -> int:
        return min(max(_round(self.estimates[member]), self.n_min), self.n_max)

    def width(self) -> int:
        return max(self.member_width(m) for m in range(self.batch))

    def update(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        for member, (n, a) in enumerate(zip(drafted, accepted)):
            self.history[member].append(n)
            if n <= 0:
                continue  # nothing was drafted: no evidence either way
            e = self.estimates[member]
            if a < n:
                e = (1.0 - self.alpha) * e + self.alpha * a
            else:
                e = e + self.probe
            self.estimates[member] = min(e, float(self.n_max))

    def estimate(self, member: int = 0) -> float:
        return self.estimates[member]
