"""Issue 58: a deferred draft model that the kept table calls poor is still probed (so a table that busy runs moved
cannot switch it off for good), where the probe's catch-up is cheap; a long prompt's catch-up is not paid for a probe."""

from mtpcli.costs import Costs
from mtpcli.policy import AutoPolicy

POOR = Costs(1.0, {"ngram": 0.0, "model": 0.9}, {"model": 0.0}, accept={"model": [0.3, 200.0]},
             prefill={"model": 0.01}, verify=0.1)  # the model loses to a plain step at every width


def drafted(backlog: int, cycles: int = 20) -> list[int]:
    """The cycles in which the model drafted, a plain step's seconds each, its drafts rejected."""
    pol = AutoPolicy(["ngram", "model"], 8, POOR, lambda s, c, k: [[] for _ in c] if s == "ngram" else None,
                     warm=True, stops=["model"], prefills=["model"], backlog=lambda s, c: [backlog] * len(c))
    out = []
    for i in range(cycles):
        plan = pol.plan([[0] * (i + 1)], [40 - i])
        k = plan.width if plan.source else 0
        if plan.source == "model":
            out.append(i)
            backlog = 1  # caught up
        pol.update([k], [0], 1.0, plan.source)
    return out


def test_a_deferred_model_the_table_calls_poor_is_probed_where_its_catch_up_is_cheap():
    got = drafted(backlog=30)  # a short prompt: 0.3 of a step to catch up
    assert got[:2] == [8, 9]  # the probe, two cycles in a row once 8 are done (it was never drafted: the gate)


def test_a_long_prompts_catch_up_is_not_paid_for_a_probe():
    assert drafted(backlog=2000) == []  # 20 steps to catch up: a long prompt with a short answer stays plain
