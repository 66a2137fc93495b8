"""Faults of what mtpcli keeps and writes (issue 31): SQLite files of another schema, --stats-json / --out / --file
that cannot be written or read as asked, a full disk, a read-only data folder."""

import errno
import io
import json
import os
import signal
import sqlite3
import sys

import pytest

from mtpcli import history, runlog

FOREIGN = {"runs": "CREATE TABLE runs (a); INSERT INTO runs VALUES (1)",  # our table's name, another's columns
           "other": "CREATE TABLE other (x); INSERT INTO other VALUES (1)"}  # none of our tables at all


def _foreign(path, script):
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.executescript(script.replace("runs", "docs") if path.name == "history.sqlite" else script)
    con.close()
    return path.read_bytes(), sorted(os.listdir(path.parent))


def _one_error_line(r, *names):
    err = r.stderr.decode()
    assert r.returncode != 0 and "Traceback" not in err and "internal error" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("mtpcli: error:")]
    assert len(lines) == 1 and all(str(n) in lines[0] for n in names), err
    return lines[0]


def _gen(cli, model, *extra):
    return cli("generate", "-m", model, "-p", "abc", "--max-tokens", "5", "-q", *extra)


# ---- A: a valid SQLite file of another schema -------------------------------------------------------------------

@pytest.mark.parametrize("shape", FOREIGN)
def test_a_foreign_run_log_is_left_byte_identical_and_named_once(cli, tiny_paths, shape):
    _left_alone(cli, tiny_paths, runlog.log_path(), shape, [("stats",), ("stats", "--last", "2"),
                                                             ("stats", "--clear", "--yes")])


@pytest.mark.parametrize("shape", FOREIGN)
def test_a_foreign_history_store_is_left_byte_identical_and_named_once(cli, tiny_paths, shape):
    _left_alone(cli, tiny_paths, history.store_path(), shape, [("history", "stats"), ("history", "stats", "--json"),
                                                               ("history", "export"), ("history", "clear", "--yes")],
                "--history", "--no-log")


def _left_alone(cli, tiny_paths, path, shape, reads, *extra):
    """A store of another schema at PATH: a run (with EXTRA) warns once naming it, each command of READS is one
    error line naming it, and it is left byte-identical (no WAL, no new table, no side file)."""
    before = _foreign(path, FOREIGN[shape])
    r = _gen(cli, tiny_paths["target"], *extra)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert r.stderr.decode().count(str(path)) == 1 and "warning" in r.stderr.decode()
    assert (path.read_bytes(), sorted(os.listdir(path.parent))) == before
    for args in reads:
        assert "schema" in _one_error_line(cli(*args), path)
    assert (path.read_bytes(), sorted(os.listdir(path.parent))) == before


# ---- B: stats --file of the wrong shape ---------------------------------------------------------------------------

@pytest.mark.parametrize("doc", ["[]", "null", '{"stats": "x"}', '{"a": 1}', "WRONG_TYPES"])
def test_stats_file_of_the_wrong_shape_is_one_line_naming_the_file(cli, tmp_path, doc):
    from mtpcli.stats import REQUIRED

    f = tmp_path / "s.json"
    f.write_text(json.dumps(dict.fromkeys(REQUIRED, "x")) if doc == "WRONG_TYPES" else doc)
    r = cli("stats", "--file", f)
    assert r.returncode == 2 and not r.stdout
    _one_error_line(r, "--file", f)


def test_stats_plot_that_cannot_be_written_fails_before_the_view(cli, tmp_path):
    from test_runlog import fake

    (tmp_path / "a_file").write_text("x")
    (tmp_path / "s.json").write_text(json.dumps(fake(0)["stats"]))
    r = cli("stats", "--file", "s.json", "--plot", "a_file/p.png")
    assert r.returncode == 2 and not r.stdout
    _one_error_line(r, "--plot", "a_file/p.png")


# ---- C: results lost on write -----------------------------------------------------------------------------------

def _bench(cli, tiny_paths, tmp_path, *extra):
    (tmp_path / "p.txt").write_text("abcab")
    return cli("bench", "-m", tiny_paths["target"], "--seeds", "1", "--max-tokens", "4", "--prompts",
               tmp_path / "p.txt", "--no-log", *extra)


