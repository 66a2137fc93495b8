"""Faults around `mtpcli launch` and signals (issue 31): a stopped rank ends the whole job in bounded time and is
named; a bad --backend is one line naming its choices, before MLX's launcher starts; SIGTERM ends `generate` like
Ctrl-C (what was committed, the statistics so far, the run-log row) with exit code 143."""

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import descendants, rank_of, signalled

TIMEOUT = 6  # --distributed-timeout of the stopped-rank run


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A tiny qwen2 target (a family that shards over ranks) with room for thousands of tokens."""
    from tiny import make_model

    return make_model(tmp_path_factory.mktemp("qwen") / "target", model_type="qwen2", max_positions=4096)


def _state(pid: int) -> str | None:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the ranks through /proc")
def test_a_stopped_rank_ends_the_job_within_the_timeout_and_is_named(qwen, tmp_path):
    from mtpcli.distributed.launch import KILL_AFTER

    slack = KILL_AFTER + 5  # seconds past the timeout: the ranks' time to end, the watchdog's tick, a loaded machine
    env = {**os.environ, "MTPCLI_NO_LOG": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-m", "mtpcli", "launch", "-n", "2", "--backend", "ring", "--",
                          "generate", "-m", str(qwen), "-p", "the sea is ", "--temp", "0", "--max-tokens", "4000",
                          "--draft", "none", "--distributed", "tensor", "--distributed-timeout", str(TIMEOUT)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                         cwd=tmp_path)
    victims = []
    try:
        assert select.select([p.stdout], [], [], 120)[0] and p.stdout.read(1)  # rank 0 is decoding
        victims = [c for c in descendants(p.pid) if rank_of(c) == 1]  # rank 1 whole: its wrapper and the command under it
        assert len(victims) >= 2
        for v in victims:
            os.kill(v, signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=TIMEOUT + slack + 20)  # the test itself never hangs
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
        for v in victims:  # a fix that fails leaves no stopped process behind
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(v, sig)
                except OSError:
                    pass
    err = err.decode()
    assert elapsed < TIMEOUT + slack, (elapsed, err)
    assert p.returncode not in (0, None) and "Traceback" not in err
    assert "mtpcli: error: rank 1 did not stop" in err, err
    time.sleep(0.5)
    assert not [v for v in victims if _state(v) not in (None, "Z")]  # the stopped rank was killed, not left behind


def test_a_bad_backend_is_one_line_naming_the_choices(cli):
    r = cli("launch", "--backend", "x", "-n", "2", "--", "generate", "-p", "hi", env={"NO_COLOR": "1"}, timeout=60)
    assert r.returncode == 2
    err = r.stderr.decode()
    assert len(err.strip().splitlines()) == 1 and "\x1b" not in err, err
    assert err.startswith("mtpcli: error: --backend x:") and all(b in err for b in ("ring", "mpi", "nccl", "jaccl"))


@pytest.mark.slow
def test_sigterm_prints_what_was_committed_then_stats_and_logs_the_run_exit_143(qwen):
    from mtpcli import runlog

    p = subprocess.Popen([sys.executable, "-m", "mtpcli", "generate", "--model", str(qwen),
                          "--max-tokens", "4000", "--no-chat", "--prompt", "abc"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    got, out, err = signalled(p, signal.SIGTERM)
    err = err.decode()
    assert p.returncode == 143, err
    assert "Traceback" not in err and "generated_tokens:" in err and "after" in err
    assert len(got + out) >= 20
    rows = runlog.query()
    assert len(rows) == 1 and rows[0]["status"] == 143


def test_a_job_whose_ranks_never_started_fails_with_one_line(cli, qwen):
    """mlx.launch exits 0 when no rank wrapper ran (here: no such interpreter; mpirun failing is the same hole)."""
    r = cli("launch", "-n", "2", "--python", "/nonexistent/python", "--", "generate", "-p", "hi", "--model", qwen,
            timeout=60)
    assert r.returncode == 1
    assert "mtpcli: error: no rank reported how it ended" in r.stderr.decode()


@pytest.mark.slow
def test_an_interrupted_job_whose_rank_had_to_be_killed_is_not_a_success(tmp_path):
    """Rank 0 ends 0, rank 1 ignores the Ctrl-C: the launcher kills it, names it, and exits non-zero."""
    script = 'if [ "$MLX_RANK" = 0 ]; then exit 0; else trap "" INT TERM; sleep 60; fi'
    p = subprocess.Popen([sys.executable, "-m", "mtpcli", "launch", "-n", "2", "--", "bash", "-c", script],
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=tmp_path,
                         env={**os.environ, "MTPCLI_NO_LOG": "1"})
    time.sleep(6)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0, err.decode()
    assert "rank 1 did not stop" in err.decode()
