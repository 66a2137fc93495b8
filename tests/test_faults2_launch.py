"""Faults under `mtpcli launch` (issue 60, items 4 and 5): every bad input is one line naming it, before MLX's
launcher starts; a job of one rank runs; no traceback from mlx.launch or the rank wrapper; Ctrl-C ends the job with
rank 0's last words relayed; mlx.launch's own lines without colour under NO_COLOR."""

import os
import select
import shutil
import signal
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A tiny qwen2 target (a family that shards over ranks) with room for thousands of tokens."""
    from tiny import make_model

    return make_model(tmp_path_factory.mktemp("qwen") / "target", model_type="qwen2", max_positions=4096)


def _one_error_line(r, *words, code=2):
    err = r.stderr.decode().strip()
    assert r.returncode == code and r.stdout == b"", (r.returncode, r.stdout, err)
    assert len(err.splitlines()) == 1 and err.startswith("mtpcli: error: "), err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("hosts", ["", ",", "127.0.0.1,"])
def test_an_empty_host_name_is_one_line_naming_hosts(cli, qwen, hosts):
    _one_error_line(cli("launch", "--hosts", hosts, "--", "generate", "-p", "hi", "--model", qwen, timeout=60),
                    f"--hosts {hosts!r}")


def test_a_job_of_one_rank_decodes_as_one_process(cli, qwen):
    """mlx.launch writes an empty hostfile for one host, which mx.distributed.init cannot parse: a group of one."""
    args = ("generate", "-p", "the sea is ", "--model", qwen, "--temp", "0", "--max-tokens", "12", "--draft", "none")
    r = cli("launch", "--", *args, env={"MTPCLI_NO_LOG": "1"}, timeout=120)
    assert r.returncode == 0 and "error" not in r.stderr.decode(), r.stderr.decode()
    assert r.stdout == cli(*args, env={"MTPCLI_NO_LOG": "1"}).stdout and len(r.stdout) >= 12


def test_an_unknown_command_is_one_line_before_the_launcher_starts(cli):
    _one_error_line(cli("launch", "-n", "2", "--", "nonexistent", timeout=60), "'nonexistent'", "generate", "PATH")


@pytest.mark.parametrize("program, code", [("nonexistent", 127), ("/etc/passwd", 126)])
def test_the_rank_wrapper_reports_a_command_it_cannot_run_without_a_traceback(program, code):
    """On another host the launcher cannot look: the wrapper says so in one line and reports a shell's status."""
    from mtpcli.distributed.rank import MARK

    r = subprocess.run([sys.executable, "-m", "mtpcli.distributed.rank", program], capture_output=True, timeout=60,
                       env={**os.environ, "MLX_RANK": "1"})
    err = r.stderr.decode()
    assert r.returncode == code and "Traceback" not in err, err
    assert f"mtpcli: error: rank 1: cannot run {program}" in err and f"{MARK} 1 exit {code} own" in err


def test_backend_mpi_without_mpirun_is_one_line(cli):
    path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    if shutil.which("mpirun", path=path):
        pytest.skip("MPI is installed here")
    _one_error_line(cli("launch", "-n", "2", "--backend", "mpi", "--", "generate", "-p", "hi",
                        env={"PATH": path}, timeout=60), "--backend mpi", "mpirun")


def test_mlx_launch_lines_have_no_colour_under_no_color(cli):
    r = cli("launch", "-n", "2", "--", "false", env={"NO_COLOR": "1"}, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 1 and "[WARN] Node with rank" in err, err
    assert "\x1b" not in err and "mtpcli: error: rank 0 exited with status 1" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals a process group")
def test_ctrl_c_ends_the_job_with_rank_0s_statistics_and_no_traceback(qwen, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "mtpcli", "launch", "-n", "2", "--backend", "ring", "--",
                          "generate", "-m", str(qwen), "-p", "the sea is ", "--temp", "0", "--max-tokens", "4000",
                          "--draft", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         cwd=tmp_path, env={**os.environ, "MTPCLI_NO_LOG": "1", "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert select.select([p.stdout], [], [], 120)[0] and p.stdout.read(1)  # rank 0 is decoding
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    err = err.decode()
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "generated_tokens:" in err and "mtpcli: interrupted after" in err  # relayed, not lost with mlx.launch
    assert "mtpcli: error" not in err, err  # the ranks ended as asked: no rank is named as failing
