"""Several prompts decoded as one batch: rows equal their single decodes, stay exact, fail alone."""

import json
import math

import numpy as np
import pytest

from mtpcli import cache
from mtpcli.controller import EmaController, FixedWidth
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.sampling import SamplingParams
from stattools import fits
from helpers import run, target_marginals

PROMPTS = ["the sea is ", "abcabcabc", "hello world. hello", "x", "12+12=24, 13+13=", "the cat sat on the mat. the"]


def single(tiny, kind, ids, seed, sp, max_tokens, width=3, **cfg):
    target, draft = tiny
    drafter = {"model": lambda: ModelDrafter(draft.model), "ngram": lambda: NgramDrafter(1, 3),
               "none": lambda: None}[kind]()
    eng = Engine(target.model, drafter, FixedWidth(width if drafter else 0), [1], DecodeConfig(sampling=sp, **cfg))
    return [t for ev in eng.generate([Request(0, ids, max_tokens, seed)]) for t in ev.tokens]


def batched(tiny, kind, requests, sp, batch_size, controller=None, width=3, eos=(1,), **cfg):
    target, draft = tiny
    drafter = {"model": lambda: ModelDrafter(draft.model), "ngram": lambda: NgramDrafter(1, 3),
               "none": lambda: None}[kind]()
    eng = Engine(target.model, drafter, controller or FixedWidth(width if drafter else 0), eos,
                 DecodeConfig(sampling=sp, **cfg), batch_size)
    return dict(enumerate(run(eng, requests))), eng  # (requests 0..n-1)


def requests(tiny, prompts=PROMPTS, max_tokens=40, seed=100):
    return [Request(i, list(tiny[0].tokenizer.encode(p)), max_tokens, seed + i) for i, p in enumerate(prompts)]


CASES = [(kind, sp, None) for kind in ("model", "ngram", "none")
         for sp in (SamplingParams(), SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=10))]
CASES += [("model", SamplingParams(), True), ("ngram", SamplingParams(temp=1.0), True)]  # the CUDA cache layout


@pytest.mark.parametrize("kind,sp,bucketed", CASES, ids=str)
def test_every_row_equals_its_prompt_decoded_alone(tiny, kind, sp, bucketed, monkeypatch):
    """Same seed, same tokens: at T=0 and at T>0 (the row's keys are its own), whatever the neighbours, the
    batch size (refills included) or the cache layout; long enough for holes to be compacted."""
    monkeypatch.setattr(cache, "BUCKETED_DEFAULT", bucketed)
    reqs = requests(tiny, max_tokens=120)
    alone = {r.index: single(tiny, kind, r.prompt, r.seed, sp, r.max_tokens) for r in reqs}
    for size in (1, 4, len(reqs)):
        out, eng = batched(tiny, kind, reqs, sp, size)
        assert out == alone, size
    assert eng.cycles < sum(eng.runs[i].cycles for i in alone)  # rows really shared cycles


def test_typical_rows_equal_their_single_decodes_and_report_typical_stats(tiny):
    sp = SamplingParams(temp=1.0)
    reqs = requests(tiny, max_tokens=40)
    alone = {r.index: single(tiny, "model", r.prompt, r.seed, sp, r.max_tokens, typical_threshold=0.09) for r in reqs}
    out, eng = batched(tiny, "model", reqs, sp, 4, typical_threshold=0.09)
    assert out == alone
    assert all(run.typical is not None and run.typical_summary()["positions"] > 0 for run in eng.runs.values())


def test_adaptive_width_is_shared_and_greedy_rows_stay_lossless(tiny):
    reqs = requests(tiny, max_tokens=60)
    alone = {r.index: single(tiny, "none", r.prompt, r.seed, SamplingParams(), r.max_tokens) for r in reqs}
    ema = EmaController(1, 6)
    widths = []
    width = ema.width
    ema.width = lambda: widths.append((width(), list(ema.rows))) or widths[-1][0]
    out, eng = batched(tiny, "model", reqs, SamplingParams(), 3, controller=ema)
    assert out == alone
    # ONE width per cycle: the widest member's; finished rows with no refill leave the shared width
    assert all(w == max(min(max(math.floor(e + 0.5), 1), 6) for e in ests) for w, ests in widths)
    assert len(widths[-1][1]) < 3 and len(set(w for w, _ in widths)) > 1


