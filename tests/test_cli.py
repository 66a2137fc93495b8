"""`mtpcli generate` as a shell user meets it: stdout, stderr, exit codes, bad input."""

import json
import signal
import subprocess
import sys

import pytest

from mtpcli.generate import TYPICAL_TAG
from helpers import signalled

STATS = ("prompt_tokens", "generated_tokens", "cycles", "drafted", "accepted", "acceptance_rate", "tokens_per_cycle",
         "accept_by_position", "accept_length_hist", "draft_width_hist", "prefill_tps", "decode_tps", "ttft_s")


@pytest.fixture
def gen(cli, tiny_paths):
    def run(*args, input=b"def fib(n):", **kw):
        return cli("generate", "--model", tiny_paths["target"], "--max-tokens", 24, *args, input=input, **kw)
    return run


def one_line_error(r, *needles):
    err = r.stderr.decode()
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], err
    return lines[0]


def test_stdout_carries_only_text_and_stats_go_to_stderr(gen, tiny_paths):
    r = gen("--draft-model", tiny_paths["draft"], "--no-chat")
    assert r.returncode == 0, r.stderr
    plain = gen("--draft", "none", "--no-chat")
    assert r.stdout == plain.stdout  # greedy: speculative output identical to plain decoding
    err = r.stderr.decode()
    for key in (*STATS, "peak_memory"):
        assert f"{key}:" in err
    assert "\x1b[" not in err  # no colour when stderr is not a terminal
    assert b"tokens_per_cycle" not in r.stdout


