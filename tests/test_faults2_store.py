"""Faults of what mtpcli keeps (issue 60): prompts kept out of the run log and the history unless --log-prompts,
user files and finished runs not lost, odd rows and blobs skipped by name, stores read in read-only folders and on
full disks, a locked store costing seconds, not minutes, and MTPCLI_NO_LOG read as a boolean."""

import json
import os
import stat

import numpy as np
import pytest

from mtpcli import history, runlog
from test_faults_store import _main, both_read


def _secret_free(blob: bytes, secrets, ids_of) -> bool:
    """No secret in BLOB: neither its text nor its token ids as the history keeps them (int32)."""
    return not any(s.encode() in blob or np.asarray(ids_of(s), "<i4").tobytes() in blob for s in secrets)


def test_prompts_are_kept_only_as_a_hash_unless_log_prompts(tiny_paths, tmp_path, monkeypatch, capsys):
    from tiny import VOCAB

    def ids_of(text):
        return [VOCAB.index(c) for c in text]

    chat = tiny_paths["chat"]
    secrets = {k: f"{k} qzv secret 8317" for k in ("flag", "arg", "eq", "system", "file", "sep")}
    (tmp_path / "f.txt").write_text(secrets["file"])
    monkeypatch.chdir(tmp_path)
    runs = [("-p", secrets["flag"], "--system", secrets["system"], "-n", "2", "--separator", secrets["sep"]),
            (secrets["arg"], f"--system={secrets['system']}"), (f"--prompt={secrets['eq']}",),
            ("--prompt-file", "f.txt")]
    for args in runs:
        code, _, err = _main(monkeypatch, capsys, "generate", "-m", chat, "--max-tokens", "4", "-q", "--history", *args)
        assert code == 0, err
    data = runlog.data_dir()
    stored = b"".join(p.read_bytes() for p in sorted(data.iterdir()))
    views = "".join(_main(monkeypatch, capsys, *v)[1] for v in (
        ("stats", "--export", "jsonl"), ("stats", "--json"), ("stats", "--last", "9", "--json"), ("history", "export")))
    assert _secret_free(stored + views.encode(), secrets.values(), ids_of)
    first, _, third, _ = [r["command"] for r in runlog.query()]
    assert first[first.index("-p") + 1] == runlog.REDACTED and third[-1] == f"--prompt={runlog.REDACTED}"
    for p in data.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    asked = "asked qzv secret 4411"
    code, _, err = _main(monkeypatch, capsys, "generate", "-m", chat, "--max-tokens", "4", "-q", "--history",
                         "--log-prompts", "-p", asked)
    assert code == 0, err
    last = runlog.query()[-1]
    assert last["prompt"] == asked and asked in last["command"]
    assert not _secret_free((data / "history.sqlite").read_bytes(), [asked], ids_of)  # its ids, kept as asked


# ---- item 6: stores SQLite cannot open as it likes, a folder in their place, damaged rows, a held lock ----------

def _records(n):
    from test_runlog import fake

    for i in range(n):
        runlog.append_safely(**fake(i, profile="ab"[i % 2]))


def _saved_docs(*outputs):
    store = history.Store("tok")
    for out in outputs:
        store.add([1], out)
    store.save()


@pytest.mark.parametrize("why", ["unable to open database file", "disk I/O error"])
def test_intact_stores_are_read_where_sqlite_cannot_make_its_shm(monkeypatch, capsys, why):
    """A read-only folder (SQLite: "unable to open") and a full disk ("disk I/O error") as SQLite reports them (seen
    by hand with a read-only bind mount and a full tmpfs, which a test cannot mount): a WAL file opens for reading
    only as immutable."""
    import sqlite3

    _records(2)
    _saved_docs([2, 3])
    real = sqlite3.connect

    def connect(database, *a, **k):
        if str(runlog.data_dir()) in str(database) and "immutable=1" not in str(database):
            raise sqlite3.OperationalError(why)
        return real(database, *a, **k)

    monkeypatch.setattr(sqlite3, "connect", connect)
    both_read(monkeypatch, capsys)


@pytest.mark.parametrize("args", [("stats",), ("stats", "--clear", "--yes"), ("history", "stats"),
                                  ("history", "clear", "--yes"), ("history", "export")])
def test_a_folder_in_place_of_a_store_is_an_error_naming_it(monkeypatch, capsys, args):
    for name in ("runs.sqlite", "history.sqlite"):
        (runlog.data_dir() / name).mkdir(parents=True)
    code, out, err = _main(monkeypatch, capsys, *args)
    path = runlog.log_path() if args[0] == "stats" else history.store_path()
    assert code == 2 and not out and err.count("mtpcli: error:") == 1 and f"{path}: a folder" in err, err


def test_generate_beside_folders_in_place_of_its_stores_warns_once_for_each(tiny_paths, monkeypatch, capsys):
    for name in ("runs.sqlite", "history.sqlite"):
        (runlog.data_dir() / name).mkdir(parents=True)
    code, out, err = _main(monkeypatch, capsys, "generate", "-m", tiny_paths["target"], "-p", "abc", "--max-tokens",
                           "4", "-q", "--history")
    warnings = [x for x in err.splitlines() if "warning" in x]
    assert code == 0 and len(warnings) == 2 and all("a folder" in x for x in warnings), err


