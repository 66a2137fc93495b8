"""`draft = auto`: every cycle ONE source and ONE width for the batch, the plan with the most expected committed
tokens per second:  score(s, k) = sum over rows of E_b[tokens | s, k] / T(s, k)  (width 0: a plain step, 1 a row),
from estimates and a `Costs` table fixed for the run. Every choice depends on committed tokens and on the table, never
on this cycle's draws: the exact law holds, and the same seed with the same kept table gives the same output.
Where E and T come from, where a draft model stops, the probe and a deferred draft model's gate: docs/policy.md."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .controller import Plan, WidthPolicy
from .costs import Costs, CostFit
from .stop import EDGE, Stop, logit, shifted

SHIFT_SD = 2.0  # a row's log-odds shift of a source's own estimates: its prior's spread around the kept shift (1.0
# kept a source that the kept shift calls good drafting wide through 5 failures in a row: issue 58)
PROBE_WIDTH = 2  # a probe drafts at most this many tokens
PROBE_SHARE = 8  # ... and a deferred source's probe catches up on at most a plain step's worth per this many cycles
SHIFT_POINTS = 96  # drafted tokens a row keeps per source for that fit
CONF_DECAY = 0.9  # a row's confidence: each committed token's weight fades by this at every later token
CONF_PRIOR = 2.0  # ... over the kept confidence, worth this many tokens
CONF_CAP = 1.5  # the most (in log-odds) a row's confidence moves the kept acceptance
CATCH_TIMED = 16  # a catch-up of at least this many tokens times the source's prefill (`Costs.prefill`)


def fit_shift(points: Sequence[tuple[float, float]], prior: float = 0.0, sd: float = SHIFT_SD) -> float:
    """The log-odds shift d that best explains outcomes y (passed 1, rejected 0) of tokens estimated sigmoid(z):
    the maximum a posteriori under a normal prior (prior, sd), by Newton's method (concave), within [-6, 6]."""
    if not len(points):
        return prior
    z, y = np.array(points, dtype=np.float64).T
    d = prior
    for _ in range(30):
        p = 1.0 / (1.0 + np.exp(-np.clip(z + d, -30.0, 30.0)))
        new = min(max(d - (float((y - p).sum()) - (d - prior) / sd**2) / (-float((p * (1 - p)).sum()) - sd**-2),
                      -6.0), 6.0)
        if abs(new - d) < 1e-7:
            return new
        d = new
    return d


@dataclass
class Row:
    """A row's evidence: per source, (log-odds of a drafted token's estimate, passed), for its `shift`; the target's
    confidence in its recent tokens (a decayed sum, its weight), for its `offset`."""

    points: dict[str, list]
    conf: list[float] = field(default_factory=lambda: [0.0, 0.0])


