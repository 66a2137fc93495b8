"""Issue 58: a source that fails costs little. A probe of a source the table calls poor drafts at most PROBE_WIDTH
tokens (not its best plan's width); a lookup whose drafts keep being rejected at their first token stops drafting
wide within a few cycles, even where the kept shift calls its estimates good (an agent's warm turn: 2 of 27 n-gram
tokens passed, each cycle a 7-token verification)."""

from mtpcli.costs import Costs
from mtpcli.policy import AutoPolicy
from mtpcli.stop import Stop

import helpers


def test_a_probe_of_a_poor_source_drafts_at_most_two_tokens_and_a_source_that_is_best_anyway_is_not_cut():
    # the model passes 70% of its tokens but a cycle costs a whole step more: its best plan (width 6) loses to plain
    dear = Costs(1.0, {"ngram": 0.05, "model": 0.3}, {"model": 1.0}, accept={"model": [0.7, 1e4]})
    p = AutoPolicy(["ngram", "model"], 6, dear, lambda s, c, k: [[]] if s == "ngram" else None, warm=True,
                   stops=["model"])
    scores = p.scores([[0]])
    assert max(scores, key=scores.get) == (None, 0)  # (the model's best, 3 tokens, and its draft's width, 6)
    plans = []
    for _ in range(10):
        plan = p.plan([[0]])
        plans.append((plan.source, plan.width))
        p.update([plan.width if plan.source else 0], [0], source=plan.source, requested=[plan.width], seconds=1.0)
    assert plans[:8] == [(None, 0)] * 8 and plans[8:] == [("model", 2)] * 2
    assert isinstance(p.last.stop, Stop)  # (its stop priced as a draft of that width)
    good = AutoPolicy(["ngram", "model"], 6, Costs(1.0, {"ngram": 0.05, "model": 0.3}, accept={"model": [0.95, 1e4]}),
                      lambda s, c, k: [[]] if s == "ngram" else None, warm=True, stops=["model"])
    for _ in range(12):  # the ngram source lacks drafts, but has nothing to draft: the model drafts at its width
        plan = good.plan([[0]])
        assert (plan.source, plan.width) == ("model", 6)
        good.update([6], [6], source="model", requested=[6], seconds=1.0)


def test_a_lookup_rejected_at_its_first_token_stops_drafting_wide_after_three_cycles_though_the_kept_shift_calls_it_good():
    kept = Costs(1.0, {"ngram": 0.0, "model": 0.3}, accept={"model": [0.1, 1e4]}, shift={"ngram": [1.9, 500.0]},
                 verify=0.11)  # the concave verify pass of this CPU; ngram's estimates ran 1.9 log-odds low
    est = [0.7, 0.75, 0.8, 0.82, 0.84, 0.85, 0.86]  # a match of ~6 tokens in a long prompt that the answer leaves
    p = AutoPolicy(["ngram", "model"], 7, kept, lambda s, c, k: [est[:k]] if s == "ngram" else None, warm=True)
    widths = []
    for _ in range(8):
        s, k = helpers.source_width(p.plan([[0]]))
        widths.append(k if s == "ngram" else 0)
        p.update([k], [0], source=s, requested=[k], chances=[est[:k]] if s == "ngram" else None, seconds=1.0)
    assert widths[0] == 7  # the kept shift: a good source, drafted wide
    assert max(widths[3:]) <= 2  # three first-token rejections are enough: then a token or two, each a
    assert sum(widths) <= 24  # fraction of a step (a prior spread of 1 log-odds: 7, 7, 7, 7, 6, 5, 4, 3: 46 tokens)
