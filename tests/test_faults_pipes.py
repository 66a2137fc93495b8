"""A reader that leaves early (`| head -c 5`) ends every command the same way: exit 141, no traceback."""

import os
import subprocess
import sys

import pytest

from mtpcli.errors import EXIT_PIPE


def closed_stdout(args, cwd, timeout=120):
    """Run `mtpcli ARGS` with a stdout whose reader has already gone; (exit code, stderr)."""
    r, w = os.pipe()
    os.close(r)  # every write to w fails with EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "mtpcli", *map(str, args)], stdout=w, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, cwd=cwd, timeout=timeout)
    finally:
        os.close(w)
    return p.returncode, p.stderr.decode()


@pytest.fixture
def logged(cli, tiny_paths):
    """A run log and a history with one run of the tiny model in them."""
    r = cli("generate", "--model", tiny_paths["target"], "--no-chat", "--max-tokens", "8", "--history",
            input=b"abcabc")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args", [
    ["--help"], ["generate", "--help"], ["profile", "list"], ["profile", "show", "exact"], ["profile", "validate"],
    ["models", "list"], ["stats"], ["stats", "--json"], ["stats", "--export", "jsonl"], ["stats", "--by", "source"],
    ["history", "export"], ["history", "stats"],
], ids=" ".join)
def test_every_command_ends_141_when_its_reader_left(logged, tmp_path, args):
    code, err = closed_stdout(args, tmp_path)
    assert code == EXIT_PIPE, err
    assert "Traceback" not in err and "error" not in err


@pytest.mark.slow
def test_generate_ends_141_too(tiny_paths, tmp_path):
    code, err = closed_stdout(["generate", "--model", tiny_paths["target"], "--no-chat", "--max-tokens", "8",
                               "-p", "abcabc", "-q"], tmp_path)
    assert code == EXIT_PIPE and "Traceback" not in err
    assert "stdout was closed" in err