@pytest.mark.parametrize("where", ["a_file/o.json", "/proc/no/o.json", "."])
def test_bench_out_that_cannot_be_written_fails_before_the_benchmark(cli, tiny_paths, tmp_path, where):
    (tmp_path / "a_file").write_text("x")
    r = _bench(cli, tiny_paths, tmp_path, "--out", where)
    assert r.returncode == 2 and not r.stdout
    _one_error_line(r, "--out", where)
    assert b"seed=" not in r.stderr  # nothing was run


def test_bench_prints_its_table_before_a_write_that_fails(cli, tiny_paths, tmp_path):
    r = _bench(cli, tiny_paths, tmp_path, "--out", "/dev/full")
    assert b"decode tok/s" in r.stdout  # the table is out, the write failed after it
    assert r.returncode == 1 and "No space left" in _one_error_line(r, "--out", "/dev/full")


@pytest.mark.parametrize("where", ["a_file/s.json", "/proc/no/s.json"])
def test_stats_json_that_cannot_be_written_fails_before_the_run(cli, tiny_paths, tmp_path, where):
    (tmp_path / "a_file").write_text("x")
    r = _gen(cli, tiny_paths["target"], "--stats-json", where)
    assert r.returncode == 2 and not r.stdout
    _one_error_line(r, "--stats-json", where)
    assert not runlog.log_path().exists()  # no run, nothing logged


def test_stats_json_on_a_full_disk_exits_non_zero_after_the_text(cli, tiny_paths):
    r = _gen(cli, tiny_paths["target"], "--stats-json", "/dev/full")
    assert r.stdout.strip()  # the text is out
    assert r.returncode == 1 and "No space left" in _one_error_line(r, "--stats-json", "/dev/full")


def _full_disk(monkeypatch, folder):
    """Every write of a file in FOLDER fails as on a full disk, after the file was opened (and truncated)."""
    real = open

    class Full(io.StringIO):
        def __init__(self, f):
            super().__init__()
            self.f = f

        def write(self, s):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            self.f.close()
            super().close()

    def fake(file, mode="r", *a, **k):
        f = real(file, mode, *a, **k)
        inside = isinstance(file, (str, os.PathLike)) and os.path.dirname(os.path.abspath(file)) == str(folder)
        return Full(f) if inside and ("w" in mode or "a" in mode) else f

    real_fdopen = os.fdopen

    def fake_fdopen(fd, mode="r", *a, **k):  # (a temporary file made with mkstemp)
        f = real_fdopen(fd, mode, *a, **k)
        inside = os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) == str(folder)
        return Full(f) if inside and ("w" in mode or "a" in mode) else f

    monkeypatch.setattr("builtins.open", fake)
    monkeypatch.setattr(io, "open", fake)
    monkeypatch.setattr(os, "fdopen", fake_fdopen)


def _main(monkeypatch, capsys, *args):
    """`mtpcli ARGS` in this process (so a test can make a write fail): (exit status, stdout, stderr)."""
    import rich.console

    from mtpcli import cli

    monkeypatch.setenv("MTPCLI_BLAS", "reference")  # main() never re-executes the test process
    monkeypatch.setattr(sys, "argv", ["mtpcli", *map(str, args)])
    monkeypatch.setattr(rich.console.Console, "on_broken_pipe", rich.console.Console.on_broken_pipe)  # restored
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            cli.main()
    finally:
        signal.signal(signal.SIGTERM, handler)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_a_stats_json_write_on_a_full_disk_leaves_the_earlier_file_intact(tiny_paths, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    f = out_dir / "s.json"
    f.write_text('{"earlier": true}\n')
    _full_disk(monkeypatch, out_dir)
    code, out, err = _main(monkeypatch, capsys, "generate", "-m", tiny_paths["target"], "-p", "abc", "--max-tokens",
                           "5", "-q", "--stats-json", f)
    assert out.strip() and code == 1
    assert f.read_text() == '{"earlier": true}\n' and os.listdir(out_dir) == ["s.json"]  # no temporary file left
    lines = [x for x in err.splitlines() if x.startswith("mtpcli: error:")]
    assert len(lines) == 1 and "--stats-json" in lines[0] and str(f) in lines[0], err


# ---- D: misleading messages -------------------------------------------------------------------------------------

def _disk_full_db(monkeypatch):
    """Every SQLite file on disk is as full as it is now (a new one cannot take its first table): SQLITE_FULL on a
    write that needs another page."""
    real = sqlite3.connect

    def connect(database, *a, **k):
        con = real(database, *a, **k)
        if database != ":memory:":
            con.execute("PRAGMA max_page_count = 1")  # never below the file's size: no page more
        return con

    monkeypatch.setattr(sqlite3, "connect", connect)


def _record(i, text=""):
    from test_runlog import fake

    return {**fake(i), "prompt_text": text}


def test_a_full_disk_is_reported_as_full_not_as_a_rollback_or_an_unreadable_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runlog, "_warned", set())
    log = runlog.log_path()
    runlog.append_safely(**_record(0))
    store = history.Store("tok", path=tmp_path / "h.sqlite")
    store.add([1], [2, 3])
    assert store.save() == 1
    with monkeypatch.context() as m:
        _disk_full_db(m)
        assert runlog.append_safely(**_record(1, "x" * 200_000)) is None
        store.add([1], list(range(50_000)))
        assert store.save() == 0
        m.setenv("XDG_DATA_HOME", str(tmp_path / "new"))  # a new log on a full disk
        runlog._warned.clear()
        assert runlog.append_safely(**_record(2)) is None
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "warning" in x]
    assert len(lines) == 3, err
    for line in lines:
        assert "full" in line and "rollback" not in line and "unreadable" not in line, line
    assert [r["id"] for r in runlog.query(path=log)] == [1]  # intact
    assert len(history.Store("tok", path=tmp_path / "h.sqlite").load().docs) == 1