@pytest.mark.parametrize("column, value, why", [("stats", "{not json", "its stats is not JSON"),
                                                ("stats", "[]", "its stats is a JSON list"),
                                                ("stats", '{"a": 1}', "its stats have no"),
                                                ("time", "yesterday", "its time is 'yesterday'")])
def test_a_damaged_run_log_row_is_skipped_by_name_in_every_view(monkeypatch, capsys, column, value, why):
    import sqlite3

    _records(4)
    with sqlite3.connect(runlog.log_path()) as con:
        con.execute(f"UPDATE runs SET {column} = ? WHERE id = 3", (value,))
    views = [("stats",), ("stats", "--last", "9"), ("stats", "--last", "9", "--json"), ("stats", "--by", "profile"),
             ("stats", "--by", "model", "--json"), ("stats", "--compare", "a", "--compare", "b"),
             ("stats", "--model", "m", "--last", "9"), ("stats", "--export", "jsonl"), ("history", "stats")]
    for args in views:
        runlog._warned.clear()
        code, out, err = _main(monkeypatch, capsys, *args)
        assert code == 0 and "error" not in err, (args, err)
        assert err.count("warning") == 1 and "run 3 skipped" in err and why in err, (args, err)
    assert [r["id"] for r in runlog.query()] == [1, 2, 4]


def test_an_odd_blob_is_skipped_by_id_not_the_whole_history(monkeypatch, capsys):
    import sqlite3

    _saved_docs([2, 3], [4, 5], [6, 7])
    with sqlite3.connect(history.store_path()) as con:
        con.execute("UPDATE docs SET output = ? WHERE id = 2", (b"\x01\x02\x03",))
        con.execute("UPDATE docs SET prompt = 'text' WHERE id = 3")
    runlog._warned.clear()
    store = history.Store("tok").load()
    assert not store.broken and [d.output.tolist() for d in store.docs] == [[2, 3]]
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "2 outputs skipped (id 2: 3 bytes" in err and "id 3: a str" in err, err
    code, out, err = _main(monkeypatch, capsys, "history", "export")
    assert code == 0 and [json.loads(x)["id"] for x in out.splitlines()] == [1], err


@pytest.mark.slow
def test_a_locked_store_costs_seconds_then_one_warning(monkeypatch, capsys):
    """A lock another process holds (here: a write transaction left open) delays a run's end by seconds, not the
    30 s per write of SQLite's busy timeout before: the cost table 1 s, the record and the history 5 s each."""
    import sqlite3
    import time

    from test_runlog import fake

    _records(1)
    _saved_docs([2, 3])
    held = [sqlite3.connect(p, isolation_level=None) for p in (runlog.log_path(), history.store_path())]
    for con in held:
        con.execute("BEGIN IMMEDIATE")
    runlog._warned.clear()
    t0 = time.monotonic()
    runlog.update_costs("k", lambda _: {"a": 1})
    assert runlog.append_safely(**fake(1)) is None
    store = history.Store("tok")
    store.add([1], [4, 5])
    assert store.save() == 0
    assert time.monotonic() - t0 < 15
    for con in held:
        con.rollback()
    lines = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert len(lines) == 2 and all("locked by another process" in x for x in lines), lines
    assert "run not logged" in lines[0] and "history not saved" in lines[1]


def test_sixteen_concurrent_writers_lose_no_record_and_no_cost_update():
    """The short patience is for a lock nobody releases: writers that keep committing are waited for (a 5 s busy
    timeout alone lost 8 of 320 records here)."""
    import multiprocessing as mp

    from test_runlog import writer

    _records(1)
    with mp.get_context("spawn").Pool(16) as pool:
        pool.map(writer, [(os.environ["XDG_DATA_HOME"], i, 20, True) for i in range(16)])
    assert len(runlog.query()) == 1 + 16 * 20 and runlog.load_costs("k") == {"n": 16 * 20}


# ---- item 8: MTPCLI_NO_LOG -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, off", [("", False), ("0", False), ("false", False), ("No", False), ("off", False),
                                        ("1", True), ("true", True), ("YES", True), ("on", True)])
def test_mtpcli_no_log_is_a_boolean(monkeypatch, value, off):
    from test_runlog import fake

    monkeypatch.setenv("MTPCLI_NO_LOG", value)
    assert (runlog.append_safely(**fake(0)) is None) is off


def test_an_unknown_mtpcli_no_log_is_one_line_naming_it_before_the_run(tiny_paths, monkeypatch, capsys):
    monkeypatch.setenv("MTPCLI_NO_LOG", "maybe")
    code, out, err = _main(monkeypatch, capsys, "generate", "-m", tiny_paths["target"], "-p", "abc")
    assert code == 2 and not out and err.strip().splitlines() == [
        "mtpcli: error: environment MTPCLI_NO_LOG: 'maybe' is not a valid bool (1, true, yes, on or 0, false, no, off)"]


