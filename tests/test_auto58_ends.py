"""Issue 58, short answers: a draft that stops itself stops after an end token (EOS). Nothing drafted after it is
ever committed, so a short answer's last cycle paid up to n_max - 1 wasted draft steps and their verification (the
real pair: a 0.5B draft token ~a third of a plain step). Where it stops depends on the draft's own draws only."""

import mlx.core as mx
import numpy as np
import pytest

from mtpcli.costs import Costs
from mtpcli.drafters import autoregress
from mtpcli.policy import AutoPolicy
from mtpcli.sampling import SamplingParams
from mtpcli.stop import Rule, Stop
from stattools import fits

import helpers
from helpers import N, target_marginals

V, END = 8, 5


def steps(path):
    """A draft that draws `path`, one token a call, sure of each (the stop's own rule goes on)."""
    calls = []

    def step(t):
        calls.append(t)
        logits = np.full((1, V), -10.0, dtype=np.float32)
        logits[0, path[len(calls) - 1]] = 10.0
        return mx.array(logits)
    return step, calls


def test_a_draft_stops_after_it_draws_an_end_token_and_not_before():
    go = Stop(0.01, 0.01, (0.0,), frozenset([END]))
    step, calls = steps([1, 2, END, 3, 4, 6])
    d = autoregress(step, [6], SamplingParams(temp=0.0), [None], stop=go)
    assert d.lengths == [3] and d.tokens.tolist() == [[1, 2, END]] and len(calls) == 3  # (was 6 draft steps)
    assert d.requested == [3]  # (an end asks for nothing past it: a full accept is censored, not a cut short)
    step, calls = steps([1, 2, END, 3, 4, 6])
    d = autoregress(step, [6], SamplingParams(temp=0.0), [None], stop=Stop(0.01, 0.01, (0.0,)))
    assert d.lengths == [6] and len(calls) == 6  # without ends: as before
    step, calls = steps([1, 2, 3, 4, 6, 7])
    assert autoregress(step, [6], SamplingParams(temp=0.0), [None], stop=go).lengths == [6]


def test_a_fully_accepted_draft_that_ended_at_an_end_token_is_not_counted_a_rejection():
    p = AutoPolicy(["model"], 6, Costs(1.0, {"model": 0.1}), stops=["model"], ends=[END])
    step, _ = steps([1, 2, END, 3, 4, 6])
    d = autoregress(step, [6], SamplingParams(temp=0.0), [None], stop=Stop(0.01, 0.01, (0.0,), frozenset([END])))
    before = list(p.seen["model"])
    p.update(d.lengths, d.lengths, 0.01, "model", d.requested)  # (the engine passes the draft's requested)
    assert [a - b for a, b in zip(p.seen["model"], before)] == [3, 3]  # 3 of 3 tested passed, none failed past the end


def test_autos_stop_carries_the_targets_end_tokens():
    p = AutoPolicy(["model"], 6, Costs(1.0, {"model": 0.1}, accept={"model": [0.9, 1e4]}), warm=True,
                   stops=["model"], ends=[END, 7])
    plan = p.plan([[0]])
    assert helpers.source_width(plan) == ("model", 6) and plan.stop.ends == {END, 7}


def _first_two_with_ends(tiny, monkeypatch, law):
    """The first two tokens' counts of N runs of auto at T = 1 whose draft model's stop takes half the vocabulary for
    end tokens (the run's own end: none), a drawn end handled by `law` (Rule.drawn's signature), and the target's
    marginals."""
    from test_auto import BOTH, auto_engine, run

    cut = []

    def drawn(self, j, tokens):  # the rows a drawn end token stops short of their length
        cut.extend(b for b, t in enumerate(tokens) if t in self.stop.ends and j + 1 < self.lengths[b])
        law(self, j, tokens)
    monkeypatch.setattr(Rule, "drawn", drawn)
    sp = SamplingParams(temp=1.0)
    target, _ = tiny
    ids = list(target.tokenizer.encode("abcabcabcabc"))
    eng = auto_engine(tiny, BOTH, sp, batch_size=250)
    eng.policy.ends = frozenset(range(0, 1 << 20, 2))
    arr = np.array([o[:2] for o in run(eng, ids, N, 3)])
    assert eng.stats.sources["model"].drafted > 300 and len(cut) > 100  # the model drafted, and stopped at ends
    p1, p2 = target_marginals(target, ids, sp)
    return [np.bincount(arr[:, i], minlength=len(p1)) for i in (0, 1)], (p1, p2)


@pytest.mark.slow
def test_auto_whose_drafts_stop_after_an_end_token_is_distributed_as_the_target(tiny, monkeypatch):
    """Drafts stop after a drawn end token (Rule.drawn): the first two tokens still follow the target's law."""
    (c1, c2), (p1, p2) = _first_two_with_ends(tiny, monkeypatch, Rule.drawn)
    assert fits(c1, p1) and fits(c2, p2)


@pytest.mark.slow
def test_negative_control_a_draft_that_drops_the_end_token_it_drew_is_not_the_target(tiny, monkeypatch):
    """Stopping BEFORE the drawn end (its length then depends on the token it would draft): the kept drafts are q
    restricted to non-ends, judged as q's, and the law breaks."""
    def before(self, j, tokens):
        for b, t in enumerate(tokens):
            if t in self.stop.ends and j < self.lengths[b]:
                self.lengths[b] = self.asked[b] = j
    (c1, c2), (p1, p2) = _first_two_with_ends(tiny, monkeypatch, before)
    assert not (fits(c1, p1) and fits(c2, p2))


@pytest.mark.parametrize("kind", ["full-attention", "sliding-window", "hybrid"])
def test_auto_greedy_with_end_tokens_is_token_identical_to_plain_decoding(tiny, tmp_path, kind, monkeypatch):
    """End tokens taken from the target's and the draft model's own greedy answers (so that the run ends early and
    drafts draw ends), auto's draft model stopping after a drawn one: the same tokens as plain decoding with the same ends."""
    from test_auto import BOTH, run

    from mtpcli import models
    from mtpcli.drafters.auto import AutoDrafter
    from mtpcli.drafters.model import ModelDrafter
    from mtpcli.drafters.ngram import NgramDrafter
    from mtpcli.engine import DecodeConfig, Engine
    from tiny import make_target

    target, draft = tiny
    if kind != "full-attention":
        target = models.load(str(make_target(kind, tmp_path)))
    ids = list(target.tokenizer.encode("abcabcabcabc"))
    free, drafts = (run(Engine(m.model, None, None, (), DecodeConfig()), ids, max_tokens=60)[0] for m in (target, draft))
    ends = tuple(sorted({*free[20:22], *drafts[8:10]}))  # (tokens both draw late: the answer ends at their first)
    plain = run(Engine(target.model, None, None, ends, DecodeConfig()), ids, max_tokens=60)
    drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "model": ModelDrafter(draft.model)})
    policy = AutoPolicy(["ngram", "model"], 4, BOTH, drafter.available_of, warm=True, stops=["model"], ends=ends)
    eng = Engine(target.model, drafter, policy, ends, DecodeConfig())
    drew, drawn = [], Rule.drawn
    monkeypatch.setattr(Rule, "drawn", lambda self, j, ts: (drew.extend(t for t in ts if t in ends), drawn(self, j, ts)))
    assert run(eng, ids, max_tokens=60) == plain and len(plain[0]) < 60  # (it ended at an end token)
    assert eng.stats.drafted > 0 and drew  # (a draft drew an end and stopped there)
