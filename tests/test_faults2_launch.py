"""Faults under `mtpcli launch` (issue 60, items 4 and 5): every bad input is one line naming it, before MLX's
launcher starts; a job of one rank runs; no traceback from mlx.launch or the rank wrapper; Ctrl-C ends the job with
rank 0's last words relayed; mlx.launch's own lines without colour under NO_COLOR."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from helpers import signalled


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


@pytest.mark.parametrize("args", [("--hosts", "foo,bar"), ("-n", "2", "--connections-per-ip", "x")])
def test_what_mlx_launch_refuses_is_one_line_without_its_usage(cli, args):
    _one_error_line(cli("launch", *args, "--", "true", timeout=60), "mtpcli: error: mlx.launch: ")


def test_a_job_of_one_rank_decodes_as_one_process(cli, qwen):
    """mlx.launch writes an empty hostfile for one host, which mx.distributed.init cannot parse: a group of one."""
    args = ("generate", "-p", "the sea is ", "--model", qwen, "--temp", "0", "--max-tokens", "12", "--draft", "none")
    r = cli("launch", "--", *args, env={"MTPCLI_NO_LOG": "1"}, timeout=120)
    assert r.returncode == 0 and "error" not in r.stderr.decode(), r.stderr.decode()
    assert r.stdout == cli(*args, env={"MTPCLI_NO_LOG": "1"}).stdout and len(r.stdout) >= 12


def test_an_unknown_command_is_one_line_before_the_launcher_starts(cli):
    _one_error_line(cli("launch", "-n", "2", "--", "nonexistent", timeout=60), "'nonexistent'", "generate", "PATH")
    r = cli("launch", "-n", "2", "--", "./nonexistent", timeout=60)  # a path (--cwd may move it): each rank says so
    err = r.stderr.decode()
    assert r.returncode == 127 and "Traceback" not in err and "rank 1: cannot run ./nonexistent" in err, err


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals a process group")
def test_ctrl_c_ends_the_job_with_rank_0s_statistics_and_no_traceback(qwen, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "mtpcli", "launch", "-n", "2", "--backend", "ring", "--",
                          "generate", "-m", str(qwen), "-p", "the sea is ", "--temp", "0", "--max-tokens", "4000",
                          "--draft", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         cwd=tmp_path, env={**os.environ, "MTPCLI_NO_LOG": "1"})
    got, _, err = signalled(p, signal.SIGINT, n=1, seconds=120)
    assert got  # rank 0 was decoding
    err = err.decode()
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "generated_tokens:" in err and "mtpcli: interrupted after" in err  # relayed, not lost with mlx.launch
    assert "mtpcli: error" not in err, err  # the ranks ended as asked: no rank is named as failing


# ---- what a terminal shows (item 10): tables wrap, never cut; paths told apart; no view pools models -------------

QWEN = "/root/.cache/mtpcli/models/mlx-community--Qwen2.5-Coder-1.5B-Instruct-"  # two models that differ at the end


def _shown(monkeypatch, columns, draw) -> str:
    """What `draw()` prints on a terminal of `columns` columns (rich's colours taken out)."""
    import io
    import re

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    with monkeypatch.context() as m:
        m.setenv("COLUMNS", str(columns))
        m.setattr(sys, "stdout", Terminal())
        draw()
        out = sys.stdout.getvalue()
    return re.sub(r"\x1b\[[0-9;]*m", "", out)


def _cells(out: str, column: int, key: int = 0) -> list[str]:
    """One column's cells, each joined over the lines it wraps to (a row starts where column `key`, one that does not
    wrap, has text)."""
    rows = []
    for line in out.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            if cells[key] or not rows:
                rows.append("")
            rows[-1] += cells[column]
    return rows


@pytest.mark.parametrize("columns", [80, 120])
def test_model_paths_that_differ_near_the_end_stay_apart_at_80_and_120_columns(monkeypatch, columns):
    from test_ux_stats import fake

    from mtpcli import report, runlog

    for i, model in enumerate([QWEN + "4bit", QWEN + "8bit", "smollm2-135m"]):
        runlog.append_safely(**fake(i, "exact", model))
    want = ["…/mlx-community--Qwen2.5-Coder-1.5B-Instruct-4bit",
            "…/mlx-community--Qwen2.5-Coder-1.5B-Instruct-8bit", "smollm2-135m"]
    last = _shown(monkeypatch, columns, lambda: report.show(last=5))
    assert _cells(last, 3) == want and "…" not in last.replace("…/", ""), last  # wrapped, nothing cut
    by = _shown(monkeypatch, columns, lambda: report.show(by="model"))
    assert _cells(by, 0, key=1) == want and "…" not in by.replace("…/", ""), by
    cmp = _shown(monkeypatch, columns, lambda: report.show(compare=["1", "2"]))
    assert [_cells(cmp, i, key=3)[0] for i in (0, 1, 2)] == ["model", *want[:2]], cmp
    as_json = [_shown(monkeypatch, columns, lambda: report.show(**view, as_json=True)) for view in (
        {"last": 5}, {"compare": ["1", "2"]})]  # on a terminal too: the whole path
    assert json.loads(as_json[0])[0]["model"] == json.loads(as_json[1])["rows"][0][1] == QWEN + "4bit"


@pytest.mark.parametrize("columns", [80, 120])
def test_the_bench_table_wraps_and_keeps_its_headers(monkeypatch, columns):
    from mtpcli import bench

    m = {"median": 28.31, "min": 27.9, "max": 29.1}
    arm = {"decode_tps": m, "ratio": 1.0, "tokens_per_cycle": m, "acceptance_rate": m, "prefill_tps": m, "ttft_s": m,
           "peak_memory_bytes": 2**30, "e2e_ratio": 1.0,
           "e2e": {"load_s": 1.0, **dict.fromkeys(("prefill_s", "draft_prefill_s", "ttft_s", "decode_s", "run_s"), m)}}
    out = _shown(monkeypatch, columns, lambda: bench.render({"arms": [{**arm, "arm": "ar (plain)"},
                                                                      {**arm, "arm": "tree-12 (draft model)"}]}))
    out = out.split("\n\n")[0]  # the decode table (the end-to-end one follows)
    header = "".join(line.strip("┃").split("┃")[1] for line in out.splitlines() if line.startswith("┃"))
    assert "…" not in out and header.replace(" ", "") == "decodetok/smedian[min-max]", out  # (was read as markup)
    rows = [[c.replace(" ", "") for c in _cells(out, i, key=2)] for i in (0, 1)]  # (spaces: where lines wrapped)
    assert rows == [["ar(plain)", "tree-12(draftmodel)"], ["28.31[27.90-29.10]"] * 2], out


def test_no_view_pools_the_runs_of_several_models(cli):
    from test_ux_stats import _one_error_line, fake

    from mtpcli import runlog

    for r in (fake(0, "a", "smol", tps=50), fake(1, "a", "tiny", tps=900), fake(2, "b", "smol", tps=100)):
        runlog.append_safely(**r)
    for view in (("--by", "profile"), ("--by", "draft"), ("--by", "source"), ("--compare", "a", "--compare", "b")):
        _one_error_line(cli("stats", *view), view[0], "span models smol, tiny", "--model")
    by = json.loads(cli("stats", "--by", "profile", "--model", "smol", "--json").stdout)
    assert {k: g["median_decode_tps"] for k, g in by.items()} == {"a": 50, "b": 100}  # the tiny run not pooled in
    assert set(json.loads(cli("stats", "--by", "model", "--json").stdout)) == {"smol", "tiny"}
