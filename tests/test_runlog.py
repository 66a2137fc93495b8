"""The run log and `mtpcli stats`."""

import json
import multiprocessing as mp
import os
import statistics

import pytest

from mtpcli import report, runlog
from mtpcli.errors import UsageError


def fake(i, profile="exact", model="m", tpc=2.0, drafted=10, accepted=5, tps=100.0):
    stats = {"prompt_tokens": 5, "generated_tokens": int(tpc * 10), "cycles": 10, "drafted": drafted,
             "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else 0.0, "tokens_per_cycle": tpc, "accept_by_position": [0.5, 0.5],
             "accept_length_hist": {"0": 5, "2": 5}, "draft_width_hist": {"2": 10}, "prefill_tps": 50.0,
             "decode_tps": tps, "ttft_s": 0.1, "peak_memory_bytes": 1000}
    return dict(command=["generate"], settings={"law": "exact"}, profile=profile, model=model, draft="d",
                prompt=[1, 2, 3], stats=stats, status=0, started=1000.0 + i)


def test_records_written_and_read_back():
    for i in range(3):
        assert runlog.append_safely(**fake(i)) == i + 1
    rows = runlog.query()
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert rows[0]["stats"]["generated_tokens"] == 20 and rows[0]["prompt"] is None
    assert len(rows[0]["prompt_hash"]) == 16
    assert [r["id"] for r in runlog.query(last=2)] == [2, 3]
    assert [r["id"] for r in runlog.query(since=1001.5)] == [3]


def test_no_log_env_skips(monkeypatch):
    monkeypatch.setenv("MTPCLI_NO_LOG", "1")
    assert runlog.append_safely(**fake(0)) is None
    assert not runlog.log_path().exists()


def writer(args):
    """Writer I's N records (a process of a pool), each with a cost update where COSTS (test_faults2_store's)."""
    home, i, n, costs = args
    os.environ["XDG_DATA_HOME"] = home
    for j in range(n):
        runlog.append_safely(**fake(i * 100 + j))
        if costs:
            runlog.update_costs("k", lambda kept: {"n": (kept or {}).get("n", 0) + 1})


@pytest.mark.slow
def test_eight_concurrent_writers_lose_no_record():
    home = os.environ["XDG_DATA_HOME"]
    runlog.append_safely(**fake(0))  # create the log first
    with mp.get_context("spawn").Pool(8) as pool:
        pool.map(writer, [(home, i, 5, False) for i in range(8)])
    assert len(runlog.query()) == 1 + 8 * 5


def test_aggregates_against_hand_computed():
    recs = [fake(0, "a", tpc=2.0, drafted=10, accepted=5, tps=100), fake(1, "a", tpc=3.0, drafted=10, accepted=8, tps=150),
            fake(2, "a", tpc=4.0, drafted=20, accepted=20, tps=90), fake(3, "b", tpc=1.0, drafted=0, accepted=0, tps=50)]
    for r in recs:
        runlog.append_safely(**r)
    g = report.group_by(runlog.query(), "profile")
    assert g["a"]["runs"] == 3 and g["a"]["tokens"] == 20 + 30 + 40
    assert g["a"]["median_tokens_per_cycle"] == 3.0
    assert g["a"]["acceptance"] == pytest.approx(33 / 40)
    assert g["a"]["median_decode_tps"] == statistics.median([100, 150, 90])
    assert g["b"]["acceptance"] == 0.0
    rows = {r[0]: r for r in report.compare_rows(g["a"], g["b"])}
    assert rows["median_decode_tps"][3] == pytest.approx(50 / 100)


def test_missing_and_corrupt_logs():
    with pytest.raises(UsageError, match="no run log yet"):
        runlog.query()
    path = runlog.log_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not sqlite" * 100)
    before = path.read_bytes()
    with pytest.raises(UsageError, match=str(path)):
        runlog.query()
    assert path.read_bytes() == before  # left untouched


def test_stats_cli_views_and_json(cli):
    for r in (fake(0, "a"), fake(1, "b", tpc=3.0)):
        runlog.append_safely(**r)
    out = cli("stats", "--json")
    assert json.loads(out.stdout)["tokens_per_cycle"] == 3.0  # the last run
    assert "tokens_per_cycle: 3.000" in cli("stats").stdout.decode()
    rows = json.loads(cli("stats", "--last", 5, "--json").stdout)
    assert [r["profile"] for r in rows] == ["a", "b"]
    by = json.loads(cli("stats", "--by", "profile", "--json").stdout)
    assert set(by) == {"a", "b"} and set(by["a"]) >= {"runs", "tokens", "median_tokens_per_cycle", "acceptance",
                                                      "median_decode_tps"}
    cmp = json.loads(cli("stats", "--compare", "a", "--compare", "b", "--json").stdout)
    assert dict((r[0], r[3]) for r in cmp["rows"])["median_tokens_per_cycle"] == 1.5
    assert len(cli("stats", "--export", "jsonl").stdout.decode().splitlines()) == 2
    assert cli("stats", "--profile", "zzz").returncode == 2
    r = cli("stats", "--clear")
    assert r.returncode == 2 and "--yes" in r.stderr.decode()
    assert cli("stats", "--clear", "--yes").returncode == 0
    assert "no matching runs" in cli("stats").stderr.decode()


def test_stats_file_renders_stats_json(cli, tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(fake(0)["stats"]))
    out = cli("stats", "--file", f).stdout.decode()
    assert "accept_length_hist: 0:5 2:5" in out and "tokens_per_cycle: 2.000" in out
    assert cli("stats", "--file", tmp_path / "nope.json").returncode == 2


def test_generate_logs_and_survives_an_unwritable_log_dir(cli, tiny_paths, tmp_path):
    r = cli("generate", "--model", tiny_paths["target"], "--max-tokens", 5, "-q", input=b"abc")
    assert r.returncode == 0
    assert len(runlog.query()) == 1
    blocked = tmp_path / "ro"
    blocked.write_text("a file where the data directory should be")
    r = cli("generate", "--model", tiny_paths["target"], "--max-tokens", 5, "-q", input=b"abc",
            env={"XDG_DATA_HOME": str(blocked)})
    assert r.returncode == 0 and len(r.stdout) > 0
    assert r.stderr.decode().count("run not logged") == 1
