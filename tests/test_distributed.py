"""Several processes under MLX's launcher: two ranks on this machine with the ring backend (`mtpcli launch`).

Greedy output equals the one-process output in data, tensor and pipeline modes; the exact law holds with a
tensor-sharded target (chi-square of the first and second token at T = 1, with a negative control); data mode keeps
input order and gathers every rank's statistics; a rank killed mid-run ends the job with one clear error and a non-zero
status; `mtpcli launch` returns the worst rank's status."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mtpcli.distributed import data
from mtpcli.engine import Request
from mtpcli.sampling import SamplingParams
from stattools import fit_two

from helpers import descendants, rank_of, run, target_marginals

HERE = Path(__file__).parent
PROMPTS = [("the sea is ", 30), ("def fib(n):", 12), ("x = 1\ny = ", 25), ("abc", 40),
           ("hello world, this is a longer prompt", 8)]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A tiny qwen2 target (a family with shard() and pipeline()) and a noisy copy as its draft."""
    from tiny import make_model, noisy_copy

    root = tmp_path_factory.mktemp("qwen")
    target = make_model(root / "target", model_type="qwen2", max_positions=4096)
    return {"target": target, "draft": noisy_copy(target, root / "draft"), "root": root}


def reference(path, prompt, max_tokens):
    """One process, plain greedy decoding."""
    from mtpcli import models
    from mtpcli.engine import DecodeConfig, Engine

    t = models.load(str(path))
    eng = Engine(t.model, eos_token_ids=t.tokenizer.eos_token_ids, config=DecodeConfig())
    return run(eng, [Request(0, list(t.tokenizer.encode(prompt)), max_tokens, 0)])[0]


