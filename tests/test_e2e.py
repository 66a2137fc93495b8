"""End to end (issue 54): under draft = auto a draft model's prefill is deferred and paid only where the answer is
long enough to pay it back; T = 0 stays plain decoding's tokens; the law holds with the deferred model at the first
and later positions (a negative control that peeks at the token fails); a run's seconds in --stats-json and bench;
the agent-loop benchmark on the tiny model."""

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import assemble, bench, config, models
from mtpcli.costs import CostFit, Costs
from mtpcli.drafters.auto import AutoDrafter
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine
from mtpcli.policy import AutoPolicy
from mtpcli.sampling import SamplingParams
from stattools import fit_two
from test_auto import run
from test_engine import N, target_marginals

ROOT = Path(__file__).resolve().parents[1]
# a prompt with little to look up; the draft model is known to pass 95% of its tokens and costs 10% of a step per
# token, n-gram lookup is dear: per cycle the model pays, its catch-up costs 5% of a step per prompt token
PROMPT = "the quick brown fox jumps over the lazy dog while five boxing wizards quietly judge my sphinx of quartz"
PAYS = Costs(1.0, {"ngram": 0.5, "model": 0.1}, accept={"model": [0.95, 100.0]}, prefill={"model": 0.05})


def deferred_engine(pair, costs, sp=SamplingParams(), batch_size=1, drafter_cls=ModelDrafter):
    target, draft = pair
    drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "model": drafter_cls(draft.model, defer=True)})
    pol = AutoPolicy(["ngram", "model"], 4, costs, drafter.available_of, warm=True, stops=["model"],
                     prefills=["model"], backlog=drafter.backlogs)
    return Engine(target.model, drafter, pol, (), DecodeConfig(sampling=sp), batch_size)


def plain(pair, ids, max_tokens):
    return run(Engine(pair[0].model, None, None, (), DecodeConfig()), ids, max_tokens=max_tokens)


@pytest.mark.parametrize("answer, joins", [(6, False), (120, True)])
def test_the_deferred_draft_model_prefills_only_where_the_answer_pays_for_it(tiny, answer, joins):
    """103 prompt tokens cost 5.2 steps to catch up on; drafting saves ~0.7 of a step per token: a 6-token answer
    is decoded without the model (it prefills nothing), a 120-token one brings it in; both are plain decoding's
    tokens at T = 0."""
    ids = list(tiny[0].tokenizer.encode(PROMPT))
    eng = deferred_engine(tiny, PAYS)
    assert run(eng, ids, max_tokens=answer) == plain(tiny, ids, answer)
    st = eng.stats
    if joins:
        assert st.sources["model"].cycles > 3 and st.draft_prefill_tokens >= len(ids) - 1
        assert st.source_trace[0] == "model"  # it came in at once, its prompt caught up on in its first cycle
        assert st.draft_prefill_s > 0
    else:
        assert "model" not in st.sources and st.draft_prefill_tokens == 0 and st.draft_prefill_s < 0.05


@pytest.mark.parametrize("kind", ["sliding-window", "hybrid"])
def test_greedy_with_the_deferred_model_is_plain_decoding_on_windowed_and_hybrid_targets(tiny, tmp_path, kind):
    from tiny import make_target

    target = models.load(str(make_target(kind, tmp_path)))
    ids = list(target.tokenizer.encode(PROMPT[:60]))
    eng = deferred_engine((target, tiny[1]), PAYS)
    assert run(eng, ids, max_tokens=80) == plain((target, None), ids, 80)
    assert eng.stats.sources["model"].cycles and eng.stats.draft_prefill_tokens == len(ids) - 1


def test_a_ragged_batch_brings_the_deferred_model_in_row_by_row_and_stays_plain_decoding(tiny):
    """Rows of different prompts decoded together, refilled as they finish: each row's context is prefilled into
    the draft model where the batch first drafts with it after the row started."""
    from mtpcli.engine import Request

    target, _ = tiny
    texts = [PROMPT, PROMPT[:40], "x = 1\ny = ", PROMPT[20:90]]
    eng = deferred_engine(tiny, PAYS, batch_size=3)
    outs = {i: [] for i in range(len(texts))}
    for ev in eng.generate([Request(i, list(target.tokenizer.encode(t)), 30 + 10 * i, 0) for i, t in
                            enumerate(texts)]):
        outs[ev.request].extend(ev.tokens)
    for i, t in enumerate(texts):
        assert outs[i] == plain(tiny, list(target.tokenizer.encode(t)), 30 + 10 * i)[0], i
    assert eng.stats.sources["model"].cycles and eng.stats.draft_prefill_tokens > 0


def test_an_eager_draft_model_prefills_the_prompt_at_the_start_and_counts_it(tiny):
    target, draft = tiny
    ids = list(target.tokenizer.encode(PROMPT))
    drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "model": ModelDrafter(draft.model)})
    pol = AutoPolicy(["ngram", "model"], 4, PAYS, drafter.available_of, warm=True, stops=["model"])
    eng = Engine(target.model, drafter, pol, (), DecodeConfig())
    assert run(eng, ids, max_tokens=6) == plain(tiny, ids, 6)
    assert eng.stats.draft_prefill_tokens == len(ids) - 1 and eng.stats.sources["model"].cycles  # (no gate)


