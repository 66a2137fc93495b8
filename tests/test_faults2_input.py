"""Faults in what a user gives, second battery (issue 60 items 4, 7, 8 and 10's -n): bytes that are not UTF-8 on the
command line, closed or full standard streams, Unicode digits, deep JSON, long `extends` chains, unwritable config
folders, FIFOs, endless and oversized prompts, tiny temperatures, flags that would do nothing. Each ends in one line
naming what is wrong (or a warning and the run), and none is an internal error."""

import json
import os
import subprocess
import sys

import pytest

from mtpcli import config, prompts, runlog
from mtpcli.errors import EXIT_IO, EXIT_PIPE, MtpError, UsageError
from mtpcli.generate import CHARS_PER_TOKEN, TYPICAL_TAG, Options, requests_for
from test_faults_input import _jsonl_rows, _one_line


def mtpcli(*args, cwd, input=b"", timeout=120, **kw):
    """`python -m mtpcli ARGS` on INPUT (None: the test's own stdin), with stdout or preexec_fn in KW where a test
    sets them."""
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "mtpcli", *map(str, args)], stderr=subprocess.PIPE, cwd=cwd,
                          timeout=timeout, **({} if input is None else {"input": input}), **kw)


@pytest.fixture
def gen(tiny_paths):
    return ["generate", "-m", tiny_paths["target"], "--max-tokens", 3, "-q", "--no-chat"]


# ---- item 4: internal errors on ordinary input ---------------------------------------------------

@pytest.mark.slow
def test_invalid_utf8_in_prompt_and_system_is_replaced_with_a_warning_naming_the_flag(tiny_paths, gen, tmp_path):
    bad = os.fsdecode(b"ab\xffc")  # as Python keeps argv bytes that are not UTF-8
    r = mtpcli(*gen, "-p", bad, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout, r.stderr.decode()
    assert r.stderr.decode() == ("mtpcli: warning: --prompt is not valid UTF-8 (byte 2); invalid bytes replaced with "
                                 "U+FFFD\n")
    chat = ["generate", "-m", tiny_paths["chat"], "--max-tokens", 3, "-q", "-p", "ab"]
    r = mtpcli(*chat, "--system", bad, cwd=tmp_path)
    assert r.returncode == 0 and "warning: --system is not valid UTF-8" in r.stderr.decode(), r.stderr.decode()
    r = mtpcli(*chat, cwd=tmp_path, env={**os.environ, "MTPCLI_SYSTEM": bad})
    assert r.returncode == 0 and "warning: env MTPCLI_SYSTEM is not valid UTF-8" in r.stderr.decode()


def test_a_lone_surrogate_in_a_jsonl_prompt_is_replaced_with_a_warning(tmp_path, capsys):
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "ab\\ud800c"}\n')
    item = prompts.read_jsonl(str(src))[0]
    assert item.error is None and item.text.startswith("ab\ufffd") and item.text.endswith("c")
    item.text.encode()  # what a tokenizer takes
    assert f"{src}:1 is not valid UTF-8" in capsys.readouterr().err


@pytest.mark.slow
def test_prompt_file_dash_with_stdin_closed_is_one_line(gen, tmp_path):
    r = mtpcli(*gen, "--prompt-file", "-", cwd=tmp_path, input=None, preexec_fn=lambda: os.close(0))
    assert "--prompt-file -: stdin is closed" in _one_line(r)


@pytest.mark.slow
@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_generate_to_a_full_or_closed_stdout_logs_the_run_and_says_so_in_one_line(gen, tmp_path, stdout):
    with open("/dev/full", "wb") as full:
        kw = {"stdout": full} if stdout == "full" else {"preexec_fn": lambda: os.close(1)}
        r = mtpcli(*gen, "-p", "abc", cwd=tmp_path, **kw)
    err = r.stderr.decode()
    assert r.returncode == (EXIT_IO if stdout == "full" else EXIT_PIPE) and err.count("\n") == 1, err
    assert ("mtpcli: error: stdout: No space left on device" if stdout == "full" else "stdout was closed") in err
    assert [rec["status"] for rec in runlog.query()] == [r.returncode]


@pytest.mark.slow
def test_spec_tree_takes_ascii_digits_only(gen, tmp_path):
    assert "--spec-tree" in _one_line(mtpcli(*gen, "-p", "ab", "--spec-tree", "²", cwd=tmp_path))
    with pytest.raises(UsageError, match="MTPCLI_TREE"):
        config.resolve(None, {}, env={"MTPCLI_TREE": "²"})
    assert config.resolve(None, {}, env={"MTPCLI_TREE": "12"}).tree == "12"


