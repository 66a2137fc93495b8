"""Output constrained by a JSON schema or a grammar (issue 59): the law samples the target's p restricted to the
allowed tokens and renormalised (mask first, then the sampler's filters), for every drafter, trees and batches;
forced tokens are drafted for free; T = 0 equals plain decoding under the same constraint; bad input is one line."""

import json

import mlx.core as mx
import numpy as np
import pytest
from llguidance import LLMatcher

from mtpcli import constrain, models
from mtpcli.controller import FixedWidth
from mtpcli.drafters import NoDraft
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.sampling import SamplingParams, probs
from mtpcli.tables import summary_rows
from mtpcli.tree import Spec
from stattools import fits
from helpers import N, marginals, resampled_from_p, run
from tiny import make_target

PROMPT = "abcabcab"
# several tokens allowed at the first two positions, then two forced ones
LARK = 'start: /[a-f]/ /[a-f]/ "::" /[0-9]/'
CASES = [SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=3)]


def grammar(text: str = LARK) -> str:
    return constrain._checked(LLMatcher.grammar_from_lark(text), "test")


def guide(loaded) -> constrain.Guide:
    return constrain.Guide(loaded.tokenizer, loaded.tokenizer.eos_token_ids, loaded.config["vocab_size"])


def engine(loaded, drafter, width, batch_size=1, **cfg):
    """An engine under the constraints of the drafter's guide (one made with its own: ModelDrafter(..., guide=))."""
    return Engine(loaded.model, drafter, FixedWidth(width), loaded.tokenizer.eos_token_ids, DecodeConfig(**cfg),
                  batch_size, guide=getattr(drafter, "guide", None) or guide(loaded),
                  trees=getattr(drafter, "trees", None) is not None)


def restricted_law(loaded, g: str, ids: list[int], sp: SamplingParams):
    """law(context) for `marginals`: the target's logits masked by a fresh matcher after the generated tokens, then
    shaped by the sampler (computed here from llguidance directly, not through the Guide)."""
    tok = constrain.tokenizer(loaded.tokenizer, loaded.tokenizer.eos_token_ids, loaded.config["vocab_size"])
    V = loaded.config["vocab_size"]

    def law(ctx):
        m = LLMatcher(tok, g)
        assert m.consume_tokens(ctx[len(ids):])
        allowed = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")[:V].astype(bool)
        logits = loaded.model(mx.array([ctx]))[0, -1]
        return np.array(probs(mx.where(mx.array(allowed), logits, -mx.inf), sp, full=True), dtype=np.float64)
    return law


