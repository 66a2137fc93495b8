"""The history drafter and its store: matching (pure), exactness (chi-square and a negative control), greedy
identity, the store on disk (concurrent writers, cap, corrupt and unwritable stores, tokenizers kept apart), and
the `history` commands."""

import json
import multiprocessing as mp
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mtpcli.drafters import Draft
from mtpcli.drafters import history as hd
from mtpcli.drafters.history import OUT, Corpus, HistoryDrafter, Own, continuation, match_lengths
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.history import Doc, Store
from mtpcli.sampling import SamplingParams
from stattools import fit_two
from helpers import N, target_marginals


def doc(output, prompt=None):
    return Doc(np.array(output, np.int64), None if prompt is None else np.array(prompt, np.int64))


def store_of(*docs, tokenizer="t"):
    s = Store(tokenizer)
    s.docs = list(docs)
    return s


def draft_for(store, prompt, output, k=8):
    d = HistoryDrafter(store)
    d.add_rows(1)
    d.start(0, prompt)
    return d.look(0, prompt + output, k)[0]


# ---- matching --------------------------------------------------------------------------------------------------

def test_an_answer_seen_before_is_drafted_from_its_first_token():
    store = store_of(doc([5, 6, 7, 8, 9]), doc([5, 6, 7, 8, 9]), doc([5, 6, 7, 8, 9]))
    assert draft_for(store, [1, 2, 3], []) == [5, 6, 7, 8, 9]  # its prompt was not kept: the answer's start matches
    assert draft_for(store, [1, 2, 3], [5, 6]) == [7, 8, 9]
    assert draft_for(store, [1, 2, 3], [5, 6], k=2) == [7, 8]  # a narrower draft is the start of the wider one


def test_the_longest_match_wins_and_the_majority_of_its_continuations_is_drafted():
    # after (3, 4): the two longer matches (2, 3, 4) say 8, the shorter one says 9
    store = store_of(doc([2, 3, 4, 8, 8]), doc([2, 3, 4, 8, 8]), doc([7, 3, 4, 9, 9]))
    assert draft_for(store, [0], [2, 3, 4])[:2] == [8, 8]
    store = store_of(doc([1, 3, 4, 8]), doc([1, 3, 4, 9]), doc([1, 3, 4, 9]))  # equal matches: the votes decide
    assert draft_for(store, [0], [1, 3, 4])[:1] == [9]


def test_weak_evidence_drafts_short_and_none_drafts_nothing():
    one = draft_for(store_of(doc([3, 4, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19])), [0], [3, 4], k=12)
    many = draft_for(store_of(*[doc([3, 4, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19])] * 20), [0], [3, 4], k=12)
    assert 0 < len(one) < len(many) == 10
    split = store_of(*[doc([3, 4, t]) for t in range(10, 20)])  # ten different continuations: no draft
    assert draft_for(split, [0], [3, 4]) == []
    assert draft_for(store_of(doc([1, 2, 3])), [0], [7, 8]) == []  # no match at all


def test_a_draft_never_runs_past_the_end_of_an_answer_into_the_next():
    c = Corpus([doc([1, 2, 3]), doc([1, 2, 3])])
    assert (c.tokens < 0).sum() == 5  # END OUT 1 2 3 END OUT 1 2 3 END
    assert draft_for(store_of(doc([1, 2, 3]), doc([1, 2, 3])), [0], [1, 2]) == [3]


def test_the_rows_own_prompt_is_matched_like_ngram_lookup():
    prompt = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert draft_for(store_of(), prompt, [1, 2, 3, 4])[:3] == [5, 6, 7]


def test_a_kept_prompt_lengthens_the_match():
    store = store_of(doc([20, 21], prompt=[1, 2, 3]), doc([30, 31]), doc([30, 31]))
    # the first answer's prompt matches this row's: its match (prompt + OUT) is the longest
    assert draft_for(store, [1, 2, 3], [])[:1] == [20]
    assert continuation([], np.array([1, OUT]), 4) == [([], [])]


def test_a_match_never_counts_past_the_start_of_the_context():
    own = Own([5, 7, 9])
    own.sync([5, 7, 9, 5, 7])  # the answer so far repeats the prompt's start
    assert match_lengths(own.tokens, np.array([1]), own.tokens).tolist() == [2]