def test_the_gate_weighs_savings_over_the_remaining_tokens_against_the_catch_up():
    backlog = {"n": 100}
    pol = AutoPolicy(["ngram", "model"], 4, PAYS, lambda s, c, k: [[] for _ in c] if s == "ngram" else None,
                     warm=True, stops=["model"], prefills=["model"], backlog=lambda s, c: [backlog["n"]] * len(c))
    assert pol.plan([[0]], [6]).source is None  # 6 tokens save ~4 steps, the catch-up costs 5
    assert pol.plan([[0]], [60]).source == "model" and pol.caught == 100
    assert pol.plan([[0], [0]], [4, 4]).source is None  # two rows: twice the savings, twice the catch-up
    assert pol.plan([[0]]).source == "model"  # no end known: it pays
    backlog["n"] = 2
    assert pol.plan([[0]], [2]).source == "model"  # caught up: a cycle's backlog costs next to nothing


def test_a_catch_up_times_the_sources_prefill_and_is_kept():
    fit = CostFit(Costs(1.0, {"model": 0.1}, fixed={"model": 0.0}), known=True)
    for _ in range(4):
        fit.add(None, 0, 1.0)
    fit.add("model", 4, 1.0 + 0.4 + 200 * 0.03, (1,), caught=200)  # a cycle that first caught up on 200 tokens
    got = fit.result()
    assert got.prefill == {"model": pytest.approx(0.03)} and "model" not in got.per_token  # not a cycle's time
    assert Costs.from_dict(got.to_dict()).prefill == got.prefill
    kept = Costs(1.0, {"model": 0.1}, prefill={"model": 0.05})
    assert kept.settled(Costs(1.0, {"model": 0.1}, prefill={"model": 0.055})) is kept  # within its error
    assert kept.settled(got).prefill["model"] == pytest.approx(0.07 * (0.05 / 0.07) ** 0.5 - 0.02)  # (runs=1: half
    # way in log(x + 0.02), x a share of a step: costs.MOVE)


def test_auto_defers_a_draft_model_and_a_pinned_width_keeps_it_eager(tiny_paths):
    target = models.load(str(tiny_paths["target"]))
    draft = models.load(str(tiny_paths["draft"]))
    for flags, deferred in (({}, True), ({"num_draft_tokens": 3}, False), ({"draft": "model"}, False)):
        cfg = config.settle(config.resolve(None, {"model": str(tiny_paths["target"]),
                                                  "draft_model": str(tiny_paths["draft"]), **flags}, env={}), False)
        eng = assemble.engine(cfg, target, draft)
        model = eng.drafter.sources["model"] if isinstance(eng.drafter, AutoDrafter) else eng.drafter
        assert model.defer is deferred, flags
        if deferred:
            assert eng.policy.prefills == {"model"} and eng.policy.costs.prefill["model"] > 0  # priced by the prior


def test_generate_at_t0_equals_draft_none_and_reports_where_the_time_went(cli, tiny_paths, tmp_path):
    outs, docs = [], []
    for i, extra in enumerate((["--draft", "none"], ["--draft-model", tiny_paths["draft"]])):
        sj = tmp_path / f"s{i}.json"
        r = cli("generate", "--model", tiny_paths["target"], *extra, "--no-chat", "--max-tokens", 24,
                "--stats-json", sj, input=PROMPT.encode())
        assert r.returncode == 0, r.stderr.decode()
        outs.append(r.stdout)
        docs.append(json.loads(sj.read_text()))
        assert "seconds: load " in r.stderr.decode()
    assert outs[0] == outs[1]
    for d in docs:
        assert d["load_s"] > 0 and d["prefill_s"] > 0 and d["decode_s"] > 0 and d["ttft_s"] > 0
    assert docs[1]["draft_prefill_tokens"] == 0  # (the tiny draft is the target's size: it never pays)


# ---- the law with the deferred draft model ---------------------------------------------------------------------

class PeekingJoin(ModelDrafter):
    """NOT exact: once caught up, a row keeps the model's draft only where its first token is the draft's most
    likely one (whether the model drafts depends on the token it would draft)."""

    def propose(self, contexts, caps, sp, keys, plan=None):
        d = super().propose(contexts, caps, sp, keys, plan)
        if d.k:
            top = (d.tokens[:, 0] == mx.argmax(d.q[:, 0], axis=-1)).tolist()
            d.lengths = [n if ok else 0 for n, ok in zip(d.lengths, top)]
        return d


CHEAP = Costs(1.0, {"ngram": 0.02, "model": 0.1}, accept={"model": [0.9, 50.0]}, prefill={"model": 1e-4})
SPS = [SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=20, top_p=0.9)]


