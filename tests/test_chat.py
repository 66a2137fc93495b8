"""`mtpcli chat`: the models loaded once, a turn per line of stdin (a pipe or a terminal), the answer streamed;
Ctrl-C ends the answer being written, not the session; /stats, /reset, /save (for `generate -c`), /quit."""

import json
import os
import pty
import re
import select
import signal
import sqlite3
import sys
import time

import pytest

from mtpcli import models
from mtpcli.generate import encode_prompt
from tiny import make_model


def prompt_tokens(tmp_path):
    with sqlite3.connect(tmp_path / "xdg_data_home" / "mtpcli" / "runs.sqlite") as con:
        return [n for (n,) in con.execute("SELECT prompt_tokens FROM runs ORDER BY id")]


def test_chat_through_a_pipe(cli, tiny_paths, tmp_path):
    chat = str(tiny_paths["chat"])
    script = b"hello\n/stats\n\nagain\n/reset\nhello\n/save\nmore\n/nope\n/quit\nnever read\n"
    r = cli("chat", "-m", chat, "--max-tokens", "5", input=script)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    answers = r.stdout.decode().splitlines()
    assert len(answers) == 4 and answers[0] == answers[2]  # after /reset, the same first turn: the same answer
    assert "generated_tokens: 5" in err and "a new conversation" in err and "unknown command /nope" in err
    assert "saved as conversation 1" in err and "never read" not in err
    tok = models.load(chat).tokenizer
    first = encode_prompt(tok, "hello", None, None)
    second = encode_prompt(tok, "again", None, None, [{"role": "user", "content": "hello"},
                                                       {"role": "assistant", "content": answers[0]}])
    assert prompt_tokens(tmp_path)[:3] == [len(first), len(second), len(first)]  # the 2nd: the whole conversation
    r = cli("generate", "-c", "-p", "go on", "--max-tokens", "3", "-q")  # /save kept what -c goes on from
    assert r.returncode == 0, r.stderr.decode()
    conv = json.loads(cli("stats", "--conversation", "1", "--json").stdout)
    assert [t["prompt"] for t in conv["turns"]] == ["hello", "more", "go on"]  # a turn after /save is kept too
    assert [t["answer"] for t in conv["turns"][:2]] == answers[2:]


def test_chat_refuses_what_it_cannot_do_in_one_line(cli, tiny_paths):
    r = cli("chat", "-m", str(tiny_paths["chat"]), "--format", "json", input=b"hi\n")
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and b"chat writes text" in r.stderr
    r = cli("chat", "-c", "-m", str(tiny_paths["chat"]), input=b"hi\n")
    assert r.returncode == 2 and b"so no conversations" in r.stderr
    r = cli("chat", "-m", str(tiny_paths["target"]), input=b"hi\n")  # a tokenizer without a chat template
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and b"needs the model's chat template" in r.stderr


def read_until(fd, marker: bytes, seen: bytearray, timeout=120.0) -> bytes:
    """Read the pty until MARKER appears after what was SEEN (all output is kept in SEEN)."""
    start, deadline = len(seen), time.monotonic() + timeout
    while marker not in seen[start:]:
        assert time.monotonic() < deadline, f"no {marker!r} in {bytes(seen[start:])[-2000:]!r}"
        if select.select([fd], [], [], 1.0)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the child ended
                break
    return bytes(seen[start:])


@pytest.mark.slow
def test_chat_through_a_terminal_with_ctrl_c_mid_answer(tmp_path):
    long = make_model(tmp_path / "long", chat_template=True, max_positions=8192)
    pid, fd = pty.fork()
    if pid == 0:  # the child: mtpcli chat on the pty (its controlling terminal, so ^C is SIGINT)
        os.chdir(tmp_path)
        os.execve(sys.executable, [sys.executable, "-m", "mtpcli", "chat", "-m", str(long), "--draft", "none",
                                   "--max-tokens", "8000"], os.environ)
    seen = bytearray()
    try:
        read_until(fd, b">>> ", seen)
        os.write(fd, b"hello\r")
        answer = read_until(fd, b"x83t", seen)  # the answer streams ...
        os.write(fd, b"\x03")  # ... and Ctrl-C ends it
        after = read_until(fd, b">>> ", seen)
        assert b"interrupted after" in after
        os.write(fd, b"/stats\r")
        stats = read_until(fd, b">>> ", seen)
        assert b"generated_tokens" in stats
        n = int(re.search(rb"generated_tokens\D+(\d+)", re.sub(rb"\x1b\[[0-9;]*m", b"", stats)).group(1))  # (a table)
        assert 0 < n < 8000, stats
        os.write(fd, b"/reset\r")
        assert b"a new conversation" in read_until(fd, b">>> ", seen)
        os.write(fd, b"/quit\r")
        _, status = os.waitpid(pid, 0)
        pid = None
        assert os.waitstatus_to_exitcode(status) == 0, bytes(seen)[-2000:]
        assert b"x83t" in answer
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