@pytest.mark.slow
def test_json_nested_100000_deep_fails_its_row_and_stats_file_alone(tmp_path, gen):
    deep = "[" * 100_000 + "]" * 100_000
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"prompt": "ab"}) + "\n" + deep + "\n")
    items = prompts.read_jsonl(str(src))
    assert items[0].error is None and items[1].error == f"{src}:2: not valid JSON (nested too deeply)"
    (tmp_path / "s.json").write_text(deep)
    err = _one_line(mtpcli("stats", "--file", tmp_path / "s.json", cwd=tmp_path))
    assert "s.json" in err and "nested too deeply" in err


def test_an_extends_chain_600_deep_is_one_error_naming_the_profile(udir):
    for i in range(600):  # (deep enough for Python's recursion limit)
        (udir / f"p{i}.toml").write_text(f'extends = "p{i + 1}"\n' if i < 599 else "temp = 0.5\n")
    with pytest.raises(UsageError, match=f"{udir / 'p0.toml'}: its 'extends' chain is longer than 64 profiles"):
        config.resolve("p0", {}, env={})
    (udir / "p563.toml").write_text("temp = 0.5\n")  # 64 deep: fine
    assert config.resolve("p500", {}, env={}).temp == 0.5


def test_profile_use_on_an_unwritable_config_folder_is_one_line_and_keeps_the_default(monkeypatch):
    config.set_default("ngram")
    before = config.config_file().read_bytes()

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(config.Path, "write_text", full)
    with pytest.raises(MtpError, match=f"{config.config_file()}: not written \\(No space left on device\\)"):
        config.set_default("exact")
    assert config.config_file().read_bytes() == before and list(config.config_file().parent.iterdir()) == \
        [config.config_file()]


@pytest.mark.slow
def test_bench_refuses_no_profiles_and_a_seed_count_past_its_cap(tiny_paths, tmp_path):
    base = ["bench", "-m", tiny_paths["target"], "--no-log"]
    assert "--profiles ''" in _one_line(mtpcli(*base, "--profiles", "", cwd=tmp_path))
    assert "--seeds" in _one_line(mtpcli(*base, "--seeds", "99999999999999999999", cwd=tmp_path))


# ---- item 7: hangs and silent stalls -------------------------------------------------------------

@pytest.mark.slow
def test_a_fifo_in_a_prompt_folder_is_skipped_with_a_warning(gen, tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "a.txt").write_text("abc")
    os.mkfifo(d / "f.txt")  # nothing ever writes to it: opening it would block for ever
    r = mtpcli(*gen, "--prompt-file", d, "--format", "jsonl", cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and [row["source"] for row in _jsonl_rows(r)] == [str(d / "a.txt")]
    assert f"skipped {d / 'f.txt'}: not a regular file" in r.stderr.decode()


@pytest.mark.slow
def test_an_endless_prompt_file_or_line_is_refused_at_a_cap(gen, tmp_path, monkeypatch):
    err = _one_line(mtpcli(*gen, "--prompt-file", "/dev/zero", cwd=tmp_path, timeout=60))
    assert "--prompt-file /dev/zero is larger than 64 MiB" in err
    monkeypatch.setattr(prompts, "MAX_BYTES", 100)
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"prompt": "ab"}) + "\n" + json.dumps({"prompt": "x" * 200}) + "\n")
    with pytest.raises(UsageError, match=f"--prompts-jsonl {src}:2: the line is longer than"):
        prompts.read_jsonl(str(src))


def test_a_prompt_far_past_the_context_is_refused_before_it_is_tokenized_whole(tiny):
    target, _ = tiny
    seen = []

    class Counting:  # the tiny tokenizer, counting what it is given
        has_chat_template = False

        def encode(self, text, **kw):
            seen.append(len(text))
            return target.tokenizer.encode(text, **kw)

    limit = 256
    items = [prompts.Item(0, "long", "abc " * (10 * limit)), prompts.Item(1, "short", "abc")]
    completions, requests, _ = requests_for(config.resolve(None, {}, env={}), items, Options(single=False),
                                            Counting(), limit)
    assert max(seen) <= CHARS_PER_TOKEN * limit
    assert "longer than the model's context of 256 tokens" in items[0].error and items[1].error is None
    assert [r.index for r in requests] == [1]


@pytest.mark.slow
def test_bench_refuses_prompt_tokens_past_the_context(tiny_paths, tmp_path):
    (tmp_path / "p.txt").write_text("abc")
    r = mtpcli("bench", "-m", tiny_paths["target"], "--prompts", tmp_path / "p.txt", "--prompt-tokens", 300,
               "--max-tokens", 2, "--seeds", 1, "--no-log", cwd=tmp_path)
    assert "300 tokens (--prompt-tokens) and --max-tokens 2 run past the model's context of 256" in _one_line(r)


# ---- item 8: silent wrong behaviour --------------------------------------------------------------

