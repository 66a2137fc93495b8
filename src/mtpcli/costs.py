"""The cycle-time table `draft = auto` decides with: what a cycle costs (a plain step, its verification, per source a
fixed part, seconds per drafted token and per token caught up on) and what each source was found to do. A run decides
with one table (`Costs`: this machine's as the run log keeps it, or `prior_costs`) while `CostFit` measures the run;
`Costs.settled` says what to keep. What is measured and how a kept table moves: docs/policy.md."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Sequence

import numpy as np

PRIOR_ACCEPT = 0.6  # a drafted token's acceptance before a source is seen on this machine
RIDGE = 8.0  # a run's slope of cycle seconds over the width: the prior's weighs as 32 cycles at two widths 1 apart
KEEP_RUNS = 4  # a kept cost moves 1 / (1 + this) of the way towards a run that disagrees with it ...
MOVE = 1.25  # ... and by at most this factor (a cost in units of a step: beside SLACK of a step), so that no one busy
SLACK = 0.02  # run swings the next
BEND = 0.75  # a target pass is concave in its width: verifying n drafted tokens costs verify * n ** BEND of a step
# beyond a plain step (this CPU's 1.5B: 1, 4, 8 tokens 1.11x, 1.35x, 1.50x a plain step, issue 58)
LOOKUP = ("ngram", "history")  # sources that draft for next to nothing: their cycles time the verification


def _pooled(old: list[float] | None, new: list[float]) -> list[float]:
    """[value, count] pairs pooled, weighted by their counts (capped)."""
    (x, m), (y, n) = old or (new[0], 0.0), new
    return [(x * m + y * n) / (m + n), min(m + n, 200.0)] if m + n else [y, n]


@dataclass
class Costs:
    """A cycle's seconds: step (a plain step) x (1 + verify x n ** BEND, n tokens verified) + fixed[s] + k *
    per_token[s] (k drafted); what a source was found to do: its drafted tokens' acceptance [rate, tokens tested],
    the shift of its own estimates [log-odds, tokens], the target's confidence where that acceptance was measured
    [mean, cycles]; `runs`: how many runs it pools; `prefill`: seconds per token a source prefills before it drafts
    (its catch-up); `verify` 0: the verification is in per_token (a table of an earlier version)."""

    step: float
    per_token: dict[str, float]
    fixed: dict[str, float] = field(default_factory=dict)
    accept: dict[str, list[float]] = field(default_factory=dict)
    shift: dict[str, list[float]] = field(default_factory=dict)
    conf: dict[str, list[float]] = field(default_factory=dict)
    runs: int = 1
    prefill: dict[str, float] = field(default_factory=dict)
    verify: float = 0.0

    def catch_up(self, source: str, tokens: int) -> float:
        """Seconds `source` takes to prefill `tokens` committed tokens."""
        return tokens * self.prefill.get(source, 0.0)

    def time(self, source: str | None, k: int, nodes: int | None = None) -> float:
        """Seconds of a cycle drafting k tokens of `source` and verifying `nodes` (a tree's; else the k)."""
        if source is None or k == 0:
            return self.step
        return (self.step * (1 + self.verify * (k if nodes is None else nodes) ** BEND) + self.fixed.get(source, 0.0)
                + k * self.per_token.get(source, self.step))

    def prior_accept(self, source: str) -> float:
        """The kept acceptance, shrunk towards PRIOR_ACCEPT by how few tokens it was measured on."""
        rate, n = self.accept.get(source, (PRIOR_ACCEPT, 0.0))
        return (rate * n + PRIOR_ACCEPT * 5) / (n + 5)

    def to_dict(self) -> dict:
        return asdict(self)  # (deep: the dicts and lists are copies)

    @classmethod
    def from_dict(cls, d: dict) -> "Costs":
        """A table `to_dict` wrote; KeyError, TypeError or ValueError where it is not one (an earlier version's)."""
        step = float(d["step"])
        per = {str(k): float(v) for k, v in d["per_token"].items()}
        raw = {str(k): float(v) for k, v in (d.get("fixed") or {}).items()}
        fixed = {k: raw.get(k, 0.0) for k in per}
        accept = {str(k): [float(v[0]), float(v[1])] for k, v in (d.get("accept") or {}).items()}
        shift, conf = ({str(k): [float(v[0]), float(v[1])] for k, v in (d.get(name) or {}).items()}
                       for name in ("shift", "conf"))
        prefill = {str(k): float(v) for k, v in (d.get("prefill") or {}).items()}
        verify = float(d.get("verify", 0.0))
        if not (step > 0 and math.isfinite(step) and all(v >= 0 and math.isfinite(v) for v in
                                                         [*per.values(), *raw.values(), *prefill.values(), verify])):
            raise ValueError("a non-positive or non-finite cost")
        if not all(0.0 <= a <= 1.0 and 0 <= n < math.inf for a, n in accept.values()):
            raise ValueError("an acceptance outside [0, 1]")
        if not all(math.isfinite(a) and abs(a) <= 6 and n >= 0 for a, n in shift.values()):
            raise ValueError("a shift outside [-6, 6]")
        if not all(0.0 < c <= 1.0 and n >= 0 for c, n in conf.values()):
            raise ValueError("a confidence outside (0, 1]")
        return cls(step, per, fixed, accept, shift, conf, max(int(d["runs"]), 1), prefill, verify)

    def settled(self, measured: "Costs") -> "Costs":
        """What to keep after a run measured `measured`: this table while every measured figure agrees with it
        within its error (costs as shares of a step: the same seed, the same output next time), else each figure
        moved towards the run's: a cost 1 / (1 + KEEP_RUNS) of the way and at most a factor MOVE (one busy run cannot
        switch drafting off), the rest by their counts."""
        times = [(self.time(s, w) / self.step, measured.time(s, w) / measured.step) for s in measured.per_token
                 for w in (1, 4)]  # as shares of a step: a machine uniformly slower (busy) decides the same
        same = set(measured.per_token) <= set(self.per_token) and all(abs(a - b) <= 0.15 * a for a, b in times)
        same &= all(s in self.prefill and abs(self.prefill[s] / self.step - v / measured.step) <= 0.25 *
                    self.prefill[s] / self.step for s, v in measured.prefill.items())
        same &= all(s in self.accept and abs(self.accept[s][0] - x) <= max(0.05, 2 * math.sqrt(x * (1 - x) / n))
                    for s, (x, n) in measured.accept.items())
        same &= all(s in self.shift and abs(self.shift[s][0] - d) <= max(0.5, 4 / math.sqrt(max(n, 1.0)))
                    for s, (d, n) in measured.shift.items())
        same &= all(s in self.conf and abs(self.conf[s][0] - c) <= max(0.05, 0.5 / math.sqrt(max(n, 1.0)))
                    for s, (c, n) in measured.conf.items())
        if same:
            return self
        w = min(self.runs, KEEP_RUNS)
        step = _toward(self.step, measured.step, w, 0.0)
        ratio = lambda mine, new: {**{s: v * step / self.step for s, v in mine.items()}, **{  # noqa: E731
            s: step * _toward(mine.get(s, v) / self.step, v / measured.step, w if s in mine else 0, SLACK)
            for s, v in new.items()}}  # in units of a step: a source the run did not measure keeps its ratio
        pooled = lambda mine, new: {**mine, **{s: _pooled(mine.get(s), v) for s, v in new.items()}}  # noqa: E731
        return Costs(step, ratio(self.per_token, measured.per_token), ratio(self.fixed, measured.fixed),
                     pooled(self.accept, measured.accept), pooled(self.shift, measured.shift),
                     pooled(self.conf, measured.conf), min(self.runs + 1, 100), ratio(self.prefill, measured.prefill),
                     _toward(self.verify, measured.verify, w if self.verify else 0, SLACK))


def _toward(old: float, new: float, w: int, slack: float) -> float:
    """`old` moved 1 / (1 + w) of the way to `new` (w 0: to it) in log(x + slack), by at most a factor MOVE there:
    a run that measures a figure 3 times as large moves it as far as one that measures a third."""
    if not w:
        return new
    move = (math.log(new + slack) - math.log(old + slack)) / (w + 1)
    return (old + slack) * math.exp(max(-math.log(MOVE), min(math.log(MOVE), move))) - slack


def prior_costs(sources: Sequence[str], draft_ratio: dict[str, float], gpu: bool) -> Costs:
    """Before any measurement, in units of a plain step: verifying n drafted tokens costs 0.11 n ** BEND on a CPU
    (1.11x a plain step for one, 1.52x for 8), 0.02 n ** BEND on a GPU; a draft model's token its size relative to the
    target's (at least 60% on a GPU); lookup nothing more. A draft model prefills a token for a tenth of its drafting
    one on a CPU (the 0.5B draft of a 1.5B target: 10-18 ms against a 357 ms step, issue 54), a hundredth on a GPU."""
    draft = {s: (max(r, 0.6) if gpu else r) for s, r in draft_ratio.items() if r and s in sources}
    return Costs(1.0, {s: draft.get(s, 0.0) for s in sources},
                 prefill={s: r * (0.01 if gpu else 0.1) for s, r in draft.items()}, verify=0.02 if gpu else 0.11)


@dataclass
class CostFit:
    """This run's cycle seconds (the first cycle, and a source's first at each width, left out: they compile, on a
    GPU for seconds where a cycle takes milliseconds): a plain step's, their median; a source's
    seconds per token, the slope through the median seconds at each width it drafted, pulled towards the prior's
    (worth RIDGE cycles one width apart), and its fixed part, the median of what its cycles cost beyond that:
    medians, so a moment of a busy machine moves nothing far."""

    prior: Costs
    known: bool = False  # the prior is in seconds (a kept table), not in units of a plain step
    plains: list[float] = field(default_factory=list)
    drafts: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    shapes: set = field(default_factory=set)  # the (source, width, ...) draft shapes so far
    skipped: int = 0  # timed cycles left out
    untimed: int = 0
    catch_ups: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)  # (width, tokens, seconds)

    def add(self, source: str | None, k: int, seconds: float | None, shape: tuple | None = (),
            caught: int = 0) -> None:
        """A cycle of `source` at width k (None, 0: a plain step); seconds None: not timed, its shape compiled all
        the same. `shape`: what a draft's compiled pass depends on beyond (source, k), such as the rows; None: no
        chain's (a tree's). `caught`: tokens the source prefilled first (its seconds time that, not a cycle)."""
        plain = source is None or not k
        key = None if plain or shape is None else (source, k, *shape)
        new = key is not None and key not in self.shapes
        if new:
            self.shapes.add(key)
        if seconds is None or caught:
            self.untimed += 1
            if seconds is not None:
                self.catch_ups.setdefault(source, []).append((k, caught, seconds))
            return
        if not self.skipped or new:
            self.skipped += 1
        elif plain:
            self.plains.append(seconds)
        else:
            self.drafts.setdefault(source, {}).setdefault(k, []).append(seconds)

    def cycles(self) -> int:
        return (len(self.plains) + sum(len(v) for d in self.drafts.values() for v in d.values()) + self.skipped
                + self.untimed)

    def result(self) -> Costs | None:
        drafted = [t * self.prior.step / self.prior.time(s, k) for s, d in self.drafts.items() for k, ts in d.items()
                   for t in ts]  # what a plain step took, by the table's shape of each drafted cycle
        if len(self.plains) >= 3:
            step = median(self.plains)
        elif len(drafted) >= 3:
            step = median(drafted)
        elif self.known:
            step = self.prior.step
        else:
            return None
        scale = step / self.prior.step  # (the table's costs in this run's seconds: its ratios kept)
        verify = self.prior.verify
        looks = [(k, median(ts), len(ts)) for s in LOOKUP for k, ts in self.drafts.get(s, {}).items()]
        if verify and looks:  # a lookup's cycle is a verification: its level (the shape is BEND's), pulled towards
            x, m, n = (np.array(v, float) for v in zip(*looks))  # the table's as RIDGE cycles verifying one token
            verify = max(float((n * x**BEND) @ (m / step - 1) + RIDGE * verify) / float(n @ x**(2 * BEND) + RIDGE), 0.0)
        check = lambda k: step * verify * k**BEND  # noqa: E731 - a verification's seconds beyond a step
        per, fixed = {}, {}
        for s, by_width in self.drafts.items():
            samples = [(k, t - check(k)) for k, ts in by_width.items() for t in ts]  # what drafting took, and a step
            if len(samples) < 2:
                continue  # too few to say (two probes time two)
            k, n = np.array(list(by_width), float), np.array([len(ts) for ts in by_width.values()], float)
            m = np.array([median(ts) - check(k) for k, ts in by_width.items()])
            prior = self.prior.per_token.get(s, 0.1) * scale
            dk = k - np.average(k, weights=n)
            per[s] = max(float((n * dk) @ m + RIDGE * prior) / float(n @ dk**2 + RIDGE), 0.0)
            mean_k, over = float(n @ k) / n.sum(), float(n @ m) / n.sum() - step  # what was measured beyond a step
            if per[s] * mean_k - over > 0.25 * step:  # a line far dearer than what was measured (a prior that timed a
                per[s] = max(over, 0.0) / mean_k  # compile) gives way to it; within noise of a step it stands
            fixed[s] = max(median(t - per[s] * k for k, t in samples) - step, 0.0)
        prefill = {}  # what a catch-up took beyond its cycle's time, per token
        for s, samples in self.catch_ups.items():
            f = fixed.get(s, self.prior.fixed.get(s, 0.0) * scale)
            p = per.get(s, self.prior.per_token.get(s, self.prior.step) * scale)
            prefill[s] = max(median((t - step - check(k) - f - k * p) / n for k, n, t in samples), 0.0)
        return Costs(step, per, fixed, prefill=prefill, verify=verify)