def test_an_old_long_match_is_found_behind_many_recent_short_ones():
    old = doc([40, 41, 42, 43, 44, 45, 1, 2, 48, 49])
    noise = [doc([7, 1, 2, 9, 3]) for _ in range(hd.CANDIDATES)]  # (1, 2) then 9, more often than looked at
    assert draft_for(store_of(old, *noise), [0], [42, 43, 44, 45, 1, 2])[:2] == [48, 49]
    assert draft_for(store_of(old, *noise), [0], [7, 1, 2])[:1] == [9]


def test_a_narrow_draft_is_the_start_of_the_wide_one_even_from_the_memo():
    rng = np.random.default_rng(0)
    for _ in range(100):
        docs = [doc(rng.integers(0, 5, rng.integers(3, 30)).tolist()) for _ in range(rng.integers(1, 8))]
        prompt, out = rng.integers(0, 5, 4).tolist(), rng.integers(0, 5, rng.integers(0, 6)).tolist()
        d = HistoryDrafter(store_of(*docs))
        d.add_rows(1)
        d.start(0, prompt)
        wide = len(d.available([prompt + out], 16)[0])
        for k in (1, 3, 16):
            narrow = d.propose([prompt + out], [k], None, [None]).lengths[0]
            assert narrow == min(k, wide)
            assert d.look(0, prompt + out, k)[1] == d.available([prompt + out], 16)[0][:k]  # the memo's estimates
            assert draft_for(store_of(*docs), prompt, out, k) == draft_for(store_of(*docs), prompt, out, 16)[:k]


def test_ids_past_the_targets_vocabulary_end_a_draft():
    d = HistoryDrafter(store_of(*[doc([5, 6, 700, 8])] * 3), vocab=100)
    d.add_rows(1)
    d.start(0, [1])
    assert d.look(0, [1, 5], 8)[0] == [6]
    assert len(d.look(0, [1, 5], 8)[1]) == 1  # one estimate per token kept


def test_the_start_of_an_answer_anchors_a_match_that_a_short_phrase_does_not():
    store = store_of(doc(list(range(10, 20))))  # one answer seen once, its prompt not kept
    start = draft_for(store, [1, 2, 3], [])  # the answer's start: the match reaches the unkept prompt's place
    mid = draft_for(store_of(doc([7, 4] + list(range(10, 20)))), [1, 2, 3], [4, 10])  # the same after a 2-token phrase
    assert start[:6] == list(range(10, 16)) and len(mid) < 3


# ---- the engine: exactness and greedy identity ------------------------------------------------------------------

def run_with_history(target, store, ids, sp, n, max_tokens, seed=0, batch_size=1, drafter_cls=HistoryDrafter,
                     add=True):
    from mtpcli.controller import FixedWidth

    drafter = drafter_cls(store)
    eng = Engine(target.model, drafter, FixedWidth(4), (), DecodeConfig(sampling=sp),
                 batch_size)
    outs = [[] for _ in range(n)]
    for ev in eng.generate([Request(c, ids, max_tokens, seed, c) for c in range(n)]):
        outs[ev.request].extend(ev.tokens)
        if ev.finish_reason and add:  # as the front end does: a finished answer drafts for the rest of the run
            store.add(ids, outs[ev.request])
    return outs, eng


def test_greedy_with_the_history_is_token_identical_to_plain_decoding(tiny):
    target, _ = tiny
    for prompt in ["def fib(n):", "the sea is ", "abcabcab"]:
        ids = list(target.tokenizer.encode(prompt))
        plain = Engine(target.model, None, None, (), DecodeConfig())
        want = [t for ev in plain.generate([Request(0, ids, 40, 0)]) for t in ev.tokens]
        store = store_of(doc(want), doc(list(reversed(want))))  # one right answer, one wrong
        (got,), eng = run_with_history(target, store, ids, SamplingParams(), 1, 40)
        assert got == want
        assert eng.stats.accepted > 20  # it drafted from the history, and the drafts were taken


@pytest.mark.parametrize("kind", ["sliding-window", "hybrid"])
def test_greedy_with_the_history_is_token_identical_on_windowed_and_hybrid_targets(tmp_path, kind):
    """History drafts on a target whose sliding-window layers are masked and on one whose recurrent layers roll back
    by snapshot and replay: the same tokens as plain decoding, right and wrong drafts alike."""
    from mtpcli import models
    from tiny import make_target

    target = models.load(str(make_target(kind, tmp_path)))
    ids = list(target.tokenizer.encode("abcabcabcabc"))
    plain = Engine(target.model, None, None, (), DecodeConfig())
    want = [t for ev in plain.generate([Request(0, ids, 60, 0)]) for t in ev.tokens]
    store = store_of(doc(want[:30] + list(reversed(want[30:]))), doc(want[:30] + list(reversed(want[30:]))))
    (got,), eng = run_with_history(target, store, ids, SamplingParams(), 1, 60)
    assert got == want
    assert eng.stats.accepted > 10 and eng.stats.accepted < eng.stats.drafted  # drafts taken, and some rejected


