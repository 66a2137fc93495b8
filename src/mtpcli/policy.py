"""`draft = auto`: every cycle, ONE draft source and ONE width for the batch, chosen by expected committed tokens
per second of cycle time. Pure: no model, no arrays; it sees committed contexts only through `available`.

    score(s, k) = sum over rows of E_b[tokens | s, k]  /  T(s, k)        (width 0 = a plain step, E = 1 per row)

E: per row, source and position, the kept acceptance (learnt over runs) moved in log-odds by the row's shift: how
sure the target is of the row's text against where the table was measured (`offset`), and how the row's drafts
fared (a censored MAP fit); sources that estimate their own tokens (n-gram lookup, the history) are expected what
they estimate, calibrated per row (`shift`). Counts decay, and an exploration bonus shrinks with the evidence, so a
source the table calls poor is still tried now and then. T(s, k) = plain + fixed[s] + k * per_token[s], a plain
step's own time apart: a `Costs` table fixed for the run (this machine's, kept in the run log, or a prior from the
models' sizes), while `CostFit` measures this run's for the next. A source that drafts autoregressively stops where
one more token is worth less than plain steps make in its time (`floor`, carried by Plan.stop). The choice depends
on committed tokens, earlier acceptances and a fixed table only, never on this cycle's draws: the exact law holds,
and the same seed with the same kept table gives the same output. docs/policy.md says all of it at length.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from .controller import Plan, WidthPolicy

PRIOR_ACCEPT = 0.6  # prior acceptance per position before a source is seen on this machine
EXPLORE = 0.3  # optimism added to a position's acceptance, / (1 + (times it was reached + the row's tests) / 2)
DECAY = 0.99  # every cycle, every count: evidence older than ~100 cycles fades
WINDOW = 256  # cycle-time samples kept for the fit
VISITS_CAP = 200.0  # a kept acceptance weighs at most this many observations against a new run's
SHIFT_SD = 1.0  # a row's log-odds shift of a source's own estimates: the prior's spread around the kept shift
ROW_SD = 0.75  # a row's log-odds shift of the kept acceptance: its prior's spread (a few rejections move it a little)
SHIFT_POINTS = 96  # verified tokens a row keeps per source for that fit
CONF_DECAY = 0.9  # a row's confidence: each committed token's weight fades by this at every later token (~10 tokens)
CONF_PRIOR = 2.0  # ... over the kept confidence, worth this many tokens
CONF_CAP = 1.5  # the most (in log-odds) a row's confidence moves the kept acceptance


EDGE = 1e-4  # estimates are taken within [EDGE, 1 - EDGE]: a certain one would leave no room for a shift


def _logit(p: float) -> float:
    p = min(max(p, EDGE), 1 - EDGE)
    return math.log(p / (1 - p))


def shifted(p: float, shift: float) -> float:
    """p with its log-odds moved by `shift` (a source's estimates, calibrated to what the target accepts)."""
    if shift == 0.0:
        return p
    return 1.0 / (1.0 + math.exp(-(_logit(p) + shift)))


def fit_shift(points: Sequence[tuple[float, float, float]], prior: float = 0.0, sd: float = SHIFT_SD) -> float:
    """The log-odds shift d that best explains outcomes y (passed: 1, rejected: 0) of tokens estimated
    sigmoid(z), with weights w: (z, y, w) points; the maximum a posteriori under a normal prior (prior, sd),
    so a few tokens move it a little and many move it far. Newton's method (the function is concave), in [-6, 6]."""
    if not len(points):
        return prior
    z, y, w = np.array(points, dtype=np.float64).T
    d = prior
    for _ in range(30):
        p = 1.0 / (1.0 + np.exp(-np.clip(z + d, -30.0, 30.0)))
        g = float(w @ (y - p)) - (d - prior) / sd**2
        h = -float(w @ (p * (1 - p))) - 1.0 / sd**2
        new = min(max(d - g / h, -6.0), 6.0)
        if abs(new - d) < 1e-7:
            return new
        d = new
    return d


@dataclass
class Costs:
    """Cycle time model: plain seconds + k * per_token[source] seconds; and each source's acceptance by position
    with the number of times each position was reached (the prior of a row's estimates)."""

    plain: float
    per_token: dict[str, float]
    accept: dict[str, list[float]] = field(default_factory=dict)
    visits: dict[str, list[float]] = field(default_factory=dict)
    shift: dict[str, list[float]] = field(default_factory=dict)  # source -> [log-odds shift of its estimates, tokens]
    step: float | None = None  # a plain step's own seconds (chained plain steps' median); None: never measured
    # a source's cost beyond the intercept whatever its width (a draft model's catch-up on the committed tokens)
    fixed: dict[str, float] = field(default_factory=dict)
    # source -> [the target's confidence where its acceptance was measured, cycles] (a draft model, MTP heads)
    conf: dict[str, list[float]] = field(default_factory=dict)

    def time(self, source: str | None, k: int) -> float:
        if source is None or k == 0:
            return self.step or self.plain
        return self.plain + self.fixed.get(source, 0.0) + k * self.per_token.get(source, self.plain)

    def prior_accept(self, source: str, n: int) -> list[float]:
        """Kept acceptance by position, shrunk towards PRIOR_ACCEPT by how rarely it was seen; past the positions
        kept, the deepest one kept (a draft is rarely less sure deeper in, once it got there)."""
        acc, vis = self.accept.get(source, []), self.visits.get(source, [])
        vis = vis + [30.0] * (len(acc) - len(vis))  # a table kept without counts: trusted as well measured
        out = [(a * v + PRIOR_ACCEPT * 5) / (v + 5) for a, v in zip(acc[:n], vis)]
        return out + [out[-1] if out else PRIOR_ACCEPT] * (n - len(out))

    def to_dict(self) -> dict:
        copy = lambda name: {k: list(v) for k, v in getattr(self, name).items()}  # noqa: E731
        return {"plain": self.plain, "per_token": dict(self.per_token), "accept": copy("accept"),
                "visits": copy("visits"), "shift": copy("shift"), **({"step": self.step} if self.step else {}),
                **({"fixed": dict(self.fixed)} if self.fixed else {}), **({"conf": copy("conf")} if self.conf else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "Costs":
        plain, step = float(d["plain"]), None if d.get("step") is None else float(d["step"])
        per = {str(k): float(v) for k, v in d["per_token"].items()}
        floats, pair = (lambda v: [float(x) for x in v]), (lambda v: [float(v[0]), float(v[1])])
        accept, visits, shift, fixed, conf = ({str(k): f(v) for k, v in (d.get(name) or {}).items()} for name, f in
                                              (("accept", floats), ("visits", floats), ("shift", pair),
                                               ("fixed", float), ("conf", pair)))
        if step is not None and not (step > 0 and math.isfinite(step)):
            raise ValueError("non-positive or non-finite plain step")
        if not (plain > 0 and math.isfinite(plain) and
                all(v >= 0 and math.isfinite(v) for v in [*per.values(), *fixed.values()])):
            raise ValueError("non-positive or non-finite cost")
        if not all(0.0 <= x <= 1.0 for v in accept.values() for x in v):
            raise ValueError("an acceptance outside [0, 1]")
        if not all(math.isfinite(a) and abs(a) <= 6 and math.isfinite(n) and n >= 0 for a, n in shift.values()):
            raise ValueError("a shift outside [-6, 6]")
        if not all(0.0 < c <= 1.0 and math.isfinite(n) and n >= 0 for c, n in conf.values()):
            raise ValueError("a confidence outside (0, 1]")
        return cls(plain, per, accept, visits, shift, step, fixed, conf)

    def settled(self, measured: "Costs") -> "Costs":
        """What to keep after a run measured `measured`: this table while every measured figure agrees with it
        within its error (costs within 15%: the same seed, the same output next time), else a count-weighted merge."""
        old, new = self.per_token, measured.per_token
        # a cycle's cost at a narrow and a wide draft (well measured, unlike its split into a fixed part and tokens)
        pairs = [(self.plain, measured.plain)] + [(self.time(k, w), measured.time(k, w)) for k in new if k in old
                                                  for w in (1, 4)]
        if measured.step:
            pairs.append((self.step or self.plain, measured.step))
        same = (self.step is not None or measured.step is None) and set(new) <= set(old) and \
            all(abs(a - b) <= 0.15 * max(a, 0.1 * self.plain) for a, b in pairs)
        for k, xs in measured.accept.items():
            mine, seen = self.accept.get(k, []), measured.visits.get(k, [])
            for i, x in enumerate(xs):
                r = seen[i] if i < len(seen) else 4.0
                if i >= len(mine) or abs(mine[i] - x) > max(0.1, 2 * math.sqrt(max(x * (1 - x), 0.01) / r)):
                    same = False
        for k, (d, n) in measured.shift.items():  # a shift within 0.5 (or two standard errors) of the kept one
            if k not in self.shift or abs(self.shift[k][0] - d) > max(0.5, 4 / math.sqrt(max(n, 1.0))):
                same = False
        for k, (c, n) in measured.conf.items():  # a confidence within 0.05 (or two standard errors) of the kept one
            if k in self.conf and abs(self.conf[k][0] - c) > max(0.05, 0.5 / math.sqrt(max(n, 1.0))):
                same = False
        if same:  # (a table kept before confidences were: gains them, and nothing else moves)
            new_conf = {k: [c, min(n, VISITS_CAP)] for k, (c, n) in measured.conf.items() if k not in self.conf}
            return replace(self, conf={**self.conf, **new_conf}) if new_conf else self
        shift, conf = {k: list(v) for k, v in self.shift.items()}, {k: list(v) for k, v in self.conf.items()}
        for pooled, new_pairs in ((shift, measured.shift), (conf, measured.conf)):  # [value, count]: weighted means
            for k, (x, n) in new_pairs.items():
                was, m = pooled.get(k, [x, 0.0])
                pooled[k] = [(was * m + x * n) / (m + n), min(m + n, VISITS_CAP)] if m + n else [x, n]
        per = {**old, **{k: (old[k] + v) / 2 if k in old else v for k, v in new.items()}}
        accept = {k: list(v) for k, v in self.accept.items()}
        visits = {k: list(self.visits.get(k, [])) + [30.0] * (len(v) - len(self.visits.get(k, [])))
                  for k, v in self.accept.items()}
        for k, xs in measured.accept.items():
            acc, vis = accept.setdefault(k, []), visits.setdefault(k, [])
            for i, x in enumerate(xs):
                r = measured.visits.get(k, [4.0] * len(xs))[i]
                if i < len(acc):
                    acc[i] = (acc[i] * vis[i] + x * r) / (vis[i] + r)
                    vis[i] = min(vis[i] + r, VISITS_CAP)
                else:
                    acc.append(x)
                    vis.append(min(r, VISITS_CAP))
        step = (self.step + measured.step) / 2 if self.step and measured.step else measured.step or self.step
        fixed = {**self.fixed, **{k: (self.fixed[k] + v) / 2 if k in self.fixed else v
                                  for k, v in measured.fixed.items()}}
        per.update({k: new[k] for k in measured.fixed if k not in self.fixed})  # kept before fixed parts: measured
        return Costs((self.plain + measured.plain) / 2, per, accept, visits, shift, step, fixed, conf)


def prior_costs(sources: Sequence[str], draft_ratio: dict[str, float], gpu: bool) -> Costs:
    """Before any measurement, in units of a plain step: verifying a token costs 10% on a CPU, 2% on a GPU;
    a draft model's token its size relative to the target's (at least 60% on a GPU); lookup nothing more."""
    verify = 0.02 if gpu else 0.10
    return Costs(1.0, {s: verify + (max(r, 0.6) if gpu and r else r)
                       for s, r in ((s, draft_ratio.get(s, 0.0)) for s in sources)})


@dataclass
class CostFit:
    """Ridge least squares of measured cycle seconds on [1, k * (source == s), (source == s)], pulled towards
    a prior; the first cycle is left out, plain steps launched ahead are kept apart (`step`), and cycles slower
    than twice the first fit's line are left out of the second (docs/policy.md)."""

    prior: Costs
    known: bool = False
    samples: deque[tuple[str | None, int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    plains: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    chained: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    first: bool = True

    def add(self, source: str | None, k: int, seconds: float, chained: bool = False) -> None:
        if self.first:
            self.first = False
            return
        if chained and not k:
            self.chained.append(seconds)
            return
        self.samples.append((source if k else None, k, seconds))
        if not k:
            self.plains.append(seconds)

    def plain_samples(self) -> int:
        return len(self.plains) + len(self.chained)

    def cycles(self) -> int:
        return len(self.samples) + len(self.chained) + (not self.first)

    def result(self) -> Costs | None:
        pts = self.samples
        if len(pts) + len(self.chained) < 4:
            return None
        # a plain step's own time: that of one in a run of them (the first after a draft is not overlapped: on the
        # line, the price of leaving drafting); only what this run measured
        step = float(np.median(self.chained)) if len(self.chained) >= 3 else None
        if not pts:  # nothing but chained plain steps: their own time; the line's intercept as kept, else theirs
            return Costs(self.prior.plain if self.known else step, {}, step=step)
        names = sorted(self.prior.per_token)
        # the line's intercept is a plain step launched on its own: measured, else the kept one, else a chained one
        # (a tenth cheaper, but a line through a few widths alone leans far either way), else no cycle is faster
        plain = float(np.median(self.plains)) if self.plains else self.prior.plain if self.known else \
            float(np.median(self.chained)) if self.chained else min(t for *_, t in pts)
        scale = 1.0 if self.known else plain / self.prior.plain  # a prior in seconds, or in units of a plain step
        anchored = self.known or self.plains or self.chained
        # columns: the intercept, each source's seconds per drafted token and fixed part of a cycle, their priors
        # worth this many samples (a fixed part's hardly: its split from the slope is what the widths measured say)
        reg = np.sqrt([8.0 if anchored else 2.0] + [2.0] * len(names) + [0.25] * len(names))
        px = np.diag(reg)
        py = reg * np.array([plain] + [self.prior.per_token.get(n, 0.0) * scale for n in names] +
                            [self.prior.fixed.get(n, 0.0) * scale for n in names])
        x = np.array([[1.0] + [k * (s == n) for n in names] + [float(s == n) for n in names] for s, k, _ in pts])
        y = np.array([t for _, _, t in pts])
        free = np.ones(x.shape[1], bool)  # a fixed part fitted below zero is fixed at zero, and the rest fitted again

        def solve(x, y):
            coef = np.zeros(x.shape[1])
            coef[free], *_ = np.linalg.lstsq(np.vstack([x, px])[:, free], np.concatenate([y, py]), rcond=None)
            return coef

        for _ in range(2):
            coef = solve(x, y)
            keep = y <= 2 * np.maximum(x @ coef, 1e-9)
            x, y = x[keep], y[keep]
        while (coef[1 + len(names):] < 0).any():
            free[1 + len(names):] &= coef[1 + len(names):] >= 0
            coef = solve(x, y)
        drafted = {s for s, _, _ in pts if s is not None}  # a source this run never drafted with: not measured
        per = {n: max(float(c), 0.0) for n, c in zip(names, coef[1:]) if n in drafted}
        fixed = {n: max(float(c), 0.0) for n, c in zip(names, coef[1 + len(names):]) if n in drafted}
        return Costs(max(float(coef[0]), 1e-6), per, step=step, fixed=fixed)


class AutoPolicy(WidthPolicy):
    """The policy of `draft = auto`: plan(contexts) -> Plan(source or None, width, stop)."""

    observes = True
    members = ("counts", "history", "points", "shadow", "contexts", "offs", "conf")

    def __init__(self, sources: Sequence[str], n_max: int, costs: Costs,
                 available: Callable[[str, list, int], list | None] = lambda s, c, k: None,
                 batch: int = 1, warm: bool = False, widest: dict[str, int] | None = None,
                 stops: Sequence[str] = ()):
        """`costs`: a kept table (warm, in seconds) or a prior in units of a plain step (a cold run then takes
        plain steps at its 2nd to 4th cycles); `widest`: a source's widest draft under n_max; `stops`: the
        sources whose drafts stop themselves (`floor`), asked for their widest draft."""
        self.sources, self.n_max, self.costs, self.available = list(sources), n_max, costs, available
        self.widest = {s: min(n_max, w) for s, w in (widest or {}).items()}
        self.stops = set(stops)
        self.batch = batch
        self.watching = True  # (off under typical acceptance: see watch)
        self.use(costs, warm)
        self.key = ""  # where the table is kept

    def use(self, costs: Costs, warm: bool) -> None:
        """Decide with this table for the whole run (warm: kept by earlier runs, in seconds)."""
        self.costs, self.warm = costs, warm
        self.fit = CostFit(costs, known=warm)
        self.reset()

    def fresh(self, name: str):
        """A row's `counts` (accepted, reached) and `offs` (the offset at each test: see offset) per source and
        position; `conf`: the target's confidence (decayed sum, weight); `points`: (z, y, tick) per source (see
        shift); `shadow`: source -> (position, tokens, estimates); `contexts`: its context at the last plan."""
        n = self.n_max
        if name in ("counts", "offs"):
            return {s: ([0.0] * n, [0.0] * n) if name == "counts" else [0.0] * n for s in self.sources}
        return {"conf": [0.0, 0.0], "points": {s: [] for s in self.sources}, "shadow": {}}.get(name, [])

    def reset(self, member: int | None = None) -> None:
        if member is not None and member < len(self.contexts):
            for s, draft in self.shadow[member].items():  # the row that ends: its pending drafts, as far as committed
                self._decide(s, member, self.contexts[member], *draft, final=True)
        super().reset(member)
        self._shifts, self._row_shifts = {}, {}  # cached per (source, member)
        if member is None:
            self.seen_conf = {s: [0.0, 0.0] for s in self.sources}  # per source: the rows' confidences summed, tests
            self.last, self.scored, self.tick = Plan(None, 0), 0, 0
            self.rate = self.best = 0.0  # tokens per second a row expects of the best plan (best: of the batch)
            self.own_estimates, self.own_tokens = {}, {}  # per source, per row: its own estimates of its tokens, them
            self.seen = self.fresh("counts")  # the run's counts per source, pooled over rows, undecayed: kept
            self.seen_points: dict[str, list] = {s: [] for s in self.sources}

    # ---- estimates ------------------------------------------------------------------------------------
    def acceptance(self, source: str, member: int = 0, explore: bool = False) -> list[float]:
        """Per position: the kept acceptance moved by the row's shift (`row_shift`), plus the exploration bonus."""
        reached = self.counts[member][source][1]
        d = self.row_shift(source, member)
        prior = self.costs.prior_accept(source, self.n_max)
        return [min(1.0, shifted(p, d) + (EXPLORE / (1 + (r + reached[0]) / 2) if explore else 0))
                for r, p in zip(reached, prior)]

    def row_shift(self, source: str, member: int = 0) -> float:
        """How far (in log-odds) this row's drafts of `source` pass more often than the kept acceptance says: its
        confidence offset now (`offset`) plus a MAP fit of its outcomes at the positions they reached."""
        got = self._row_shifts.get((source, member))
        if got is None:
            acc, reached = self.counts[member][source]
            prior = self.costs.prior_accept(source, self.n_max)
            pts = [pt for a, r, p, o in zip(acc, reached, prior, self.offs[member][source]) if r > 1e-6
                   for pt in ((_logit(p) + o / r, 1.0, a), (_logit(p) + o / r, 0.0, max(r - a, 0.0)))]
            got = self._row_shifts[(source, member)] = fit_shift(pts, 0.0, ROW_SD) + self.offset(source, member)
        return got

    def offset(self, source: str, member: int = 0) -> float:
        """How far (log-odds, within CONF_CAP) the target's confidence in this row's recent tokens is from its
        confidence where the source's kept acceptance was measured (0 where none is kept): a source that
        imitates the target agrees with it about as often as the target is sure (docs/perf/auto.md)."""
        kept = self.costs.conf.get(source)
        if kept is None:
            return 0.0
        total, weight = self.conf[member]
        c = (total + CONF_PRIOR * kept[0]) / (weight + CONF_PRIOR)
        return max(-CONF_CAP, min(CONF_CAP, _logit(c) - _logit(kept[0])))

    def shift(self, source: str, member: int = 0) -> float:
        """How far (in log-odds) this row's tokens of `source` have passed more often than the source estimated
        them: fitted to its verified tokens (older ones fading by DECAY a cycle), around the kept shift."""
        got = self._shifts.get((source, member))
        if got is None:
            pts = [(z, y, DECAY ** (self.tick - t)) for z, y, t in self.points[member][source]]
            got = self._shifts[(source, member)] = fit_shift(pts, self.costs.shift.get(source, [0.0])[0])
        return got

    def expected(self, source: str, k: int, member: int = 0, explore: bool = False,
                 estimates: Sequence[float] = ()) -> float:
        """Expected committed tokens of a cycle drafting k tokens of `source`: 1 + sum_j prod_{i<=j} a_i, where a
        source that estimates its own tokens (`estimates`) is expected what it says, shifted by the row's fit."""
        total, run = 1.0, 1.0
        d = self.shift(source, member) if estimates else 0.0
        chances = [shifted(e, d) for e in estimates[:k]] if estimates else self.acceptance(source, member, explore)[:k]
        for a in chances:
            run *= a
            total += run
        return total

    def measured(self) -> Costs | None:
        """This run's cycle costs, acceptance by position (positions reached at least 4 times) and confidence."""
        accept, visits = {}, {}
        for s, (acc, reached) in self.seen.items():
            known = [(a / r, r) for a, r in zip(acc, reached) if r >= 4]
            if known:
                accept[s], visits[s] = [a for a, _ in known], [r for _, r in known]
        shift = {s: [fit_shift([(z, y, 1.0) for z, y in pts], 0.0, 3.0), float(len(pts))]
                 for s, pts in self.seen_points.items() if len(pts) >= 8}
        costs = self.fit.result()
        if costs is not None:
            costs.accept, costs.visits, costs.shift = accept, visits, shift
            # (the sources scored by their kept acceptance: those that estimate their own tokens never read it)
            costs.conf = {s: [min(c / n, 1.0 - EDGE), min(n, VISITS_CAP)] for s, (c, n) in self.seen_conf.items()
                          if s in accept and s in self.stops and n >= 4}
        return costs

    def scores(self, contexts: list) -> dict[tuple[str | None, int], float]:
        """Expected tokens per second of every plan (with the exploration bonus); `best`: the best without it."""
        B = len(contexts)
        out = {(None, 0): B / self.costs.time(None, 0)}
        self.best = out[(None, 0)]
        self.own_estimates = {}
        for s in self.sources:
            widest = self.widest.get(s, self.n_max)
            # per row: how many tokens it has, or each one's estimate (None, unknown: as many as asked for)
            avail = self.available(s, contexts, widest) or [widest] * B
            est = self.own_estimates[s] = [[] if isinstance(a, numbers.Integral) else list(a) for a in avail]
            have = [int(a) if isinstance(a, numbers.Integral) else len(a) for a in avail]
            self.own_tokens[s] = [getattr(a, "tokens", None) for a in avail]
            for k in range(1, widest + 1):
                caps = [min(k, a) for a in have]
                if max(caps) < k:
                    break  # no row has more to give
                e = sum(self.expected(s, c, b, explore=True, estimates=est[b]) for b, c in enumerate(caps))
                out[(s, k)] = e / self.costs.time(s, max(caps))
                if not any(est):  # (a source's own estimates carry no bonus)
                    e = sum(self.expected(s, c, b, estimates=est[b]) for b, c in enumerate(caps))
                self.best = max(self.best, e / self.costs.time(s, max(caps)))
        return out

    # ---- the policy API ------------------------------------------------------------------------------
    def start(self, batch: int, law: str) -> None:
        self.watching = law != "typical"  # a plain step's token is no test of a draft's under typical acceptance
        super().start(batch, law)

    def keep(self, members: Sequence[int]) -> None:
        super().keep(members)
        self._shifts, self._row_shifts = {}, {}  # cached per member

    def plan(self, contexts: list) -> Plan:
        self.contexts = list(contexts)
        self.watch(contexts)
        if not self.warm and 1 <= self.fit.cycles() <= 3 and self.fit.plain_samples() < 3:
            self.last = Plan(None, 0)  # calibration (cold runs only): a plain step's time
            return self.last
        scores = self.scores(contexts)
        source, k = max(scores, key=lambda sk: (scores[sk], -sk[1]))  # ties: the narrower, plain first
        self.rate = self.best / len(contexts)  # the best a row expects, without optimism: tokens per second
        width = self.widest.get(source, self.n_max) if source in self.stops else k
        self.scored = k  # (the width it was scored at: what `estimate` reports)
        shadows = self.own_tokens if self.watching else {}  # (none under typical acceptance: see watch)
        for b, pending in enumerate(self.shadow):
            if k and source in pending:  # its drafts are tested for real from here: what was committed is learnt
                self._decide(source, b, contexts[b], *pending.pop(source), final=True)
            for s, tokens in shadows.items():
                if tokens[b] and s not in pending and not (k and s == source):
                    pending[s] = (len(contexts[b]), tokens[b], self.own_estimates[s][b])
        self.last = Plan(source, width, self.floor(source) if source in self.stops else None)
        return self.last

    def watch(self, contexts: list) -> None:
        """A deterministic source that did not draft is calibrated on the draft it would have made, against the
        tokens committed after it (the same Bernoulli outcome under the exact law; off under typical
        acceptance: `watching`). Committed tokens only, as every choice."""
        if not self.watching:
            return
        for b, (context, pending) in enumerate(zip(contexts, self.shadow)):
            for s, draft in list(pending.items()):
                if self._decide(s, b, context, *draft):
                    del pending[s]

    def _decide(self, source: str, member: int, context: list, pos: int, tokens: list, est: list,
                final: bool = False) -> bool:
        """Learn a pending draft's outcome once decided (a token differs, or all are matched); `final`: learn what
        the committed tokens decided so far (the matched ones pass; the rest untested, as past a full accept)."""
        new = context[pos: pos + len(tokens)]
        miss = next((i for i, (t, u) in enumerate(zip(tokens, new)) if t != u), None)
        if miss is None and len(new) < len(tokens) and not final:
            return False
        tested = len(new) if miss is None else miss + 1
        self._learn(source, member, [(_logit(e), float(i != miss)) for i, e in enumerate(est[:tested])])
        return True

    def _learn(self, source: str, member: int, new: list[tuple[float, float]]) -> None:
        """Points (log-odds of the source's estimate, passed) for the row's shift of the source's estimates."""
        if new:
            self._shifts.pop((source, member), None)
        self.points[member][source] = (self.points[member][source] + [(z, y, self.tick) for z, y in new])[
            -SHIFT_POINTS:]
        self.seen_points[source] = (self.seen_points[source] + new)[-4096:]

    def floor(self, source: str) -> tuple[float, float, list[float]]:
        """(keep, go_on, shifts) for a draft of `source` (drafters.autoregress): keep a drawn token while the
        chance that the whole draft passes is worth its verification at the run's best rate, draw another while
        it is worth a draft step too; each row's chances shifted by its fit for the source."""
        plain, per = self.costs.plain, self.costs.per_token
        step = per.get(source, plain)
        verify = min(per.get("ngram", 0.1 * plain), step)
        rate = max(self.rate, 1.0 / self.costs.time(None, 0))
        return min(0.95, verify * rate), min(0.95, step * rate), [self.shift(source, b) for b in range(self.batch)]

    def width(self) -> int:
        return self.last[1]

    def update(self, drafted: Sequence[int], accepted: Sequence[int], seconds: float | None = None,
               source: str | None = None, requested: Sequence[int] | None = None,
               chances: Sequence[Sequence[float]] | None = None, chained: bool = False) -> None:
        """`source` asked for `requested[b]` tokens of row b and drafted `drafted[b]`; a draft cut short at n after
        n passed counts as a rejection at n (n + 1 tokens either way). `chances`: its estimate of each drafted token."""
        requested = requested or drafted
        self.tick += 1
        self._row_shifts = {}  # every count decays each cycle
        if chances is not None and source in self.seen_points:
            for member, (n, a, cs) in enumerate(zip(drafted, accepted, chances)):
                self._learn(source, member, [(_logit(c), float(i < a)) for i, c in enumerate(cs[: min(n, a + 1)])])
        for member, (n, a, r) in enumerate(zip(drafted, accepted, requested)):
            for (acc, reached), offs in zip(self.counts[member].values(), self.offs[member].values()):
                for xs in (acc, reached, offs):
                    xs[:] = [x * DECAY for x in xs]
            self.history[member].append(n)
            if source not in self.seen:
                continue
            o = self.offset(source, member)  # (before this cycle's tokens are observed: what it was planned on)
            total, weight = self.conf[member]
            tested = list(range(min(n, a + 1, self.n_max)))  # positions past the first rejection were not tested
            if a == n < min(r, self.n_max):
                tested.append(n)  # cut short at n after n passed: n + 1 tokens, as a rejection at n gives
            for i in tested:
                for acc, reached in (self.counts[member][source], self.seen[source]):
                    reached[i] += 1
                    acc[i] += i < a
                self.offs[member][source][i] += o
            if weight and tested:  # once per row and cycle (a deep draft is no more evidence of it)
                self.seen_conf[source][0] += total / weight
                self.seen_conf[source][1] += 1
        k = max(drafted, default=0)
        if seconds is not None and (k or source is None):  # (a draft cut to nothing is neither plain nor k > 0)
            self.fit.add(source, k, seconds, chained)

    def observe(self, confidences: Sequence[Sequence[float]]) -> None:
        """The target's confidence (its largest probability, at temperature 1) at each token a row committed this
        cycle, in order: a function of the committed tokens alone, so choosing by it keeps the exact law. Called
        after `update` (which records the offset the cycle was planned with)."""
        for conf, cs in zip(self.conf, confidences):
            for c in cs:
                conf[0] = conf[0] * CONF_DECAY + c
                conf[1] = conf[1] * CONF_DECAY + 1.0
        self._row_shifts = {}

    def estimate(self, member: int = 0) -> float | None:
        s, k = self.last[0], self.scored
        if s is None:
            return None
        est = self.own_estimates.get(s)
        return self.expected(s, k, member, estimates=est[member] if est and member < len(est) else ()) - 1.0
