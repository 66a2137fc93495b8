"""The n-gram drafter's per-token estimates (what `draft = auto` weighs before drafting with it)."""

from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.costs import Costs
from mtpcli.policy import AutoPolicy

import helpers

PASSAGE = list(range(100, 124))
REPEATED = PASSAGE + [7, 8] + PASSAGE[:20]  # a 20-token passage again: its next 4 tokens follow


def drafter(contexts, shortest=2, longest=4):
    d = NgramDrafter(shortest, longest)
    d.add_rows(len(contexts))
    for b, c in enumerate(contexts):
        d.start(b, c[:1])
    return d


def test_one_estimate_per_token_that_propose_gives_at_each_width():
    contexts = [[5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 1, 2, 3, 4, 1, 2], [1, 2, 3, 4], PASSAGE + [7] + PASSAGE[:4]]
    d = drafter(contexts)
    for k in range(0, 10):
        got = [len(e) for e in d.available(contexts, k)]
        draft = d.propose(contexts, [k] * len(contexts), None, None)
        assert got == draft.lengths, k
        assert draft.lengths != [0] * len(contexts) or k == 0
    assert [len(e) for e in d.available(contexts, 8)] == [5, 4, 0, 8]


def test_a_short_match_of_common_tokens_is_a_guess_a_repeated_passage_is_not():
    comma, space = 11, 220
    short = [1, comma, space, 2, 3, 4, 5, 6, comma, space]  # ", " seen once, followed by something else
    (s,), (r,) = drafter([short]).available([short], 4), drafter([REPEATED]).available([REPEATED], 4)
    assert len(s) == 4 and len(r) == 4
    assert s[0] < 0.35 < 0.85 < r[0] and r[-1] > 0.9
    assert s == sorted(s) and s[1] > s[0]  # a token after right ones: the match is longer by then
    # the true match counts, not the n-gram found: the same last 4 tokens, preceded by more agreement
    mid = [9] * 8 + PASSAGE[:8] + [7] + [3] * 4 + PASSAGE[4:8]
    (m,) = drafter([mid]).available([mid], 1)
    longer = PASSAGE[:8] + [7] + PASSAGE[:8]
    (n,) = drafter([longer]).available([longer], 1)
    assert m[0] < n[0]
    # where the match ends and how long it truly is: back past the 4-gram, up to where the tokens differ
    for context, want in ((mid, (16, 4)), (longer, (8, 8)), ([5] * 5, (4, 4))):
        d = drafter([context])
        d.available([context], 1)  # (indexes the context)
        assert d.rows[0].find(context)[0] == want


def test_no_match_no_estimates():
    contexts = [[1, 2, 3, 4, 5], [], [7]]
    assert drafter(contexts).available(contexts, 8) == [[], [], []]


def test_auto_takes_a_plain_step_when_the_ngram_estimates_are_low():
    # the kept table says every n-gram token was accepted; the row's own estimates say ~4%
    kept = Costs(1.0, {"ngram": 0.05}, accept={"ngram": [1.0, 200.0]})
    est = {"v": 0.04}
    pol = AutoPolicy(["ngram"], 4, kept, lambda s, c, k: [[est["v"]] * k for _ in c], warm=True)
    assert helpers.source_width(pol.plan([[0]])) == (None, 0)
    est["v"] = 0.95
    assert helpers.source_width(pol.plan([[0]])) == ("ngram", 4)


def test_auto_weighs_the_real_drafters_estimates_not_its_count():
    # costs where a short match's tokens do not pay but a repeated passage's do
    kept = Costs(1.0, {"ngram": 0.3}, accept={"ngram": [1.0, 200.0]})
    short = [1, 11, 220, 2, 3, 4, 5, 6, 11, 220]
    for context, want in ((short, None), (REPEATED, "ngram")):
        d = drafter([context])
        pol = AutoPolicy(["ngram"], 4, kept, lambda s, c, k: d.available(c, k), warm=True)
        assert pol.plan([context]).source == want
        unknown = AutoPolicy(["ngram"], 4, kept, lambda s, c, k: None, warm=True)
        assert unknown.plan([context]).source == "ngram"  # no estimates: the kept acceptance stands for them