def law_pairs(tiny, sp, prompt, drafter_cls=ModelDrafter):
    target, _ = tiny
    ids = list(target.tokenizer.encode(prompt))
    eng = deferred_engine(tiny, CHEAP, sp, batch_size=250, drafter_cls=drafter_cls)
    arr = np.array([o[:2] for o in run(eng, ids, N, 3)])
    p1, p2 = target_marginals(target, ids, sp)
    return eng, *fit_two(arr[:, 0], arr[:, 1], p1, p2)


def joined_at(eng) -> list[int]:
    """Per request, the cycle at which the draft model first drafted (-1: never)."""
    return [r.source_trace.index("model") if "model" in r.source_trace else -1 for r in eng.runs.values()]


@pytest.mark.slow
@pytest.mark.parametrize("sp", SPS, ids=str)
def test_the_deferred_model_is_distributed_as_the_target_when_it_joins_at_once(tiny, sp):
    """Its first cycle catches up on the prompt and drafts the first position."""
    eng, first, second = law_pairs(tiny, sp, "the sea is ")
    at = joined_at(eng)
    assert at.count(0) > N * 0.9 and eng.stats.draft_prefill_tokens >= N * 10
    assert first and second


@pytest.mark.slow
@pytest.mark.parametrize("sp", SPS, ids=str)
def test_the_deferred_model_is_distributed_as_the_target_when_it_joins_later(tiny, sp):
    """n-gram lookup drafts a batch's first cycle on the repeated prompt (the model's catch-up is not worth it yet);
    the model comes in once the rows have left the pattern: for many rows its first draft is at a later position,
    after a catch-up on the prompt and what lookup committed (the rest: rows refilled into a batch it drafts for)."""
    eng, first, second = law_pairs(tiny, sp, "abcabcabcabc")
    at = joined_at(eng)
    assert sum(a >= 1 for a in at) > N * 0.15 and at.count(0) > N * 0.1, np.bincount(np.array(at) + 1)
    assert eng.stats.sources["ngram"].cycles > 0
    assert first and second


@pytest.mark.slow
def test_negative_control_a_join_that_peeks_at_the_token_fails(tiny):
    _, first, second = law_pairs(tiny, SamplingParams(temp=1.0), "the sea is ", drafter_cls=PeekingJoin)
    assert not (first and second)


# ---- bench and the agent loop ------------------------------------------------------------------------------------

def test_bench_reports_the_whole_run_and_its_ratio(tiny_paths, tmp_path, capsys):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.txt").write_text(PROMPT)
    result = bench.bench(model=str(tiny_paths["target"]), draft_model=str(tiny_paths["draft"]), draft=None,
                         profile_names=["exact"], seeds=2, prompt_source=str(tmp_path / "p"), max_tokens=8,
                         prompt_tokens=None, baselines=["ar", "mlx-lm-plain"], flags={"chat": False},
                         argv=["bench"], log=False)
    auto, ar, mlx = result["arms"]
    for a in result["arms"]:
        e = a["e2e"]
        assert e["load_s"] > 0 and e["prefill_s"]["median"] > 0 and e["decode_s"]["median"] > 0
        parts = e["load_s"] + sum(e[k]["median"] for k in ("prefill_s", "draft_prefill_s", "decode_s"))
        assert e["run_s"]["min"] <= parts * 1.5 and e["run_s"]["max"] >= parts / 1.5
        assert a["e2e_ratio"] == pytest.approx(auto["e2e"]["run_s"]["median"] / e["run_s"]["median"])
    assert auto["e2e"]["load_s"] > ar["e2e"]["load_s"]  # the default loads the draft model too; plain does not
    bench.render(result)
    out = capsys.readouterr().out
    assert "e2e ratio" in out and "draft prefill s" in out


def test_bench_ships_a_class_of_long_prompts_with_short_answers():
    from mtpcli import prompts

    turns = [it for it in prompts.bench_set(None) if "agent-turn" in it.source]
    assert len(turns) >= 2 and all(len(it.text) > 4000 for it in turns)


@pytest.mark.slow
def test_the_agent_loop_benchmark_runs_on_the_tiny_model(tmp_path):
    out = tmp_path / "loop.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_loop.py"), "--smoke", "--out", str(out)],
                       capture_output=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    doc = json.loads(out.read_text())
    arms = [a["name"] for a in doc["arms"]]
    assert len(arms) == 5 and arms[0].startswith("mlx-lm")
    for t in doc["turns"]:
        assert set(t["arms"]) == set(arms)
        for name, m in t["arms"].items():
            assert m["wall_s"] > 0 and m["ttft_s"] is not None and m["ttft_s"] > 0, (name, m)
        assert len({m["text"] for n, m in t["arms"].items() if not n.startswith("mlx-lm")}) == 1  # T = 0: alike
        assert t["arms"][arms[0]]["text"]
    assert doc["turns"][1]["prompt_tokens"] > doc["turns"][0]["prompt_tokens"]  # the transcript grows
    assert "loop" in r.stdout.decode()