def _read_only_folder(monkeypatch, folder):
    """SQLite in a read-only folder (so a user other than root sees one): a WAL file there, without its -shm, opens
    for reading with immutable=1 only; anything else fails as "attempt to write a readonly database"."""
    real = sqlite3.connect

    def connect(database, *a, **k):
        if str(folder) in str(database) and "immutable=1" not in str(database):
            raise sqlite3.OperationalError("attempt to write a readonly database")
        return real(database, *a, **k)

    monkeypatch.setattr(sqlite3, "connect", connect)


def test_stats_and_history_read_an_intact_store_in_a_read_only_folder(monkeypatch, capsys):
    for i in range(2):
        runlog.append_safely(**_record(i))
    store = history.Store("tok")
    store.add([1], [2, 3])
    store.save()
    _read_only_folder(monkeypatch, runlog.data_dir())
    both_read(monkeypatch, capsys)


def both_read(monkeypatch, capsys):
    """`stats` reads the run log's two runs, `history stats` and the history drafter the store's one document."""
    code, out, err = _main(monkeypatch, capsys, "stats", "--last", "5", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [1, 2], err
    code, out, err = _main(monkeypatch, capsys, "history", "stats", "--json")
    assert code == 0 and json.loads(out)["tokenizers"][0]["docs"] == 1, err
    assert len(history.Store("tok").load().docs) == 1


def test_result_files_may_be_devices_and_keep_their_mode(tmp_path):
    import stat

    from mtpcli.writers import check_writable, write_file

    check_writable("--stats-json", "/dev/stdout")  # a pipe or a terminal, written in place
    write_file("--stats-json", "/dev/null", "{}")
    kept = tmp_path / "s.json"
    kept.write_text("{}")
    kept.chmod(0o600)
    write_file("--stats-json", str(kept), '{"a": 1}')
    assert kept.read_text() == '{"a": 1}' and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary file left


@pytest.mark.slow
def test_stats_json_is_written_even_when_stderr_and_stdout_are_closed(tiny_paths, tmp_path):
    import os
    import subprocess
    import sys

    out = tmp_path / "s.json"
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "mtpcli", "generate", "--model", str(tiny_paths["target"]),
                            "--no-chat", "--max-tokens", "6", "-p", "abcabc", "--stats-json", str(out)],
                           stdout=w, stderr=w, stdin=subprocess.DEVNULL, cwd=tmp_path, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 141
    assert json.loads(out.read_text())["generated_tokens"] >= 1


@pytest.mark.slow
def test_stats_json_to_dev_stdout_redirected_to_a_file_keeps_the_text(tiny_paths, tmp_path):
    import subprocess

    out = tmp_path / "o.txt"
    with open(out, "wb") as f:
        p = subprocess.run([sys.executable, "-m", "mtpcli", "generate", "--model", str(tiny_paths["target"]),
                            "--no-chat", "--max-tokens", "5", "-p", "abcabc", "-q", "--no-log",
                            "--stats-json", "/dev/stdout"], stdout=f, stderr=subprocess.PIPE, cwd=tmp_path,
                           timeout=120)
    assert p.returncode == 0, p.stderr
    text, _, doc = out.read_text().partition("\n")
    assert text and json.loads(doc)["generated_tokens"] == 5
