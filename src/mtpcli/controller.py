"""Draft width policies. Pure: no model, no arrays; they see only drafted/accepted counts.

Every policy shares one batch API (`WidthPolicy`): `plan(contexts)` returns a `Plan`, ONE source and width for the
whole batch this cycle (source None: the engine's one drafter; policy.AutoPolicy also names the source), and
`update(drafted, accepted, seconds, source, ...)` takes, for every member, the number of tokens it REALLY drafted
(after a confidence floor may have cut the draft short) and how many of those the target accepted. What a policy
can do beyond that it declares (`observes`: it wants the target's confidence at the committed tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from .stop import Stop


@dataclass(frozen=True)
class Plan:
    """A cycle's plan for the batch: the source that drafts (None: the engine's one drafter, or a plain step at width
    0), its width, where a draft that stops itself stops (stop.Stop; None: where p_min says), and draft = auto's
    cost(k, n) of a cycle drafting k and verifying n nodes of the source (its table's: tree = auto weighs a tree by it)."""

    source: str | None
    width: int
    stop: Stop | None = None
    cost: Callable[[int, int], float] | None = None


class WidthPolicy:
    """One source, a width per cycle; each row's state is its record in `rows` (`fresh()` gives a new one)."""

    observes = False  # wants observe(confidences): the target's largest probability at each committed token
    batch: int = 1

    def __post_init__(self):  # (the dataclass policies)
        self.reset()

    def plan(self, contexts=None, left=None) -> Plan:
        """`left`: the tokens each row may still make (its max_tokens)."""
        return Plan(None, self.width())

    def start(self, batch: int, law: str) -> None:
        """A run of `batch` rows under the law named (greedy, exact or typical) begins."""
        self.batch = batch
        self.reset()

    def fresh(self):
        return None

    def reset(self, member: int | None = None) -> None:
        """Start a new prompt: all members, or one member of the batch."""
        if member is None:
            self.rows = [self.fresh() for _ in range(self.batch)]
        else:
            self.rows[member] = self.fresh()

    def keep(self, members: Sequence[int]) -> None:
        """Keep only these batch members (in this order): rows that finished with no prompt left to refill them
        leave the batch, and their estimates stop counting towards the shared width."""
        self.rows, self.batch = [self.rows[m] for m in members], len(members)

    def update(self, drafted: Sequence[int], accepted: Sequence[int], seconds: float | None = None,
               source: str | None = None, requested: Sequence[int] | None = None, chances=None,
               tree: bool = False) -> None:
        """A cycle: per member the tokens it really drafted and how many the target accepted (requested: asked
        for; chances: the source's estimates; tree: drafted as a tree, `drafted` its first-child chain)."""

    def observe(self, confidences) -> None:
        pass

    def estimate(self, member: int = 0) -> float | None:
        return None


@dataclass
class FixedWidth(WidthPolicy):
    """Every draft is `n` tokens wide."""

    n: int
    batch: int = 1

    def width(self) -> int:
        return self.n


@dataclass
class EmaController(WidthPolicy):
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

    def __post_init__(self):
        if self.n_min < 1:
            raise ValueError(f"n_min must be >= 1 (got {self.n_min})")
        if self.n_min > self.n_max:
            raise ValueError(f"n_min ({self.n_min}) must not exceed n_max ({self.n_max})")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"ema_alpha must be in (0, 1] (got {self.alpha})")
        self.reset()

    def fresh(self) -> float:  # (a row's record: its estimate)
        return min(self.init, self.n_max)

    def member_width(self, member: int) -> int:
        return min(max(math.floor(self.rows[member] + 0.5), self.n_min), self.n_max)  # half up, not banker's

    def width(self) -> int:
        return max(self.member_width(m) for m in range(self.batch))

    def update(self, drafted, accepted, *args, **kwargs) -> None:
        for member, (n, a) in enumerate(zip(drafted, accepted)):
            if n > 0:  # (nothing drafted: no evidence either way)
                e = self.rows[member]
                e = (1.0 - self.alpha) * e + self.alpha * a if a < n else e + self.probe
                self.rows[member] = min(e, float(self.n_max))

    def estimate(self, member: int = 0) -> float:
        return self.rows[member]