def draws(eng, ids, g, n=N):
    outs = run(eng, [Request(c, ids, 2, 0, c, g) for c in range(n)])
    eos = next(iter(eng.eos))
    return [np.bincount([(o + [eos])[i] for o in outs], minlength=eng.target.model.args.vocab_size) for i in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("sp", CASES, ids=str)
@pytest.mark.parametrize("source", ["model", "ngram", "tree", "ngram-tree"])
def test_speculation_under_a_constraint_samples_the_restricted_target(tiny, sp, source):
    target, draft = tiny
    ids, g = list(target.tokenizer.encode(PROMPT)), grammar()
    p1, p2 = marginals(restricted_law(target, g, ids, sp), ids)
    assert (p1 > 0).sum() > 2 and (p2 > 0).sum() > 2  # several tokens allowed at each position
    spec = Spec(6, 3) if source.endswith("tree") else None
    drafter = NgramDrafter(1, 3, spec) if source.startswith("ngram") else ModelDrafter(draft.model, trees=spec, guide=guide(target))
    eng = engine(target, drafter, 3, batch_size=250, sampling=sp)
    first, second = draws(eng, ids, g)
    assert eng.stats.drafted > 0 and eng.stats.accepted < eng.stats.drafted  # it speculated, and rejected some
    assert bool(eng.stats.trees) == source.endswith("tree")
    assert fits(first, p1) and fits(second, p2)
    plain = probs(target.model(mx.array([ids]))[0, -1], sp, full=True)  # the unconstrained target is told apart
    assert not fits(first, np.array(plain))


@pytest.mark.slow
def test_negative_control_under_a_constraint_fails(tiny, monkeypatch):
    """The exact law's negative control (helpers.resampled_from_p: a rejection resampled from the restricted p instead
    of the residual) under the same constraint: its draws no longer fit the restricted target."""
    from mtpcli import verify

    target, draft = tiny
    sp = CASES[0]
    ids, g = list(target.tokenizer.encode(PROMPT)), grammar()
    p1, p2 = marginals(restricted_law(target, g, ids, sp), ids)
    monkeypatch.setattr(verify, "exact", resampled_from_p)
    first, second = draws(engine(target, ModelDrafter(draft.model, guide=guide(target)), 3, batch_size=250, sampling=sp), ids, g)
    assert not (fits(first, p1) and fits(second, p2))


@pytest.mark.parametrize("kind", ["full-attention", "sliding-window", "hybrid"])
def test_greedy_under_a_schema_equals_plain_decoding_one_row_and_a_batch(tiny, tmp_path, kind):
    target = tiny[0] if kind == "full-attention" else models.load(str(make_target(kind, tmp_path)))
    draft = tiny[1]
    g = constrain.schema({"type": "integer"}, "test")  # (digits: what the tiny vocabulary can write of JSON)
    prompts = [list(target.tokenizer.encode(p)) for p in ("abcabcab", "12 34 12 3", "x = 1\nx = ")]
    reqs = lambda: [Request(i, p, 12, 0, 0, g) for i, p in enumerate(prompts)]  # noqa: E731
    plain = run(engine(target, NoDraft(), 0), reqs())
    assert all(o and all(target.tokenizer.decode([t]).isdigit() for t in o) for o in plain)
    for drafter in (ModelDrafter(draft.model, guide=guide(target)), NgramDrafter(1, 3)):
        for batch in (1, 3):
            eng = engine(target, drafter, 3, batch_size=batch)
            assert run(eng, reqs()) == plain, (type(drafter).__name__, batch)
    one = run(engine(target, NoDraft(), 0), reqs()[:1])
    assert one == plain[:1]


def test_forced_tokens_are_drafted_free_and_counted_apart(tiny):
    target, draft = tiny
    ids = list(target.tokenizer.encode(PROMPT))
    eng = engine(target, ModelDrafter(draft.model, guide=guide(target)), 2)
    out = run(eng, [Request(0, ids, 10, 0, 0, grammar('start: "::" /[a-f]/ /[0-9]/'))])[0]
    text = target.tokenizer.decode(out)
    assert text[:2] == "::" and len(text) == 4 and eng.stats.source_trace[0] == "forced"
    assert eng.stats.forced_tokens == 2 and eng.stats.sources["forced"].accepted == 2
    assert eng.stats.to_dict()["forced_tokens"] == 2
    assert ("forced_tokens", "2 (40% of the generated tokens)") in summary_rows(eng.stats.to_dict())


def test_a_batch_mixes_forced_drafted_and_unconstrained_rows_and_keeps_greedy_identity(tiny):
    """A matcher per row: in one cycle a row drafts its forced tokens while another's draft model drafts, and a row
    without a constraint decodes as it would without one."""
    target, draft = tiny
    ids = list(target.tokenizer.encode(PROMPT))
    gs = [grammar('start: "::" /[a-f]{2}/ "::" /[0-9]/'), grammar(), None]
    reqs = lambda: [Request(i, ids, 12, 0, 0, g) for i, g in enumerate(gs)]  # noqa: E731
    plain = run(engine(target, NoDraft(), 0), reqs())
    eng = engine(target, ModelDrafter(draft.model, guide=guide(target)), 3, batch_size=3)
    assert run(eng, reqs()) == plain
    texts = [target.tokenizer.decode(o) for o in plain]
    assert texts[0][:2] == texts[0][4:6] == "::" and texts[1][2:4] == "::" and len(texts[2]) == 12
    rows = [eng.runs[i] for i in range(3)]
    assert rows[0].forced_tokens >= 2 and rows[0].source_trace[0] == "forced"
    assert rows[1].source_trace[0] == "model" and rows[2].forced_tokens == 0


@pytest.mark.parametrize("sp", [SamplingParams(), CASES[0]], ids=["greedy", "T=1"])
def test_the_draft_model_proposes_under_the_constraint_along_its_own_path(tiny, monkeypatch, sp):
    """No token the draft model drafts is forbidden at its position (its q restricted after its earlier drafts)."""
    target, draft = tiny
    ids = list(target.tokenizer.encode(PROMPT))
    seen, real = [], constrain.Guide.masks

    def watch(self, d):
        out = real(self, d)
        seen.append((out[1], list(d.lengths)) if out else None)
        return out
    monkeypatch.setattr(constrain.Guide, "masks", watch)
    eng = engine(target, ModelDrafter(draft.model, guide=guide(target)), 4, batch_size=4, sampling=sp)
    run(eng, [Request(c, ids, 12, 0, c, grammar("start: /[a-f0-9]{10}/")) for c in range(8)])
    assert eng.stats.drafted > 20 and all(allowed == lengths for allowed, lengths in seen)


def test_the_eos_waits_for_a_complete_value_and_a_cut_value_is_told(tiny):
    target, _ = tiny
    ids = list(target.tokenizer.encode(PROMPT))
    eng = engine(target, NoDraft(), 0)
    events = list(eng.generate([Request(0, ids, 3, 0, 0, grammar())]))  # 5 tokens needed, 3 allowed
    assert events[-1].finish_reason == "length" and events[-1].incomplete and eng.incomplete == 1
    eng = engine(target, NoDraft(), 0)
    events = list(eng.generate([Request(0, ids, 10, 0, 0, grammar())]))
    assert events[-1].finish_reason == "stop" and not events[-1].incomplete


@pytest.mark.parametrize("args, says", [
    (["--schema", '{"type": "object", "dependentSchemas": {"a": {}}}'], "--schema: Unimplemented keys"),
    (["--schema", '{"type":'], "--schema: the schema is not valid JSON"),
    (["--schema", "missing.json"], "--schema missing.json: cannot read the schema"),
    (["--grammar", "bad.lark"], "--grammar bad.lark:"),
    (["--json", "--schema", "{}"], "give one"),
])
def test_a_bad_constraint_is_one_line_before_any_model_loads(cli, tmp_path, args, says):
    (tmp_path / "bad.lark").write_text("start: undefined_rule\n")
    r = cli("generate", "-m", "/nonexistent/model", "-p", "x", *args)
    err = r.stderr.decode()
    assert r.returncode != 0 and says in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "nonexistent" not in err, err


def test_a_value_cut_by_max_tokens_and_a_bad_row_schema_fail_alone(cli, tiny_paths, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "abc", "schema": {"type": "integer"}},
        {"prompt": "abc", "schema": {"type": "integer", "minimum": 5, "maximum": 2}},
        {"prompt": "abc"}]) + "\n")
    (tmp_path / "g.lark").write_text('start: /[a-f]{3}/ "::"\n')
    r = cli("generate", "-m", tiny_paths["target"], "--prompts-jsonl", rows, "--format", "jsonl", "--draft", "ngram",
            "--max-tokens", "6", "--grammar", tmp_path / "g.lark", "--quiet")
    err = r.stderr.decode()
    out = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert r.returncode != 0 and "Traceback" not in err, err
    assert "minimum (5) is greater than maximum (2)" in err and len(out) == 3
    assert out[0]["text"].isdigit() and out[1].get("error") and out[2]["text"][3:5] == "::"
    r = cli("generate", "-m", tiny_paths["target"], "-p", "abc", "--grammar", tmp_path / "g.lark", "--max-tokens", "2",
            "--quiet")
    err = r.stderr.decode()
    assert r.returncode != 0 and "max_tokens was reached before the value was complete" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_constraint_with_a_sharded_target_is_refused_in_one_line():
    from mtpcli import config
    from mtpcli.errors import UsageError

    cfg = config.resolve(None, {"json": True, "draft": "none"}, env={})
    config.settle(cfg, False)  # (one process: fine)
    with pytest.raises(UsageError, match="not supported with --distributed"):
        config.settle(cfg, False, sharded=True)
