"""Where a draft that stops itself stops (a draft model, MTP or EAGLE-3 heads: drafters.autoregress), in one place: a
drafted token's chance to pass from the draft's confidence (`passes`), moved by the row's shift (`shifted`), and the
thresholds draft = auto sets from its cost table (`Stop.of`). All of it depends on the draft's q, never on the token a
row would draw, so the exact law holds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .costs import BEND, Costs

EDGE = 1e-4  # estimates are taken within [EDGE, 1 - EDGE]


def logit(p: float) -> float:
    p = min(max(p, EDGE), 1 - EDGE)
    return math.log(p / (1 - p))


def shifted(p: float, shift: float) -> float:
    """p with its log-odds moved by `shift`."""
    return p if shift == 0.0 else 1.0 / (1.0 + math.exp(-(logit(p) + shift)))


def passes(conf: float, greedy: bool) -> float:
    """A drafted token's chance to pass, from the draft's confidence (its most likely token's probability), fitted
    on text that is not the benchmark's (docs/perf/cpu/draft-confidence.txt, by bench/draft_confidence.py at
    b092569): at T = 0 the argmaxes agree a little more often than the confidence says; at T > 0 a token passes
    with probability sum min(p, q), near 0.5 even where the draft is unsure and near 1 where it is sure (a curve
    that stopped at 0.95 there made sure tokens' passes a large log-odds shift, which then overstated every unsure
    token of a row: docs/perf/auto.md)."""
    return 0.1 + 0.9 * conf if greedy else 0.45 + 0.55 * conf * conf


@dataclass(frozen=True)
class Stop:
    """With a row's chance the product of `passes` over its positions so far, shifted by shifts[b], averaged over the
    batch's rows (a plain step would give each a token), the token just drawn is kept while that is at least `keep`
    (its verification's cost), and another step is taken only while it is at least `go_on` (a step's cost)."""

    keep: float = 0.0
    go_on: float = 0.0
    shifts: Sequence[float] = ()
    ends: frozenset[int] = frozenset()  # tokens that end a row (EOS): a row that drafts one drafts no further

    @staticmethod
    def of(costs: Costs, source: str, widest: int, rate: float, shifts: Sequence[float],
           ends: frozenset[int] = frozenset()) -> Stop:
        """Keep a drawn token while the chance that the whole draft passes is worth its verification at `rate` (the
        run's best per row), draw another while it is worth a draft step too."""
        step, per = costs.step, costs.per_token
        check = step * costs.verify * widest ** (BEND - 1)  # a token's, on average over its widest draft
        cost = per.get(source, step) + check  # (verify 0: in per_token, priced by lookup's)
        verify = check if costs.verify else min(per.get("ngram", 0.1 * step), cost)
        rate = max(rate, 1.0 / step)
        return Stop(min(0.95, verify * rate), min(0.95, cost * rate), tuple(shifts), ends)


class Rule:
    """A draft's stop rule, a step at a time: a row stops BEFORE it draws from a distribution whose most likely token
    is below p_min; under a `Stop`, the rows still drafting stop together (the batch's next step and its verify width
    are paid for all of them). `lengths`: where each row stops (its cap at most)."""

    def __init__(self, caps: list[int], greedy: bool, p_min: float = 0.0, stop: Stop | None = None):
        self.stop, self.greedy, self.p_min = stop or Stop(), greedy, p_min
        self.lengths, self.chance, self.raw = list(caps), [1.0] * len(caps), [[] for _ in caps]
        self.asked = list(caps)  # what each row was asked for: an end lowers it (nothing past an end was tested)
        self.weighs = p_min > 0.0 or self.stop.keep > 0.0 or self.stop.go_on > 0.0

    def drawn(self, j: int, tokens: list[int]) -> None:
        """Depth j drew these tokens (a row each): a row that drew an end keeps it and stops (what it would draft
        after it is never committed; a short answer's last cycle paid up to n_max - 1 such tokens: issue 58)."""
        for b, t in enumerate(tokens):
            if t in self.stop.ends and j < self.lengths[b]:
                self.lengths[b] = self.asked[b] = j + 1

    def weigh(self, j: int, confs: list[float]) -> None:
        """Depth j was drawn from distributions whose most likely tokens have these probabilities (a row each)."""
        lengths, shifts = self.lengths, self.stop.shifts
        for b, c in enumerate(confs):
            self.raw[b].append(passes(c, self.greedy))
            self.chance[b] *= shifted(self.raw[b][-1], shifts[b] if shifts else 0.0)
            if c < self.p_min and j < lengths[b]:
                lengths[b] = j
        going = [b for b in range(len(lengths)) if j < lengths[b]]
        mean = sum(self.chance[b] for b in going) / len(lengths)  # a plain step would give every row a token
        for b in going:  # the batch drafts on together or stops
            lengths[b] = j if mean < self.stop.keep else j + 1 if mean < self.stop.go_on else lengths[b]

    def chances(self) -> list[list[float]] | None:
        """Each row's drafted tokens' chances, unshifted (the points of the next shift's fit), where it weighed them."""
        return [r[:n] for r, n in zip(self.raw, self.lengths)] if self.raw[0] else None
