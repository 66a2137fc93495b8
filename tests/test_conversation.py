"""Conversations from the shell: `generate --save` starts one, `-c` / `--conversation ID` continue it with the whole
conversation rendered by the chat template, `stats --conversations` lists them; what cannot be continued is one line;
concurrent `-c` on one conversation lose no turn."""

import hashlib
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from mtpcli import models
from mtpcli.generate import encode_prompt


def kept(cli, *extra):
    r = cli("stats", "--conversations", "--json", *extra)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def turns(cli, ident):
    r = cli("stats", "--conversation", str(ident), "--json")
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def runs(tmp_path):
    path = tmp_path / "xdg_data_home" / "mtpcli" / "runs.sqlite"
    with sqlite3.connect(path) as con:
        return con.execute("SELECT prompt_tokens, prompt_hash FROM runs ORDER BY id").fetchall()


def one_error(r, *words):
    err = r.stderr.decode()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("mtpcli: error: "), err
    assert all(w in err for w in words), err
    assert r.stdout == b""


def test_a_continued_prompt_is_the_whole_conversation_through_the_template(cli, tiny_paths, tmp_path):
    chat = str(tiny_paths["chat"])
    first = cli("generate", "-m", chat, "-p", "hello", "--system", "be brief", "--save", "--max-tokens", "6", "-q")
    assert first.returncode == 0, first.stderr.decode()
    second = cli("generate", "-c", "-p", "and more", "--max-tokens", "6", "-q")  # the model and system: the kept ones
    assert second.returncode == 0, second.stderr.decode()
    third = cli("generate", "--conversation", "1", "-m", chat, "-p", "last", "--max-tokens", "6", "-q")
    assert third.returncode == 0, third.stderr.decode()
    conv = turns(cli, 1)
    assert [t["prompt"] for t in conv["turns"]] == ["hello", "and more", "last"]
    assert [t["answer"] + "\n" for t in conv["turns"]] == [r.stdout.decode() for r in (first, second, third)]
    assert conv["system"] == "be brief" and conv["model"] == str(tiny_paths["chat"].resolve())
    tok = models.load(chat).tokenizer
    said = []
    for (n, digest), t in zip(runs(tmp_path), conv["turns"]):
        expected = encode_prompt(tok, t["prompt"], None, "be brief", said)
        assert (n, digest) == (len(expected), hashlib.sha256(json.dumps(expected).encode()).hexdigest()[:16])
        said += [{"role": "user", "content": t["prompt"]}, {"role": "assistant", "content": t["answer"]}]
    # the token prefix is stable across turns: the kept prefill of a turn is the start of the next one's prompt
    whole = encode_prompt(tok, "next", None, "be brief", said)
    assert whole[: len(expected)] == expected
    assert kept(cli)[0]["turns"] == 3


def test_continuing_without_a_conversation_is_one_line(cli, tiny_paths, tmp_path):
    chat = str(tiny_paths["chat"])
    one_error(cli("generate", "-c", "-p", "x", "-m", chat), "no run log", "--save")  # none at all
    assert cli("generate", "-m", chat, "-p", "x", "--max-tokens", "2", "-q").returncode == 0  # a run, no conversation
    one_error(cli("generate", "-c", "-p", "x", "-m", chat), "-c: no conversation to continue")
    assert cli("generate", "-m", chat, "-p", "x", "--max-tokens", "2", "-q", "--save").returncode == 0
    one_error(cli("generate", "--conversation", "7", "-p", "x"), "--conversation 7: no such conversation")
    (tmp_path / "xdg_data_home" / "mtpcli" / "runs.sqlite").unlink()  # a deleted run log
    one_error(cli("generate", "-c", "-p", "x"), "no run log", "deleted")


def test_what_a_conversation_cannot_take_is_one_line(cli, tiny_paths):
    chat = str(tiny_paths["chat"])
    assert cli("generate", "-m", chat, "-p", "x", "--max-tokens", "2", "-q", "--save").returncode == 0
    one_error(cli("generate", "-c", "-m", str(tiny_paths["target"]), "-p", "x"), "conversation 1 is with model",
              str(tiny_paths["chat"].resolve()))  # a conversation of another model
    one_error(cli("generate", "-c", "--system", "other", "-p", "x"), "--system differs", "conversation 1")
    one_error(cli("generate", "-c", "--no-log", "-p", "x"), "--no-log")
    one_error(cli("generate", "-c", "-p", "x", env={"MTPCLI_NO_LOG": "1"}), "MTPCLI_NO_LOG")
    one_error(cli("generate", "-c", "-p", "x", "-n", "2"), "one prompt and one completion")
    one_error(cli("generate", "-c", "--conversation", "1", "-p", "x"), "not both")
    one_error(cli("generate", "-c", "--no-chat", "-p", "x"), "needs the chat template")
    one_error(cli("stats", "--conversations", "--last", "2"), "--last and --conversations")
    assert kept(cli)[0]["turns"] == 1  # nothing refused was kept


def test_an_old_run_log_gains_the_conversations(cli, tiny_paths, tmp_path):
    path = tmp_path / "xdg_data_home" / "mtpcli" / "runs.sqlite"
    path.parent.mkdir(parents=True)
    from mtpcli import runlog

    with sqlite3.connect(path) as con:  # a log from before conversations, with a run in it
        con.executescript(runlog.SCHEMA)
        con.execute("INSERT INTO runs (time, command, settings, stats, status) VALUES (1, '[]', '{}', '{}', 0)")
    assert kept(cli) == []  # read-only: no tables yet, no conversations
    r = cli("generate", "-m", str(tiny_paths["chat"]), "-p", "x", "--max-tokens", "2", "-q", "--save")
    assert r.returncode == 0, r.stderr.decode()
    assert kept(cli)[0]["turns"] == 1
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2


@pytest.mark.slow
def test_concurrent_continues_lose_no_turn(cli, tiny_paths, tmp_path):
    assert cli("generate", "-m", str(tiny_paths["chat"]), "-p", "start", "--max-tokens", "2", "-q",
               "--save").returncode == 0
    procs = [subprocess.Popen([sys.executable, "-m", "mtpcli", "generate", "-c", "-p", f"turn {i}", "--max-tokens",
                               "3", "-q"], cwd=tmp_path, env=os.environ, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for i in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    prompts = [t["prompt"] for t in turns(cli, 1)["turns"]]
    assert prompts[0] == "start" and sorted(prompts[1:]) == [f"turn {i}" for i in range(4)]