def test_a_batch_under_auto_with_answers_shared_mid_run_is_greedy_identical(tiny):
    """Several prompts as one batch under draft = auto (n-gram lookup and the history), each finished answer drafting
    for the rows still running, rows refilled and dropped: every row gets plain decoding's tokens."""
    from mtpcli.drafters.auto import AutoDrafter
    from mtpcli.drafters.ngram import NgramDrafter
    from mtpcli.costs import Costs
    from mtpcli.policy import AutoPolicy

    target, _ = tiny
    prompts = ["def fib(n):", "the sea is ", "abcabcab", "def fib(n):", "x = 1\ny = ", "the sea is "]
    ids = [list(target.tokenizer.encode(p)) for p in prompts]
    lengths = [30, 44, 25, 50, 37, 41]
    want = []
    for i, n in zip(ids, lengths):
        plain = Engine(target.model, None, None, (), DecodeConfig())
        want.append([t for ev in plain.generate([Request(0, i, n, 0)]) for t in ev.tokens])
    store = store_of(doc(want[1][:20]))
    drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "history": HistoryDrafter(store)})
    pol = AutoPolicy(["ngram", "history"], 8, Costs(1.0, {"ngram": 0.02, "history": 0.02}), drafter.available_of,
                     warm=True)
    eng = Engine(target.model, drafter, pol, (), DecodeConfig(), batch_size=3)
    outs = [[] for _ in prompts]
    for ev in eng.generate([Request(r, i, n, 0) for r, (i, n) in enumerate(zip(ids, lengths))]):
        outs[ev.request].extend(ev.tokens)
        if ev.finish_reason:
            store.add(ids[ev.request], outs[ev.request])
    assert outs == want
    assert eng.stats.sources["history"].accepted > 30  # repeated prompts drafted from earlier rows' answers


def sampled_history(tiny, sp, drafter_cls=HistoryDrafter):
    """2,500 completions of 3 tokens, 250 rows at a time, drafting from a history of earlier samples (and from
    each other as they finish)."""
    target, _ = tiny
    ids = list(target.tokenizer.encode("abcabcab"))
    seeds, _ = run_with_history(target, store_of(), ids, sp, 40, 6, seed=7, batch_size=40)
    store = store_of(*[doc(o) for o in seeds if o])
    outs, eng = run_with_history(target, store, ids, sp, N, 3, batch_size=250, drafter_cls=drafter_cls)
    arr = np.array([o[:2] for o in outs])
    return ids, arr[:, 0], arr[:, 1], eng


@pytest.mark.slow
@pytest.mark.parametrize("sp", [SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=20, top_p=0.9)], ids=str)
def test_the_history_drafter_is_distributed_as_the_target(tiny, sp):
    target, _ = tiny
    ids, first, second, eng = sampled_history(tiny, sp)
    p1, p2 = target_marginals(target, ids, sp)
    assert 0.1 < eng.stats.acceptance_rate < 0.98 and eng.stats.drafted > N  # it drafted, and was often wrong
    assert fit_two(first, second, p1, p2) == (True, True)


class VotesAsQ(HistoryDrafter):
    """NOT exact: it reports a made-up draft distribution q (half its mass on the drafted token), though the draft was
    not drawn from it."""

    size = 0  # the target's output size

    def propose(self, contexts, caps, sp, keys, source=None) -> Draft:
        d = super().propose(contexts, caps, sp, keys)
        if d.k == 0:
            return d
        V = self.size
        q = mx.full((len(caps), d.k, V), 0.5 / (V - 1))
        onehot = (mx.arange(V) == d.tokens[..., None])
        return Draft(d.tokens, mx.where(onehot, 0.5, q), d.lengths, d.requested)


@pytest.mark.slow
def test_negative_control_a_history_drafter_with_a_made_up_q_fails(tiny):
    sp = SamplingParams(temp=1.0)
    target, _ = tiny
    VotesAsQ.size = target.model(mx.array([[0]])).shape[-1]
    ids, first, second, _ = sampled_history(tiny, sp, drafter_cls=VotesAsQ)
    p1, p2 = target_marginals(target, ids, sp)
    assert fit_two(first, second, p1, p2) != (True, True)


# ---- the store ----------------------------------------------------------------------------------------------------