def test_prompt_sources_agree(gen, tiny_paths, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("def fib(n):")
    a = gen("--no-chat", "-q")
    b = gen("--no-chat", "-q", "--prompt", "def fib(n):", input=b"")
    c = gen("--no-chat", "-q", "--prompt-file", f, input=b"")
    d = gen("--no-chat", "-q", "--prompt-file", "-")
    assert a.stdout == b.stdout == c.stdout == d.stdout and a.returncode == 0
    assert a.stderr == b""  # --quiet


def test_chat_template_applied_by_default_when_present(cli, tiny_paths):
    base = ["generate", "--model", tiny_paths["chat"], "--max-tokens", 8, "-q", "--format", "json"]
    on = json.loads(cli(*base, input=b"abc").stdout)
    off = json.loads(cli(*base, "--no-chat", input=b"abc").stdout)
    sysm = json.loads(cli(*base, "--system", "be brief", input=b"abc").stdout)
    assert on["stats"]["prompt_tokens"] == len("u:abc\na:") + 0
    assert off["stats"]["prompt_tokens"] == 3
    assert sysm["stats"]["prompt_tokens"] == len("s:be brief\nu:abc\na:")


def test_json_and_jsonl_and_stats_json(gen, tiny_paths, tmp_path):
    sj = tmp_path / "s.json"
    r = gen("--draft-model", tiny_paths["draft"], "--format", "json", "--temp", "1", "--seed", "3",
            "--stats-json", sj, "-q")
    doc = json.loads(r.stdout)
    assert set(doc) >= {"text", "tokens", "finish_reason", "stats", "settings"}
    assert doc["finish_reason"] in ("stop", "length") and isinstance(doc["tokens"], list)
    stats = json.loads(sj.read_text())
    for key in (*STATS, "peak_memory_bytes"):
        assert key in stats
    assert stats["settings"]["law"] == "exact" and stats["settings"]["seed"] == 3
    assert stats["settings"]["draft"] == "auto" and stats["settings"]["temp"] == 1.0
    assert stats["auto"]["sources"] == ["ngram", "model"]  # the policy over every source the run has
    rows = gen("--format", "jsonl", "-n", 3, "--temp", "1", "-q").stdout.decode().splitlines()
    assert [json.loads(x)["index"] for x in rows] == [0, 1, 2]
    assert all("stats" in json.loads(x) for x in rows)


def test_num_completions_prefill_once_and_differ(gen):
    r = gen("-n", 3, "--temp", "1", "--format", "json", "-q")
    doc = json.loads(r.stdout)
    texts = [c["text"] for c in doc["completions"]]
    assert len(texts) == 3 and len(set(texts)) > 1
    assert doc["stats"]["prefill_tps"] > 0
    text = gen("-n", 3, "--temp", "1", "--separator", "\n@@\n", "-q", "--no-chat").stdout.decode()
    assert text.count("\n@@\n") == 2 and text.endswith("\n")


def test_typical_warning_present_when_on_absent_when_off(gen, tiny_paths):
    on = gen("--draft-model", tiny_paths["draft"], "--temp", "1", "--typical-threshold", "0.09", "-q")
    lines = [x for x in on.stderr.decode().splitlines() if x.startswith(TYPICAL_TAG)]
    assert len(lines) == 2 and "threshold=0.09 eps=1.0" in lines[0]
    assert all(k in lines[1] for k in ("positions=", "accepted=", "resamples=", "accept_rate=",
                                        "mean_entropy=", "tokens_per_cycle="))
    off = gen("--draft-model", tiny_paths["draft"], "--temp", "1")
    assert "[typical-accept]" not in off.stderr.decode()
    greedy = gen("--draft-model", tiny_paths["draft"], "--typical-threshold", "0.09")
    lines = [x for x in greedy.stderr.decode().splitlines() if x.startswith(TYPICAL_TAG)]
    assert len(lines) == 1 and "a no-op at temp 0" in lines[0]  # T=0: the lane is a no-op, and says so (issue 60)


@pytest.mark.parametrize("args,needle", [
    (["--top-p", "0"], "top_p"), (["--top-p", "1.5"], "top_p"), (["--temp", "-1"], "temp"), (["--temp", "inf"], "temp"),
    (["--typical-threshold", "-0.1"], "typical_threshold"), (["--spec-draft-n-min", "5", "--spec-draft-n-max", "3"], "n-min"),
    (["--spec-draft-n-min", "0"], "n_min"), (["--spec-draft-p-min", "1"], "p_min"),
])
def test_bad_flags_one_line_exit_2(gen, args, needle):
    r = gen(*args)
    assert r.returncode == 2
    one_line_error(r, needle)
    assert r.stdout == b""


def test_non_numeric_threshold_is_refused(gen):
    r = gen("--typical-threshold", "abc")
    assert r.returncode == 2 and "Traceback" not in r.stderr.decode() and "typical-threshold" in r.stderr.decode()


def test_empty_input(gen):
    r = gen(input=b"  \n")
    assert r.returncode == 2
    one_line_error(r, "empty prompt")


def test_non_utf8_input_is_replaced_with_a_warning(gen):
    r = gen("-q", input=b"abc\xff\xfedef")
    assert r.returncode == 0
    assert "not valid UTF-8" in r.stderr.decode()


def test_missing_model(cli):
    r = cli("generate", "--model", "/nonexistent/model", input=b"hi")
    assert r.returncode == 3
    one_line_error(r, "/nonexistent/model")


def test_draft_with_other_vocabulary_is_refused(cli, tiny_paths, tmp_path):
    from tiny import VOCAB, make_model

    other = make_model(tmp_path / "other", vocab=VOCAB[:-1] + ["?"])
    r = cli("generate", "--model", tiny_paths["target"], "--draft-model", other, input=b"abc")
    assert r.returncode == 3
    one_line_error(r, "--draft-model", "does not match")
    assert r.stdout == b""


def test_prompt_longer_than_context(cli, tmp_path):
    from tiny import make_model

    small = make_model(tmp_path / "small", max_positions=16)
    r = cli("generate", "--model", small, "--no-chat", input=b"a" * 40)
    assert r.returncode == 2
    one_line_error(r, "longer than the model's context")


def test_unknown_profile_lists_known(gen):
    r = gen("--profile", "nope")
    assert r.returncode == 2
    line = one_line_error(r, "unknown profile 'nope'", "exact")
    assert "typical-0.09" in line


@pytest.mark.slow
def test_closed_stdout(tiny_paths):
    cmd = f"{sys.executable} -m mtpcli generate --model {tiny_paths['target']} --max-tokens 3000 --no-chat --no-log"
    p = subprocess.run(["bash", "-c", f"set -o pipefail; echo abc | {cmd} | head -c 10"], capture_output=True,
                       timeout=120)
    assert len(p.stdout) == 10
    assert p.returncode == 141
    assert "stdout was closed" in p.stderr.decode() and "Traceback" not in p.stderr.decode()


@pytest.mark.slow
def test_ctrl_c_prints_what_was_committed_then_stats_exit_130(tiny_paths):
    p = subprocess.Popen([sys.executable, "-m", "mtpcli", "generate", "--model", str(tiny_paths["target"]),
                          "--max-tokens", "100000", "--no-chat", "--no-log", "--prompt", "abc"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got, out, err = signalled(p, signal.SIGINT)
    assert p.returncode == 130
    err = err.decode()
    assert "Traceback" not in err and "interrupted after" in err and "generated_tokens:" in err
    assert len(got + out) >= 20


def test_blas_hint_once_and_never_with_quiet(gen):
    env = {"MTPCLI_BLAS": "reference"}  # the reference BLAS: mtpcli does not re-run itself with OpenBLAS
    hint = "slow reference BLAS"
    assert hint not in gen("-q", "--no-log", env={**env, "MTPCLI_BLAS_HINT": "1"}).stderr.decode()
    first = gen("--no-log", env={**env, "MTPCLI_BLAS_HINT": "1"}).stderr.decode()
    second = gen("--no-log", env={**env, "MTPCLI_BLAS_HINT": "1"}).stderr.decode()
    assert hint in first and hint not in second