def test_a_temperature_that_overflows_the_logits_is_refused():
    for where, kw in (("--temp", {"flags": {"temp": 1e-300}}), ("MTPCLI_TEMP", {"env": {"MTPCLI_TEMP": "1e-300"}})):
        with pytest.raises(UsageError, match=f"{where}.*allowed: 0 or >= 1e-06"):
            config.resolve(None, kw.get("flags", {}), env=kw.get("env", {}))
    assert [config.resolve(None, {"temp": t}, env={}).temp for t in (0.0, 1e-6, 0.5)] == [0.0, 1e-6, 0.5]


@pytest.mark.slow
def test_system_without_a_chat_template_warns_once(gen, tmp_path):
    (tmp_path / "a.txt").write_text("abc")
    (tmp_path / "b.txt").write_text("abd")
    r = mtpcli(*gen[:-1], "--system", "be brief", "--prompt-file", tmp_path / "a.txt", "--prompt-file",
               tmp_path / "b.txt", cwd=tmp_path)
    assert r.returncode == 0
    assert r.stderr.decode() == "mtpcli: warning: --system is not used: the model's tokenizer has no chat template\n"


@pytest.mark.slow
def test_draft_none_refuses_draft_flags_it_would_ignore_and_batch_size_of_one_row_warns(gen, tmp_path):
    for flags, named in (({"draft_model": "d"}, "--draft-model"), ({"num_draft_tokens": 3}, "--num-draft-tokens"),
                         ({"adaptive": True}, "--spec-draft-adaptive")):
        with pytest.raises(UsageError, match=f"--draft none drafts nothing: {named} would not be used"):
            config.resolve(None, {"draft": "none", **flags}, env={})
    config.resolve("fixed-4", {"draft": "none"}, env={})  # a profile's width is not the user's conflict
    r = mtpcli(*gen, "-p", "ab", "--batch-size", 4, cwd=tmp_path)
    assert r.returncode == 0 and "--batch-size has no effect on one prompt" in r.stderr.decode()


@pytest.mark.slow
def test_prompts_jsonl_repeated_and_from_stdin_with_ids_passed_through(gen, tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps({"prompt": "abc", "id": "first"}) + "\n" + json.dumps({"prompt": "b", "id": 7}) + "\n")
    stdin = (json.dumps({"prompt": "abd", "id": {"k": [1]}}) + "\n" + json.dumps({"prompt": "c"}) + "\n").encode()
    r = mtpcli(*gen, "--prompts-jsonl", a, "--prompts-jsonl", "-", "--format", "jsonl", cwd=tmp_path, input=stdin)
    assert r.returncode == 0, r.stderr.decode()
    rows = _jsonl_rows(r)
    assert [row.get("id") for row in rows] == ["first", 7, {"k": [1]}, None]
    assert [row["source"] for row in rows] == [f"{a}:1", f"{a}:2", "stdin:1", "stdin:2"]
    r = mtpcli(*gen, "--prompts-jsonl", a, "--format", "json", cwd=tmp_path)
    assert [c["id"] for c in json.loads(r.stdout)["completions"]] == ["first", 7]


@pytest.mark.slow
def test_every_run_of_the_typical_lane_says_it_is_not_exact(gen, tiny_paths, tmp_path):
    r = mtpcli(*gen, "-p", "ab", "--typical-threshold", 0.1, cwd=tmp_path)  # T = 0: a no-op, and said so
    assert r.returncode == 0 and f"{TYPICAL_TAG} a no-op at temp 0 (greedy);" in r.stderr.decode()
    (tmp_path / "p.txt").write_text("abc")
    r = mtpcli("bench", "-m", tiny_paths["target"], "--profiles", "exact,typical-0.09", "--prompts",
               tmp_path / "p.txt", "--max-tokens", 2, "--seeds", 1, "--no-log", cwd=tmp_path)
    assert r.returncode == 0 and "(arm typical-0.09)" in r.stderr.decode()
    assert [x for x in r.stderr.decode().splitlines() if x.startswith(TYPICAL_TAG)][0].endswith("(arm typical-0.09)")


def test_an_unknown_profile_from_the_environment_names_the_variable():
    with pytest.raises(UsageError, match="environment MTPCLI_PROFILE: unknown profile 'nope'"):
        config.resolve(None, {}, env={"MTPCLI_PROFILE": "nope"})


# ---- item 10: -n counts completions -------------------------------------------------------------

@pytest.mark.slow
def test_n_says_it_counts_completions_and_its_rows_leave_out_what_is_not_theirs(gen, tmp_path):
    assert "not a token count" in mtpcli("generate", "-h", cwd=tmp_path).stdout.decode()
    r = mtpcli(*gen, "-p", "ab", "-n", 17, "--max-tokens", 1, "--format", "json", cwd=tmp_path)
    assert r.returncode == 0 and "-n 17 decodes 17 completions of the prompt" in r.stderr.decode()
    rows = json.loads(r.stdout)["completions"]
    assert rows[0]["stats"]["prefill_tps"] > 0  # the one completion that prefilled the prompt
    assert all("prefill_tps" not in row["stats"] for row in rows[1:])