def test_a_store_keeps_outputs_per_tokenizer_and_prompts_only_when_asked(tmp_path):
    path = tmp_path / "h.sqlite"
    a = Store("tokA", path=path)
    a.add([1, 2], [3, 4])
    a.save()
    b = Store("tokA", path=path, keep_prompts=True)
    b.add([1, 2], [5, 6])
    b.save()
    docs = Store("tokA", path=path).load().docs
    assert [d.output.tolist() for d in docs] == [[3, 4], [5, 6]]
    assert docs[0].prompt is None and docs[1].prompt.tolist() == [1, 2]
    assert Store("tokB", path=path).load().docs == []  # another tokenizer's ids never draft here


def _write_many(path, worker):
    for i in range(5):
        s = Store("tok", path=Path(path))
        for j in range(40):
            s.add([0], [worker, i, j])
        assert s.save() == 40


def _two_writers(write, path):
    """Run write(path, worker) in two processes at once (workers 1 and 2); both must succeed."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=write, args=(str(path), w)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0


@pytest.mark.slow
def test_two_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "h.sqlite"
    _two_writers(_write_many, path)
    got = {tuple(d.output.tolist()) for d in Store("tok", path=path).load().docs}
    assert got == {(w, i, j) for w in (1, 2) for i in range(5) for j in range(40)}


def _write_capped(path, worker):
    for i in range(10):
        s = Store("tok", path=Path(path), cap_bytes=4 * 3 * 50)  # 50 documents of 3 ids
        for j in range(20):
            s.add([0], [worker, i, j])
        s.save()


@pytest.mark.slow
def test_concurrent_writers_under_a_cap_keep_exactly_the_newest(tmp_path):
    import sqlite3

    path = tmp_path / "h.sqlite"
    _two_writers(_write_capped, path)
    ids = [r[0] for r in sqlite3.connect(path).execute("SELECT id FROM docs ORDER BY id")]
    assert len(ids) == 50 and ids == list(range(401 - 50, 401))  # 400 written, the newest 50 kept, no gap


def test_the_size_cap_holds_and_the_oldest_go_first(tmp_path):
    path = tmp_path / "h.sqlite"
    for i in range(30):
        s = Store("tok", path=path, cap_bytes=4 * 100)  # 100 token ids
        s.add([], [i] * 10)
        s.save()
    docs = Store("tok", path=path).load().docs
    assert sum(d.output.size for d in docs) <= 100
    assert [int(d.output[0]) for d in docs] == list(range(20, 30))


def test_a_corrupt_store_is_left_untouched_and_the_run_goes_on(tmp_path, capsys):
    path = tmp_path / "h.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    s = Store("tok", path=path).load()
    s.add([1], [2, 3])
    assert s.broken and s.docs == [] and s.save() == 0
    assert path.read_bytes() == before
    assert "unreadable" in capsys.readouterr().err


def test_an_unwritable_store_warns_and_loses_only_this_runs_outputs(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    s = Store("tok", path=blocker / "mtpcli" / "history.sqlite").load()  # its folder cannot be made
    s.add([1], [2, 3])
    assert s.save() == 0
    assert "history not saved" in capsys.readouterr().err


# ---- the command line ---------------------------------------------------------------------------------------------

def _gen(cli, model, *extra, env=None):
    r = cli("generate", "-m", model, "-p", "abcabcab", "--max-tokens", "40", "--format", "json", *extra, env=env)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def test_generate_with_history_drafts_from_the_last_run_and_stays_greedy_identical(cli, tiny_paths, tmp_path):
    model = str(tiny_paths["target"])
    plain = _gen(cli, model, "--draft", "none")
    first = _gen(cli, model, "--history")  # under auto (what it picks depends on measured times)
    second = _gen(cli, model, "--draft", "history")  # the history alone: what it drafts depends on the store only
    assert first["text"] == second["text"] == plain["text"]
    hist = second["stats"]["sources"].get("history", {})
    assert hist.get("accepted", 0) >= 20  # the second run drafted its answer from the first
    assert second["settings"]["history"] is True
    r = cli("history", "stats", "--json")
    info = json.loads(r.stdout)
    assert info["tokenizers"][0]["docs"] == 2 and info["use"]["accepted"] >= 20
    r = cli("history", "stats")
    assert r.returncode == 0 and b"outputs" in r.stdout and b"accepted" in r.stdout
    by_source = cli("stats", "--by", "source").stdout.decode()
    assert "history" in by_source  # what the history contributed, beside the other sources
    lines = cli("history", "export", "--text").stdout.decode().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["text"] == plain["text"]
    assert cli("history", "clear").returncode != 0  # no terminal, no --yes: refused
    assert cli("history", "clear", "--yes").returncode == 0
    assert json.loads(cli("history", "stats", "--json").stdout)["tokenizers"] == []


def test_another_tokenizer_gets_nothing_from_the_history(cli, tiny_paths, tmp_path):
    from tiny import CHARS, SPECIAL, make_model

    other = make_model(tmp_path / "other", vocab=SPECIAL + CHARS[::-1])
    model = str(tiny_paths["target"])
    alone = _gen(cli, str(other), "--draft", "history", env={"XDG_DATA_HOME": str(tmp_path / "empty")})
    _gen(cli, model, "--history")  # the first tokenizer's answer is kept...
    again = _gen(cli, str(other), "--draft", "history")  # ... and changes nothing for the other (--draft history: on)
    assert again["text"] == alone["text"]
    assert again["stats"]["sources"]["history"] == alone["stats"]["sources"]["history"] | {
        "seconds": again["stats"]["sources"]["history"]["seconds"],
        "time_share": again["stats"]["sources"]["history"]["time_share"]}
    info = json.loads(cli("history", "stats", "--json").stdout)
    assert sorted(t["docs"] for t in info["tokenizers"]) == [1, 1]


def test_a_corrupt_store_never_fails_a_run(cli, tiny_paths, tmp_path):
    data = tmp_path / "xdg_data_home" / "mtpcli"
    data.mkdir(parents=True)
    (data / "history.sqlite").write_bytes(b"garbage" * 50)
    r = cli("generate", "-m", str(tiny_paths["target"]), "-p", "abc", "--max-tokens", "8", "--history")
    assert r.returncode == 0 and r.stdout.strip()
    assert b"unreadable" in r.stderr and (data / "history.sqlite").read_bytes() == b"garbage" * 50
    r = cli("history", "stats")
    assert r.returncode != 0 and b"unreadable" in r.stderr and b"Traceback" not in r.stderr


def test_log_prompts_keeps_the_prompt_and_draft_history_cannot_run_without_it(cli, tiny_paths):
    model = str(tiny_paths["target"])
    _gen(cli, model, "--history", "--log-prompts")
    (row,) = [json.loads(line) for line in cli("history", "export").stdout.decode().splitlines()]
    assert row["prompt"] and row["output"]
    r = cli("generate", "-m", model, "-p", "abc", "--draft", "history", "--no-history")
    assert r.returncode == 2 and b"--draft history needs the history" in r.stderr and not r.stdout


def test_the_history_flags_are_in_help_and_the_cap_flag_caps_the_store(cli, tiny_paths):
    helptext = cli("generate", "--help", env={"COLUMNS": "200"}).stdout.decode()
    for flag in ("--history", "--no-history", "--history-max-mb"):
        assert flag in helptext, flag
    assert "history" in cli("--help").stdout.decode()
    model = str(tiny_paths["target"])
    for _ in range(3):
        _gen(cli, model, "--history", "--history-max-mb", "0.0002")  # 209 bytes: 52 token ids, one answer of 40
    info = json.loads(cli("history", "stats", "--json").stdout)
    assert info["tokenizers"][0]["docs"] == 1 and info["tokenizers"][0]["bytes"] <= 0.0002 * (1 << 20)


def test_agent_json_turns_the_history_on_and_the_readme_documents_it():
    from mtpcli import config

    assert config.resolve("agent-json", {}, env={}).history is True
    assert config.resolve(None, {}, env={"MTPCLI_HISTORY": "1"}).history is True
    assert config.resolve(None, {}, env={}).history is False  # opt-in
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for text in ("--history", "mtpcli history stats", "history clear", "history export", "docs/perf/history.md"):
        assert text in readme, text


def test_with_the_history_on_only_its_drafts_are_16_wide_unless_n_max_is_set(tiny):
    from mtpcli import assemble, config
    from mtpcli.config import AUTO_N_MAX

    target, _ = tiny

    def policy(**over):
        cfg = config.settle(config.resolve("exact", {"model": "tiny", "history": True, **over}, env={}), False)
        return assemble.engine(cfg, target, None, store=store_of()).policy

    pol = policy()
    assert pol.n_max == 16 and pol.widest == {"ngram": AUTO_N_MAX}
    pinned = policy(n_max=16)  # set by the user: every source may draft 16
    assert pinned.n_max == 16 and pinned.widest == {}