def launch(cli, *args, timeout=180):
    return cli("launch", "-n", "2", "--backend", "ring", "--", *map(str, args),
               env={"MTPCLI_NO_LOG": "1", "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=timeout)


@pytest.fixture(scope="module")
def worker(qwen, tmp_path_factory):
    """The runs of dist_worker.py, in one launch (starting two ranks costs more than what they decode)."""
    import subprocess

    out = tmp_path_factory.mktemp("worker") / "out.json"
    env = {**os.environ, "MTPCLI_NO_LOG": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "mtpcli", "launch", "-n", "2", "--backend", "ring", "--", sys.executable,
                        str(HERE / "dist_worker.py"), str(qwen["target"]), str(qwen["draft"]), str(out)],
                       capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(out.read_text())


def test_tensor_generate_prints_rank_0s_output_equal_to_one_process(qwen, cli):
    prompt, n = "the sea is ", 40
    r = launch(cli, "generate", "-m", qwen["target"], "-p", prompt, "--temp", "0", "--max-tokens", n,
               "--draft", "model", "--draft-model", qwen["draft"], "--num-draft-tokens", 3, "--distributed", "tensor",
               "--format", "json", "-q")
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)  # rank 0 alone writes stdout: one document
    assert doc["tokens"] == reference(qwen["target"], prompt, n)
    assert doc["stats"]["cycles"] < n and doc["stats"]["accepted"] > 0  # it speculated
    d = doc["distributed"]
    assert (d["mode"], d["size"], d["backend"]) == ("tensor", 2, "ring")
    assert d["messages"] == d["cycles"] + 3  # a cycle each, + start, last verdict, draft's kind
    assert r.stderr == b""  # -q: nothing from either rank


def test_a_sharded_targets_draft_model_is_resolved_on_rank_0_alone(qwen, cli, tmp_path):
    """Rank 0 reads what --draft-model is and tells the others: here rank 1 has no such folder at all."""
    (tmp_path / "r0").mkdir(), (tmp_path / "r1").mkdir()
    (tmp_path / "r0" / "d").symlink_to(qwen["draft"])
    run = (f'cd {tmp_path}/r$MLX_RANK && exec "{sys.executable}" -m mtpcli generate -m {qwen["target"]} -p "the sea is " '
           "--temp 0 --max-tokens 20 --draft model --draft-model ./d --distributed tensor --format json -q")
    r = launch(cli, "sh", "-c", run)
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert doc["tokens"] == reference(qwen["target"], "the sea is ", 20) and doc["stats"]["accepted"] > 0


def test_a_draft_model_rank_0_cannot_read_ends_every_rank_at_once(qwen, cli, tmp_path):
    """Rank 0 cannot read it: every rank ends at once (not after the 600 s watchdog), naming the draft."""
    r = launch(cli, "generate", "-m", qwen["target"], "-p", "the sea is ", "--draft", "model", "--draft-model",
               tmp_path / "missing", "--distributed", "tensor", "--distributed-timeout", "600", timeout=90)
    err = r.stderr.decode()
    assert r.returncode != 0 and r.stdout == b""
    assert "missing" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("run", ["greedy-tensor-model", "greedy-tensor-none", "greedy-pipeline-model"])
def test_sharded_greedy_output_equals_one_process(qwen, worker, run):
    got = worker[run]
    assert got["tokens"][0] == reference(qwen["target"], "the sea is ", 40)
    assert got["size"] == 2
    assert got["model_collectives_per_pass"] == (4 if got["mode"] == "tensor" else 2)  # 2 layers x 2 all_sums; 2 stages
    if run.endswith("model"):
        assert got["cycles"] < 40 and got["acceptance"] > 0  # it speculated
        assert got["messages"] == got["cycles"] + 2  # one message per cycle (+ the start and the last verdict)
    else:
        assert got["messages"] == got["cycles"] + 1  # the token, inside each step's graph (+ the start)


@pytest.mark.slow
def test_same_seed_same_output_at_t1_as_one_process(qwen, worker):
    from mtpcli import models
    from mtpcli.controller import FixedWidth
    from mtpcli.drafters.model import ModelDrafter
    from mtpcli.engine import DecodeConfig, Engine

    t, d = models.load(str(qwen["target"])), models.load(str(qwen["draft"]))
    cfg = DecodeConfig(sampling=SamplingParams(temp=1.0))
    eng = Engine(t.model, ModelDrafter(d.model), FixedWidth(3), t.tokenizer.eos_token_ids, cfg)
    ids = list(t.tokenizer.encode("the sea is "))
    assert worker["seeded-tensor-t1"]["tokens"][0] == run(eng, [Request(0, ids, 60, 3)])[0]


def test_data_mode_keeps_input_order_and_gathers_statistics(qwen, cli, tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": p, "max_tokens": n}) + "\n" for p, n in PROMPTS))
    stats = tmp_path / "stats.json"
    r = launch(cli, "generate", "-m", qwen["target"], "--prompts-jsonl", jsonl, "--temp", "0", "--draft", "model",
               "--draft-model", qwen["draft"], "--num-draft-tokens", 3, "--format", "jsonl", "--stats-json", stats)
    assert r.returncode == 0, r.stderr.decode()
    rows = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert [x["index"] for x in rows] == list(range(len(PROMPTS)))
    for row, (p, n) in zip(rows, PROMPTS):
        assert row["tokens"] == reference(qwen["target"], p, n)
        assert row["stats"]["generated_tokens"] == len(row["tokens"])  # each row's own statistics came back
    doc = json.loads(stats.read_text())
    assert doc["generated_tokens"] == sum(len(x["tokens"]) for x in rows)  # aggregated over both ranks
    assert doc["batch"]["prompts"] == len(PROMPTS)
    d = doc["distributed"]
    assert (d["mode"], d["size"]) == ("data", 2)
    assert sorted(d["prompts_per_rank"]) == [2, 3]  # both ranks decoded a share
    err = r.stderr.decode()
    assert err.count("generated_tokens") == 1 and "distributed: data over 2 ranks" in err  # rank 0's table only
    shown = cli("stats", "--file", stats).stdout.decode()
    assert "distributed: data over 2 ranks (ring)" in shown and "prompts per rank: " in shown


def test_shares_are_balanced_by_length_and_keep_input_order():
    reqs = [Request(i, [0] * p, m, 0) for i, (p, m) in enumerate([(100, 100), (10, 10), (90, 90), (20, 20), (5, 5)])]
    a, b = data.shares(reqs, 2)
    assert [r.index for r in a] == [0, 1, 4] and [r.index for r in b] == [2, 3]  # loads 230 and 220
    assert sorted(r.index for r in a + b) == list(range(5))


@pytest.mark.slow
def test_tensor_sharded_speculation_is_distributed_as_the_target_and_a_wrong_law_is_caught(qwen, worker):
    from mtpcli import models

    t = models.load(str(qwen["target"]))
    p1, p2 = target_marginals(t, t.tokenizer.encode("the sea is "), SamplingParams(temp=1.0))
    verdicts = []
    for law in ("exact", "wrong"):
        doc = worker[f"t1-{law}"]
        arr = np.array([t[:2] for t in doc["tokens"]])
        assert doc["mode"] == "tensor" and 0.2 < doc["acceptance"] < 0.95  # the law really worked
        assert doc["reached"][1] > len(arr) / 4  # the second drafted position was exercised
        verdicts.append(all(fit_two(arr[:, 0], arr[:, 1], p1, p2)))
    assert verdicts == [True, False]


@pytest.mark.slow
def test_a_rank_killed_mid_run_ends_the_job_with_one_clear_error(qwen, tmp_path):
    env = {**os.environ, "MTPCLI_NO_LOG": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-m", "mtpcli", "launch", "-n", "2", "--backend", "ring", "--",
                          "generate", "-m", str(qwen["target"]), "-p", "the sea is ", "--temp", "0", "--max-tokens",
                          "3000", "--draft", "none", "--distributed", "tensor"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                         cwd=tmp_path)
    try:
        import select

        assert select.select([p.stdout], [], [], 120)[0] and p.stdout.read(1)  # rank 0 is decoding
        victim = [c for c in descendants(p.pid) if rank_of(c) == 1][-1]  # the rank itself (under its wrapper)
        os.kill(victim, signal.SIGKILL)
        _, err = p.communicate(timeout=60)  # bounded: the job ends, no rank hangs
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGKILL
    lines = [x for x in err.decode().splitlines() if x.startswith("mtpcli:")]
    assert lines[-1].startswith("mtpcli: error: rank 1 was killed by signal 9")  # mtpcli launch's own line, last
    assert not any("internal error" in x for x in lines)  # rank 0, if it saw the loss first: a plain error line


def test_launch_returns_the_worst_rank_status(cli):
    code = "import os, sys, time; r = int(os.environ['MLX_RANK']); time.sleep(0 if r else 30); sys.exit(3 * r)"
    r = launch(cli, sys.executable, "-c", code, timeout=60)
    assert r.returncode == 3  # mlx.launch itself exits 0 here
    assert b"mtpcli: error: rank 1 exited with status 3; the launcher stopped rank 0" in r.stderr
    assert launch(cli, sys.executable, "-c", "pass").returncode == 0


@pytest.mark.slow
def test_the_watchdog_ends_a_rank_that_waits_too_long():
    code = ("import time; from mtpcli.distributed import Watchdog; w = Watchdog(0.5, 0); "
            "w.arm('waiting for rank 0'); time.sleep(60)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=50,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 1
    assert r.stderr.decode().strip() == ("mtpcli: error: no answer from the other ranks for 0.5 s (waiting for rank 0); "
                                         "a rank failed or hung (--distributed-timeout)")


def test_under_the_launcher_stdin_prompts_are_refused_with_one_line(cli, qwen):
    r = cli("generate", "-m", qwen["target"], env={"MLX_RANK": "0"})
    assert r.returncode == 2
    assert r.stderr.decode().strip().startswith("mtpcli: error: under mlx.launch, give the prompt with --prompt")