# ---- items 2 and 4: user files and finished runs kept, caps at their edges, a plot format ---------------------------

def _one_error(code, out, err, *names):
    lines = [x for x in err.splitlines() if x.startswith("mtpcli: error:")]
    assert code == 2 and not out and len(lines) == 1 and all(str(n) in lines[0] for n in names), err


def test_a_history_cap_under_one_answer_is_refused_before_it_deletes_anything(tiny_paths, monkeypatch, capsys):
    _saved_docs([2, 3], [4, 5])
    gen = ("generate", "-m", tiny_paths["target"], "-p", "abc", "--max-tokens", "4", "-q", "--history")
    _one_error(*_main(monkeypatch, capsys, *gen, "--history-max-mb", "1e-300"), "--history-max-mb 1e-300", "delete")
    monkeypatch.setenv("MTPCLI_HISTORY_MAX_MB", "0.000001")
    _one_error(*_main(monkeypatch, capsys, *gen), "history_max_mb (env MTPCLI_HISTORY_MAX_MB) 1e-06")
    assert history.summary()["tokenizers"][0]["docs"] == 2


def test_a_history_cap_of_1e308_is_no_cap(tiny_paths, monkeypatch, capsys):
    _saved_docs([2, 3])
    code, _, err = _main(monkeypatch, capsys, "generate", "-m", tiny_paths["target"], "-p", "abc", "--max-tokens", "4",
                         "-q", "--history", "--history-max-mb", "1e308")
    assert code == 0 and "error" not in err, err
    assert sum(t["docs"] for t in history.summary()["tokenizers"]) == 2


@pytest.mark.parametrize("inputs, result", [(("--prompt-file", "p.txt"), "p.txt"),
                                            (("--prompt-file", "d", "--prompt-file", "p.txt"), "d/../d/a.txt"),
                                            (("--prompts-jsonl", "p.jsonl"), "./p.jsonl"),
                                            (("--prompt-file", "p.txt"), "link.txt")])
def test_stats_json_onto_the_runs_own_prompt_file_is_refused_before_the_run(tmp_path, monkeypatch, capsys, inputs,
                                                                            result):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    for name, text in (("p.txt", "abc"), ("d/a.txt", "abc"), ("p.jsonl", '{"prompt": "abc"}\n')):
        (tmp_path / name).write_text(text)
    (tmp_path / "link.txt").symlink_to(tmp_path / "p.txt")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    _one_error(*_main(monkeypatch, capsys, "generate", "-m", "no-such-model", *inputs, "--stats-json", result),
               f"--stats-json {result}", "prompt file")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not runlog.log_path().exists()


def test_bench_out_onto_its_own_prompt_file_is_refused_before_the_benchmark(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("abcab")
    _one_error(*_main(monkeypatch, capsys, "bench", "-m", "no-such-model", "--prompts", "q.txt,p.txt", "--out",
                      "p.txt"), "--out p.txt", "prompt file")
    assert (tmp_path / "p.txt").read_text() == "abcab"


@pytest.mark.parametrize("signal_arg, status", [((), 130), ((143,), 143)])
def test_an_interrupted_bench_prints_keeps_and_logs_the_runs_that_finished(tiny_paths, tmp_path, monkeypatch, capsys,
                                                                          signal_arg, status):
    from mtpcli import bench

    real, calls = bench.run_mtpcli, []

    def run(*a):  # the warm-up, two runs, then Ctrl-C (or SIGTERM) in the third
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt(*signal_arg)
        return real(*a)

    monkeypatch.setattr(bench, "run_mtpcli", run)
    (tmp_path / "p.txt").write_text("abcab")
    code, out, err = _main(monkeypatch, capsys, "bench", "-m", tiny_paths["target"], "--seeds", "3", "--max-tokens",
                           "4", "--prompts", tmp_path / "p.txt", "--out", tmp_path / "o.json")
    assert code == status and "decode tok/s" in out, err
    assert "stopped after 2 of 3 runs" in err
    result = json.loads((tmp_path / "o.json").read_text())
    assert result["interrupted"]["runs"] == 2 and len(result["outputs"]["exact"]) == 2
    (row,) = runlog.query()
    assert row["status"] == status and row["stats"]["generated_tokens"] == 8


def test_stats_plot_in_a_format_matplotlib_cannot_write_is_refused_before_the_view(monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    _records(1)
    _one_error(*_main(monkeypatch, capsys, "stats", "--plot", "x.txt"), "--plot x.txt", ".png")


def test_a_run_log_made_readable_by_others_before_is_made_private_when_next_opened(tmp_path, monkeypatch):
    """A runs.sqlite (and its journal) an older mtpcli created 0644 is 0600 once a run opens it to write."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    path = runlog.log_path()
    runlog._connect(path, create=True).close()
    for f in path.parent.glob("runs.sqlite*"):
        f.chmod(0o644)
    runlog._connect(path, create=True).close()
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in path.parent.glob("runs.sqlite*"))