class AutoPolicy(WidthPolicy):
    """The policy of `draft = auto`: plan(contexts) -> Plan(source or None, width, stop)."""

    observes = True

    def __init__(self, sources: Sequence[str], n_max: int, costs: Costs,
                 available: Callable[[str, list, int], list | None] = lambda s, c, k: None,
                 batch: int = 1, warm: bool = False, widest: dict[str, int] | None = None,
                 stops: Sequence[str] = (), rebase: int = 0, prefills: Sequence[str] = (),
                 backlog: Callable[[str, list], list[int] | None] = lambda s, c: None,
                 ends: Sequence[int] = ()):
        """`costs`: a kept table (warm, in seconds) or a prior in units of a plain step (a cold run then decides
        by it as a kept table would, and from its `rebase`-th cycle on, if set, by what it has measured, as the next
        run will, its plain step timed first where it has not taken 3); `widest`: a source's widest draft under
        n_max; `stops`: the sources whose drafts stop themselves (`stop`), asked for their widest draft;
        `prefills`: the sources that come in only where their catch-up pays, `backlog(source, contexts)` the tokens
        each row would prefill now; `ends`: the tokens that end a row (a draft that stops itself stops after one)."""
        self.sources, self.n_max, self.available, self.rebase = list(sources), n_max, available, rebase
        self.widest = {s: min(n_max, w) for s, w in (widest or {}).items()}
        self.stops, self.batch, self.key = set(stops), batch, ""
        self.prefills, self.backlog, self.caught, self.ends = set(prefills), backlog, 0, frozenset(ends)
        self.use(costs, warm)

    def use(self, costs: Costs, warm: bool) -> None:
        """Decide with this table for the whole run (warm: kept by earlier runs, in seconds)."""
        self.costs, self.warm, self.fit = costs, warm, CostFit(costs, known=warm)
        self.reset()

    def fresh(self) -> Row:
        return Row({s: [] for s in self.sources})

    def reset(self, member: int | None = None) -> None:
        super().reset(member)
        self._shifts = {}
        if member is None:
            self.last, self.scored, self.rate, self.tick, self.probe = Plan(None, 0), 0, 0.0, 0, 8
            self.follow = None  # a probe's source, for its second cycle
            self.drafted = {s: 0 for s in self.sources}  # cycles each source drafted in this run
            self.own = {}  # per source, per row: its own estimates of the tokens it has (this cycle's)
            # the run's findings, pooled over rows, kept for the next run (`measured`): [passed, tested], points
            self.seen = {s: [0.0, 0.0] for s in self.sources}
            self.seen_points = {s: [] for s in self.sources}
            self.seen_conf = {s: [0.0, 0.0] for s in self.sources}  # per source: rows' confidences summed, cycles

    def keep(self, members: Sequence[int]) -> None:
        super().keep(members)
        self._shifts = {}

    # ---- estimates ------------------------------------------------------------------------------------
    def shift(self, source: str, member: int = 0) -> float:
        """How far (log-odds) this row's tokens of `source` passed more often than estimated, around the kept shift."""
        got = self._shifts.get((source, member))
        if got is None:
            got = self._shifts[(source, member)] = fit_shift(self.rows[member].points[source],
                                                             self.costs.shift.get(source, [0.0])[0])
        return got

    def offset(self, source: str, member: int = 0) -> float:
        """How far (log-odds, within CONF_CAP) the target's confidence in this row's recent tokens is from where
        the source's kept acceptance was measured (0 where none is kept): a draft that imitates the target agrees
        with it about as often as the target is sure."""
        kept = self.costs.conf.get(source)
        if kept is None:
            return 0.0
        total, weight = self.rows[member].conf
        c = (total + CONF_PRIOR * kept[0]) / (weight + CONF_PRIOR)
        return max(-CONF_CAP, min(CONF_CAP, logit(c) - logit(kept[0])))

    def expected(self, source: str, k: int, member: int = 0, estimates: Sequence[float] = ()) -> float:
        """Expected committed tokens of a cycle drafting k tokens of `source`."""
        d = self.shift(source, member) if estimates else self.offset(source, member)
        chances = [shifted(e, d) for e in estimates[:k]] if estimates else [shifted(self.costs.prior_accept(source), d)] * k
        total = run = 1.0
        for a in chances:
            run *= a
            total += run
        return total

    def scores(self, contexts: list) -> dict[tuple[str | None, int], float]:
        """Expected tokens per second of every plan."""
        out = {(None, 0): len(contexts) / self.costs.time(None, 0)}
        for s in self.sources:
            widest = self.widest.get(s, self.n_max)
            avail = self.available(s, contexts, widest)  # its estimates, or None: its widest, at the kept acceptance
            est = self.own[s] = [list(a) for a in avail] if avail is not None else [[] for _ in contexts]
            have = [len(a) for a in est] if avail is not None else [widest] * len(contexts)
            for k in range(1, widest + 1):
                caps = [min(k, a) for a in have]
                if max(caps) < k:
                    break  # no row has more to give
                out[(s, k)] = sum(self.expected(s, c, b, est[b]) for b, c in enumerate(caps)) / self.costs.time(s, k)
        return out

    # ---- the policy API ------------------------------------------------------------------------------
    def plan(self, contexts: list, left: Sequence[int] | None = None) -> Plan:
        if self.rebase and not self.warm and self.fit.cycles() >= self.rebase:
            if len(self.fit.plains) < 3 and self.fit.cycles() < self.rebase + 4:  # (a run's first timed cycle
                self.last, self.caught = Plan(None, 0), 0  # is left out) a plain step's time, for the table it
                return self.last  # re-bases on: here, not at the start, so a short first run drafts as later ones
            self._rebase()
        scores = self.scores(contexts)
        every = dict(scores)  # (a probe's plans: a deferred source's too, where its catch-up is cheap)
        caught = {s: self._catch_up(s, scores, contexts, left) for s in self.prefills}
        source, k = max(scores, key=lambda sk: (scores[sk], -sk[1]))  # ties: the narrower, plain first
        self.rate = scores[(source, k)] / len(contexts)  # the best a row expects: tokens per second
        lacking, probe = [s for s in self.sources if self.drafted[s] < 3] if self.tick >= self.probe else [], []
        if self.follow or lacking:  # a probe, after 8 cycles, then 16, 32, ...: a source drafted less than 3 times in
            # this run drafts its best plan two cycles in a row (the first catches up on what it missed, the second's
            # cost is measured), so that a table measured on a busy machine cannot keep it idle for good
            want = [self.follow] if self.follow else lacking  # (at most PROBE_WIDTH tokens where it is not the
            if source not in want:  # best plan anyway: a source the table calls poor is tried cheaply; a deferred
                # one where its catch-up costs at most a plain step per PROBE_SHARE cycles done, so that probes cost a
                # run at most that share: a long prompt with a short answer is not prefilled for a probe)
                cheap = {s for s in want if s not in caught or self.costs.catch_up(s, caught[s]) <= self.tick /
                         PROBE_SHARE * self.costs.step}
                probe = [sk for sk in every if sk[0] in cheap and sk[1] <= PROBE_WIDTH]
                source, k = max(probe, key=every.get, default=(source, k))
        widest = min(self.widest.get(source, self.n_max), PROBE_WIDTH if probe else self.n_max)
        self.scored, stops, self.caught = k, source in self.stops, caught.get(source, 0) if k else 0
        self.last = Plan(source, widest if stops else k, self.stop(source) if stops else None,
                         functools.partial(self.costs.time, source))
        return self.last

    def _catch_up(self, source: str, scores: dict, contexts: list, left: Sequence[int] | None) -> int:
        """The tokens `source` would prefill before drafting now, over the rows; its plans leave `scores` while that
        costs more than it would save over the rows' remaining tokens (`left`, unknown: no end) drafting at its best
        rate instead of the best plan without it."""
        backlog = self.backlog(source, contexts)
        mine = [v for (s, _), v in scores.items() if s == source]
        if not backlog or not mine:
            return 0
        tokens = sum(backlog)
        best, rest = max(mine), max(v for (s, _), v in scores.items() if s != source)  # (a plain step is one)
        saved = (sum(left) if left is not None else math.inf) * (1 / rest - 1 / best) if best > rest else 0.0
        if saved <= self.costs.catch_up(source, tokens):
            for sk in [sk for sk in scores if sk[0] == source]:
                del scores[sk]
        return tokens

    def _rebase(self) -> None:
        """A cold run's prior gives way, once, to the table of what the run has measured so far (what it has not
        measured: the prior's, in seconds), so that a first run decides as the runs after it will: from timings
        and acceptance of cycles already committed, never this cycle's draws."""
        got = self.measured()
        if got is None or not (got.step > 0 and math.isfinite(got.step)):
            return  # (nothing to decide by yet: again at the next cycle)
        self.rebase = 0
        scale = got.step / self.costs.step
        got.per_token = {s: got.per_token.get(s, self.costs.per_token.get(s, self.costs.step) * scale)
                         for s in self.sources}
        got.fixed = {s: got.fixed.get(s, self.costs.fixed.get(s, 0.0) * scale) for s in self.sources}
        got.prefill = {s: got.prefill.get(s, self.costs.prefill.get(s, 0.0) * scale) for s in self.prefills}
        got.shift = self.costs.shift  # (the run's own points are its rows' already: not counted twice)
        self.costs, self._shifts = got, {}

    def stop(self, source: str) -> Stop:
        """Where a draft of `source` stops (stop.Stop): at the run's best rate, each row shifted by its fit for it."""
        return Stop.of(self.costs, source, self.widest.get(source, self.n_max), self.rate,
                       [self.shift(source, b) for b in range(self.batch)], self.ends)

    def update(self, drafted: Sequence[int], accepted: Sequence[int], seconds: float | None = None,
               source: str | None = None, requested: Sequence[int] | None = None,
               chances: Sequence[Sequence[float]] | None = None, tree: bool = False) -> None:
        """`source` asked for `requested[b]` tokens of row b and drafted `drafted[b]`, `accepted[b]` passed; a
        draft cut short at n after n passed counts as rejected at n (n + 1 tokens either way), a full accept of
        what was asked as nothing past it (censored). `chances`: its estimate of each drafted token; `tree`: the
        draft was a tree (`drafted`: its first-child chain), its seconds not a chain's and its shape none of theirs."""
        requested = requested or drafted
        for b, (n, a, r) in enumerate(zip(drafted, accepted, requested)):
            if source not in self.seen:
                continue
            if chances is not None:
                new = [(logit(c), float(i < a)) for i, c in enumerate(chances[b][: min(n, a + 1)])]
                self.rows[b].points[source] = (self.rows[b].points[source] + new)[-SHIFT_POINTS:]
                self.seen_points[source] = (self.seen_points[source] + new)[-4096:]
                self._shifts.pop((source, b), None)
            tested = min(n, a + 1) + (a == n < r)  # positions past the first rejection were not tested
            self.seen[source][0] += min(a, tested)
            self.seen[source][1] += tested
            total, weight = self.rows[b].conf
            if weight and tested:  # once per row and cycle (a deep draft is no more evidence of it)
                self.seen_conf[source][0] += total / weight
                self.seen_conf[source][1] += 1
        k = max(drafted, default=0)
        self.tick += 1
        # a lacking source's first cycle once a probe is due (a probe, even one its stop cut to nothing): not timed
        cold = self.follow is None and self.drafted.get(source, 3) < 3 and self.tick > self.probe
        self.follow, self.probe = (source, self.probe * 2) if cold else (None, self.probe)
        if source in self.drafted:
            self.drafted[source] += bool(k)
        if k or source is None:  # (a draft cut to nothing: neither; a plain step launched ahead of a plan that
            # brought a deferred source in carries none of its catch-up)
            self.fit.add(source, k, None if cold or tree else seconds, None if tree else (len(drafted),),
                         self.caught if source in self.prefills and k and self.caught >= CATCH_TIMED else 0)

    def observe(self, confidences: Sequence[Sequence[float]]) -> None:
        """The target's confidence (its largest probability, at temperature 1) at each token a row committed this
        cycle: a function of the committed tokens alone, so choosing by it keeps the exact law."""
        for row, cs in zip(self.rows, confidences):
            conf = row.conf
            for c in cs:
                conf[0], conf[1] = conf[0] * CONF_DECAY + c, conf[1] * CONF_DECAY + 1.0

    def measured(self) -> Costs | None:
        """This run's cycle costs, acceptance (sources tested on at least 4 tokens) and shifts, kept for the next."""
        costs = self.fit.result()
        if costs is not None:
            costs.accept = {s: [a / n, n] for s, (a, n) in self.seen.items() if n >= 4}
            costs.conf = {s: [min(c / n, 1.0 - EDGE), min(n, 200.0)] for s, (c, n) in self.seen_conf.items()
                          if s in costs.accept and s in self.stops and n >= 4}  # (the sources scored by it)
            costs.shift = {s: [fit_shift(pts, 0.0, 3.0), float(len(pts))] for s, pts in self.seen_points.items()
                           if len(pts) >= 8}
        return costs

    def estimate(self, member: int = 0) -> float | None:
        s, k = self.last.source, self.scored
        if s is None:
            return None
        est = self.own.get(s)
        return self.expected(s, k, member, est[member] if est and member < len(est) else ()) - 1.0
