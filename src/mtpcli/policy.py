"""`draft = auto`: every cycle, ONE draft source and ONE width for the batch, chosen by expected committed tokens
per second of cycle time. Pure: no model, no arrays; it sees committed contexts only through `available`.

    score(s, k) = sum over rows of E_b[tokens | s, k]  /  T(s, k)        (width 0 = a plain step, E = 1 per row)

E comes from per-row, per-source, per-position conditional acceptance estimates (position i counts only in cycles
whose draft reached it and had not been rejected before it, so a fully accepted draft, or one cut short, says
nothing about the positions it did not reach: censored). The counts decay every cycle, so a source that has not
been tried for a while drifts back to its prior and is tried again (exploration at a bounded cost). An n-gram
source tells before drafting how many tokens it has for each row (`available`); a row with fewer gets only those.

T(s, k) = plain + k * per_token[s]: seconds of a plain step plus the seconds each drafted token of source s adds
(drafting it and verifying it). The choice uses a fixed `Costs` table for the whole run: the one earlier runs on
this machine left (the run log keeps it per model, draft, machine, sampling and batch size; it also holds each
source's acceptance by position, the prior of a row's estimates), or the prior from the models' sizes. Meanwhile
`Measured` records this run, to be kept for the next one. A source's expected tokens get an exploration bonus that
shrinks with the evidence (EXPLORE / sqrt(1 + reached)), so a source the table calls poor is still tried now and
then. So the choice depends on the committed tokens, the earlier acceptances and a fixed table, never on this
cycle's draws (the exact law holds), and the same seed with the same stored table gives the same output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

PRIOR_ACCEPT = 0.6  # prior acceptance per position before a source is seen on this machine
PRIOR_WEIGHT = 1.5  # ... worth this many observations
EXPLORE = 0.3  # optimism added to a position's acceptance, / sqrt(1 + times it was reached)
DECAY = 0.99  # every cycle, every count: evidence older than ~100 cycles fades
WINDOW = 256  # cycle-time samples kept for the fit


@dataclass
class Costs:
    """Cycle time model: plain seconds + k * per_token[source] seconds; and each source's acceptance by position
    (the prior of a row's estimates; missing: PRIOR_ACCEPT)."""

    plain: float
    per_token: dict[str, float]
    accept: dict[str, list[float]] = field(default_factory=dict)

    def time(self, source: str | None, k: int) -> float:
        if source is None or k == 0:
            return self.plain
        return self.plain + k * self.per_token.get(source, self.plain)

    def prior_accept(self, source: str, n: int) -> list[float]:
        known = self.accept.get(source, [])
        return [known[i] if i < len(known) else PRIOR_ACCEPT for i in range(n)]

    def to_dict(self) -> dict:
        return {"plain": self.plain, "per_token": dict(self.per_token), "accept": {k: list(v) for k, v in self.accept.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "Costs":
        plain = float(d["plain"])
        per = {str(k): float(v) for k, v in d["per_token"].items()}
        accept = {str(k): [float(x) for x in v] for k, v in (d.get("accept") or {}).items()}
        if not (plain > 0 and math.isfinite(plain) and all(v >= 0 and math.isfinite(v) for v in per.values())):
            raise ValueError("non-positive or non-finite cost")
        if not all(0.0 <= x <= 1.0 for v in accept.values() for x in v):
            raise ValueError("an acceptance outside [0, 1]")
        return cls(plain, per, accept)

    def settled(self, measured: "Costs", tolerance: float = 0.15) -> "Costs":
        """What to keep after a run measured `measured`: the old table while every figure is within `tolerance`
        of it (so outputs of the same seed stay the same), else the mean of both."""
        old, new = self.per_token, measured.per_token
        pairs = [(self.plain, measured.plain)] + [(old.get(k, new[k]), new.get(k, old[k])) for k in old | new]
        acc_old, acc_new = self.accept, measured.accept
        n = {k: max(len(acc_old.get(k, [])), len(acc_new.get(k, []))) for k in acc_old | acc_new}
        acc_pairs = [(a, b) for k in n for a, b in zip(self.prior_accept(k, n[k]), measured.prior_accept(k, n[k]))]
        if all(abs(a - b) <= tolerance * max(a, 0.02 * self.plain) for a, b in pairs) and \
                all(abs(a - b) <= 0.1 for a, b in acc_pairs):
            return self
        per = {k: (old.get(k, new[k]) + new.get(k, old[k])) / 2 for k in old | new}
        accept = {k: [(a + b) / 2 for a, b in zip(self.prior_accept(k, n[k]), measured.prior_accept(k, n[k]))]
                  for k in n}
        return Costs((self.plain + measured.plain) / 2, per, accept)


def prior_costs(sources: Sequence[str], draft_ratio: dict[str, float], gpu: bool) -> Costs:
    """Before any measurement: in units of a plain step, verifying one more token costs 8% on a CPU (the matrix
    products grow with the tokens) and 2% on a GPU (a pass is nearly free in width); a draft model's token costs
    its size relative to the target's; an n-gram lookup costs nothing beyond verification."""
    verify = 0.02 if gpu else 0.08
    return Costs(1.0, {s: verify + draft_ratio.get(s, 0.0) for s in sources})


@dataclass
class CostFit:
    """Least squares of measured cycle seconds on [1, k * (source == s) ...], ridge-pulled towards a prior."""

    prior: Costs
    samples: list[tuple[str | None, int, float]] = field(default_factory=list)

    def add(self, source: str | None, k: int, seconds: float) -> None:
        self.samples.append((source if k else None, k, seconds))
        del self.samples[:-WINDOW]

    def result(self, accept: dict[str, list[float]] | None = None) -> Costs | None:
        import numpy as np

        pts = self.samples[1:]  # the first cycle pays for compilation and warm caches
        if len(pts) < 4:
            return None
        names = sorted(self.prior.per_token)
        plain = float(np.median([t for s, _, t in pts if s is None] or [t for _, _, t in pts]))
        x = np.array([[1.0] + [k * (s == n) for n in names] for s, k, _ in pts])
        y = np.array([t for _, _, t in pts])
        scale = plain / self.prior.plain  # the prior is in units of a plain step
        reg = np.sqrt(2.0)  # worth two samples
        px = reg * np.eye(1 + len(names))
        py = reg * np.array([plain] + [self.prior.per_token[n] * scale for n in names])
        coef, *_ = np.linalg.lstsq(np.vstack([x, px]), np.concatenate([y, py]), rcond=None)
        return Costs(max(float(coef[0]), 1e-6), {n: max(float(c), 0.0) for n, c in zip(names, coef[1:])},
                     dict(accept or {}))


class AutoPolicy:
    """The controller of `draft = auto`: plan(contexts) -> (source or None, width)."""

    def __init__(self, sources: Sequence[str], n_max: int, costs: Costs,
                 available: Callable[[str, list, int], list[int] | None] = lambda s, c, k: None,
                 batch: int = 1, prior: Costs | None = None):
        if n_max < 1:
            raise ValueError(f"n_max must be >= 1 (got {n_max})")
        self.sources, self.n_max, self.costs, self.available = list(sources), n_max, costs, available
        self.batch = batch
        self.fit = CostFit(prior or costs)
        self.key, self.warm = "", False  # where the costs are kept, and whether they came from there
        self.reset()

    def reset(self, member: int | None = None) -> None:
        fresh = lambda: {s: ([0.0] * self.n_max, [0.0] * self.n_max) for s in self.sources}  # noqa: E731
        if member is None:
            self.counts = [fresh() for _ in range(self.batch)]
            self.history = [[] for _ in range(self.batch)]
            self.last: tuple[str | None, int] = (None, 0)
            self.seen = fresh()  # the whole run's counts per source, pooled over rows, undecayed: kept for the next
        else:
            self.counts[member] = fresh()
            self.history[member] = []

    # ---- estimates ------------------------------------------------------------------------------------
    def acceptance(self, source: str, member: int = 0, explore: bool = False) -> list[float]:
        acc, reached = self.counts[member][source]
        prior = self.costs.prior_accept(source, self.n_max)
        return [min(1.0, (a + p * PRIOR_WEIGHT) / (r + PRIOR_WEIGHT) + (EXPLORE / math.sqrt(1 + r) if explore else 0))
                for a, r, p in zip(acc, reached, prior)]

    def expected(self, source: str, k: int, member: int = 0, explore: bool = False) -> float:
        """Expected committed tokens of a cycle drafting k tokens of `source`: 1 + sum_j prod_{i<=j} a_i."""
        total, run = 1.0, 1.0
        for a in self.acceptance(source, member, explore)[:k]:
            run *= a
            total += run
        return total

    def measured(self) -> Costs | None:
        """This run's cycle costs and acceptance by position (positions reached at least 4 times)."""
        accept = {}
        for s, (acc, reached) in self.seen.items():
            known = [a / r for a, r in zip(acc, reached) if r >= 4]
            if known:
                accept[s] = known
        return self.fit.result(accept)

    def scores(self, contexts: list) -> dict[tuple[str | None, int], float]:
        B = len(contexts)
        out = {(None, 0): B / self.costs.time(None, 0)}
        for s in self.sources:
            avail = self.available(s, contexts, self.n_max)
            for k in range(1, self.n_max + 1):
                caps = [k] * B if avail is None else [min(k, a) for a in avail]
                if max(caps) < k and k > 1:
                    break  # no row has more to give
                if max(caps) == 0:
                    break
                e = sum(self.expected(s, c, b, explore=True) for b, c in enumerate(caps))
                out[(s, k)] = e / self.costs.time(s, max(caps))
        return out

    # ---- the controller API --------------------------------------------------------------------------
    def plan(self, contexts: list) -> tuple[str | None, int]:
        scores = self.scores(contexts)
        self.last = max(scores, key=lambda sk: (scores[sk], -sk[1]))  # ties: the narrower, plain first
        return self.last

    def width(self) -> int:
        return self.last[1]

    def update(self, drafted: Sequence[int], accepted: Sequence[int], seconds: float | None = None,
               source: str | None = None) -> None:
        for member in range(len(drafted)):
            for acc, reached in self.counts[member].values():
                for i in range(self.n_max):
                    acc[i] *= DECAY
                    reached[i] *= DECAY
        for member, (n, a) in enumerate(zip(drafted, accepted)):
            self.history[member].append(n)
            if source is None or n == 0:
                continue
            for acc, reached in (self.counts[member][source], self.seen[source]):
                for i in range(min(n, a + 1, self.n_max)):  # positions past the first rejection were not tested
                    reached[i] += 1
                    acc[i] += i < a
        if seconds is not None:
            self.fit.add(source, max(drafted, default=0), seconds)

    def estimate(self, member: int = 0) -> float | None:
        s, k = self.last
        return None if s is None else self.expected(s, k, member) - 1.0