@pytest.mark.slow
def test_batch_rows_are_exact_at_t1(tiny):
    """Many rows of one prompt, seeds seed+index, refilled batches: first and second tokens ~ the target."""
    sp = SamplingParams(temp=1.0)
    target, _ = tiny
    ids = list(target.tokenizer.encode("the sea is "))
    N = 1500
    reqs = [Request(i, ids, 3, i) for i in range(N)]
    out, eng = batched(tiny, "model", reqs, sp, 250, eos=())
    arr = np.array([out[i][:2] for i in range(N)])
    p1, p2 = target_marginals(target, ids, sp)
    c1, c2 = np.bincount(arr[:, 0], minlength=len(p1)), np.bincount(arr[:, 1], minlength=len(p1))
    assert sum(r.accepted for r in eng.runs.values()) > 0
    assert fits(c1, p1) and fits(c2, p2)
    # negative control: the same samples do not fit the distribution at another temperature
    q1, _ = target_marginals(target, ids, SamplingParams(temp=0.6))
    assert not fits(c1, q1)


def _rows(stdout: bytes):
    return [json.loads(line) for line in stdout.decode().splitlines()]


def test_cli_jsonl_rows_in_input_order_with_failing_rows(cli, tiny_paths, tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("\n".join([
        json.dumps({"prompt": "the sea is ", "max_tokens": 12}),
        "{not json",
        json.dumps({"prompt": "abcabc", "seed": 7}),
        json.dumps({"prompt": "   "}),
        json.dumps({"prompt": "a" * 400}),  # longer than the tiny model's 256-token context
        json.dumps({"prompt": "hello", "max_tokens": 0}),
        json.dumps({"prompt": "x", "colour": "red"}),
        json.dumps({"prompt": "hello world"}),
    ]) + "\n")
    r = cli("generate", "-m", tiny_paths["target"], "--draft-model", tiny_paths["draft"], "--prompts-jsonl", str(src),
            "--format", "jsonl", "--max-tokens", "20", "--no-chat", "--batch-size", "2", "-q")
    assert r.returncode == 1
    rows = _rows(r.stdout)
    assert [row["index"] for row in rows] == list(range(8))
    assert [row["source"] for row in rows] == [f"{src}:{i}" for i in range(1, 9)]
    failed = {row["index"] for row in rows if "error" in row}
    assert failed == {1, 3, 4, 5, 6}
    assert "not valid JSON" in rows[1]["error"] and "empty prompt" in rows[3]["error"]
    assert "longer than the model's context" in rows[4]["error"] and "colour" in rows[6]["error"]
    ok = [rows[i] for i in (0, 2, 7)]
    assert all(row["finish_reason"] in ("stop", "length") and row["stats"]["generated_tokens"] for row in ok)
    assert len(rows[0]["tokens"]) <= 12 and len(rows[7]["tokens"]) <= 20
    assert "3 prompts failed" not in r.stderr.decode() and "5 of 8 prompts failed" in r.stderr.decode()
    # a row's output depends only on its own seed: row 2 (seed 7) alone gives the same text
    alone = tmp_path / "one.jsonl"
    alone.write_text(json.dumps({"prompt": "abcabc", "seed": 7}) + "\n" + json.dumps({"prompt": "zzz"}) + "\n")
    r2 = cli("generate", "-m", tiny_paths["target"], "--draft-model", tiny_paths["draft"], "--prompts-jsonl",
             str(alone), "--format", "jsonl", "--max-tokens", "20", "--no-chat", "-q")
    assert r2.returncode == 0 and _rows(r2.stdout)[0]["text"] == rows[2]["text"]


def test_cli_text_prompt_files_and_folders(cli, tiny_paths, tmp_path):
    d = tmp_path / "prompts"
    d.mkdir()
    for name, text in (("b.txt", "abcabc"), ("a.txt", "the sea is "), ("c.md", "ignored")):
        (d / name).write_text(text)
    args = ["-m", tiny_paths["target"], "--draft", "ngram", "--max-tokens", "10", "--no-chat", "-q", "--temp", "0"]
    folder = cli("generate", "--prompt-file", str(d), "--separator", "\n--8<--\n", *args)
    assert folder.returncode == 0, folder.stderr.decode()
    parts = folder.stdout.decode()[:-1].split("\n--8<--\n")
    assert len(parts) == 2
    for text, part in zip(("the sea is ", "abcabc"), parts):  # sorted: a.txt, then b.txt
        one = cli("generate", "--prompt", text, *args)
        assert one.stdout.decode()[:-1] == part
    missing = cli("generate", "--prompt-file", str(d / "a.txt"), "--prompt-file", str(tmp_path / "nope.txt"), *args)
    assert missing.returncode == 1 and "nope.txt" in missing.stderr.decode()
    assert missing.stdout.decode().startswith(parts[0])  # the good row is still printed


def test_cli_json_document_and_batch_stats(cli, tiny_paths, tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    r = cli("generate", "-m", tiny_paths["target"], "--draft-model", tiny_paths["draft"], "--prompts-jsonl", str(src),
            "--format", "json", "--max-tokens", "16", "--no-chat", "--batch-size", "4")
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert len(doc["completions"]) == len(PROMPTS) and doc["batch"]["batch_size"] == 4 and doc["batch"]["batched"]
    assert doc["batch"]["cycles"] < sum(c["stats"]["cycles"] for c in doc["completions"])
    assert "batch: 6 prompts (0 failed), batch size 4" in r.stderr.decode()


def test_recurrent_targets_and_mtp_fall_back_to_one_after_another(cli, tmp_path):
    from tiny import make_hybrid_model

    path = make_hybrid_model(tmp_path / "h")
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"prompt": "abc"}) + "\n" + json.dumps({"prompt": "hello"}) + "\n")
    r = cli("generate", "-m", str(path), "--prompts-jsonl", str(src), "--format", "jsonl", "--max-tokens", "8",
            "--no-chat", "-q")
    assert r.returncode == 0, r.stderr.decode()
    assert "one after another" in r.stderr.decode() and len(_rows(r.stdout)) == 2
    from tiny import make_mtp_model

    heads = make_mtp_model(tmp_path / "ds", "deepseek_v3")
    r = cli("generate", "-m", str(heads), "--prompts-jsonl", str(src), "--format", "jsonl", "--max-tokens", "8",
            "--no-chat", "-q", "--draft", "mtp")
    assert r.returncode == 0, r.stderr.decode()
    assert "MTP heads" in r.stderr.decode() and [row["index"] for row in _rows(r.stdout)] == [0, 1]
    # draft = auto leaves the one-row MTP heads out when several rows decode together: one batch, no note
    r = cli("generate", "-m", str(heads), "--prompts-jsonl", str(src), "--format", "jsonl", "--max-tokens", "8",
            "--no-chat", "-q")
    assert r.returncode == 0 and "one after another" not in r.stderr.decode()
    assert [row["index"] for row in _rows(r.stdout)] == [0, 1]


def test_batch_flags_and_fields_are_documented(cli, tiny_paths, tmp_path):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    helptext = cli("generate", "--help", env={"COLUMNS": "300"}).stdout.decode()
    for flag in ("--prompt-file", "--prompts-jsonl", "--batch-size", "--separator"):
        assert flag in helptext and flag in readme, flag
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"prompt": "abc"}) + "\n")
    stats = tmp_path / "s.json"
    r = cli("generate", "-m", tiny_paths["target"], "--prompts-jsonl", str(src), "--max-tokens", "4", "--no-chat",
            "-q", "--stats-json", str(stats))
    batch = json.loads(stats.read_text())["batch"]
    assert r.returncode == 0
    for field in batch:
        assert f"`{field}`" in readme, field
