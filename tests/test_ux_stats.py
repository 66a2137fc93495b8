"""`mtpcli stats` (issue 32): no flag ignored, comparisons within one model, one decode tok/s, run ids, plots."""

import json

import pytest

from mtpcli import plot, report, runlog


def fake(i, profile="exact", model="m", tpc=2.0, tps=100.0, **stats):
    st = {"prompt_tokens": 5, "generated_tokens": int(tpc * 10), "cycles": 10, "drafted": 10, "accepted": 5,
          "acceptance_rate": 0.5, "tokens_per_cycle": tpc, "accept_by_position": [0.5, 0.5],
          "accept_length_hist": {"0": 5, "2": 5}, "draft_width_hist": {"2": 10}, "prefill_tps": 50.0,
          "decode_tps": tps, "ttft_s": 0.1, "peak_memory_bytes": 1000, **stats}
    return dict(command=["generate"], settings={"law": "exact"}, profile=profile, model=model, draft="d",
                prompt=[1, 2, 3], stats=st, status=0, started=1000.0 + i)


def _one_error_line(r, *flags):
    err = r.stderr.decode().strip()
    assert r.returncode == 2 and r.stdout == b"", (r.returncode, r.stdout, err)
    assert len(err.splitlines()) == 1 and err.startswith("mtpcli: error: "), err
    for f in flags:
        assert f in err, (f, err)


@pytest.mark.parametrize("view", [("--last", "5"), ("--by", "source"), ("--by", "profile"),
                                  ("--compare", "a", "--compare", "b")])
def test_plot_with_a_several_run_view_is_refused_naming_both_flags(cli, tmp_path, view):
    for r in (fake(0, "a"), fake(1, "b")):
        runlog.append_safely(**r)
    r = cli("stats", *view, "--plot", tmp_path / "x.png")
    _one_error_line(r, view[0], "--plot")
    assert not (tmp_path / "x.png").exists()


def test_by_with_last_groups_the_last_runs_only(cli):
    for i, p in enumerate(["a", "a", "a", "b", "b"]):
        runlog.append_safely(**fake(i, p))
    r = cli("stats", "--last", 2, "--by", "profile", "--json")
    assert r.returncode == 0, r.stderr
    by = json.loads(r.stdout)
    assert set(by) == {"b"} and by["b"]["runs"] == 2


def test_compare_refuses_runs_of_several_models_unless_model_picks_one(cli):
    for r in (fake(0, "a", "smol", tps=50), fake(1, "a", "tiny", tps=900), fake(2, "b", "smol", tps=100)):
        runlog.append_safely(**r)
    _one_error_line(cli("stats", "--compare", "a", "--compare", "b"), "--compare", "--model", "smol", "tiny")
    r = cli("stats", "--compare", "a", "--compare", "b", "--model", "smol", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row[0]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["model"][1:3] == ["smol", "smol"]
    assert rows["median_decode_tps"][1:] == [50, 100, 2.0]  # the tiny model's run is not pooled in


def test_run_id_picks_the_run_for_the_full_view(cli):
    for r in (fake(0, "a", tpc=2.0), fake(1, "b", tpc=3.0)):
        runlog.append_safely(**r)
    listed = json.loads(cli("stats", "--last", 5, "--json").stdout)
    first = listed[0]["id"]
    r = cli("stats", "--run", first, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens_per_cycle"] == 2.0  # not the last run's 3.0
    assert "tokens_per_cycle: 2.000" in cli("stats", "--run", first).stdout.decode()
    _one_error_line(cli("stats", "--run", 99), "--run 99")
    _one_error_line(cli("stats", "--run", first, "--last", 3), "--run", "--last")


@pytest.mark.parametrize("args,flags", [(("--yes",), ("--yes", "--clear")),
                                        (("--clear", "--yes", "--last", "2"), ("--clear", "--last")),
                                        (("--file", "s.json", "--last", "2"), ("--file", "--last")),
                                        (("--export", "jsonl", "--by", "profile"), ("--export", "--by"))])
def test_other_ignored_combinations_are_refused(cli, args, flags):
    runlog.append_safely(**fake(0))
    _one_error_line(cli("stats", *args), *flags)
    assert len(runlog.query()) == 1  # --clear refused: nothing deleted


def test_bench_and_stats_give_an_arm_the_same_decode_tps(tiny_paths, tmp_path):
    from mtpcli import bench

    (tmp_path / "p.txt").write_text("def fib(n):")
    result = bench.bench(model=str(tiny_paths["target"]), draft_model=str(tiny_paths["draft"]), draft=None,
                         profile_names=["exact"], seeds=1, prompt_source=str(tmp_path / "p.txt"), max_tokens=12,
                         prompt_tokens=None, baselines=["ar", "mlx-lm"], flags={"temp": 0.0, "chat": False},
                         argv=["bench"], log=True)
    logged = {r["profile"]: r["stats"] for r in runlog.query()}
    for arm in result["arms"]:  # one seed, one prompt: the arm's median is its one run, the record stats shows
        st = logged[arm["arm"]]
        assert arm["decode_tps"]["median"] == pytest.approx(st["decode_tps"])


# ---- what the charts draw --------------------------------------------------------------------

def _mixed():
    """4 plain steps, 6 drafting cycles of width 3 (accepting 0, 1, 3, 3, 3, 3); position 4 never drafted by ngram."""
    return {"generated_tokens": 23, "cycles": 10, "drafted": 18, "accepted": 13, "acceptance_rate": 13 / 18,
            "tokens_per_cycle": 2.3, "decode_tps": 191.4, "accept_by_position": [5 / 6, 4 / 6, 4 / 6],
            "accept_length_hist": {"0": 5, "1": 1, "3": 4}, "draft_width_hist": {"0": 4, "3": 6},
            "sources": {"plain": {"cycles": 4, "drafted": 0, "accepted": 0, "accept_by_position": [],
                                  "reached_by_position": [], "seconds": 0.1},
                        "ngram": {"cycles": 4, "drafted": 12, "accepted": 9, "accept_by_position": [1.0, 0.75, 0.5],
                                  "reached_by_position": [4, 4, 4], "seconds": 0.1},
                        "model": {"cycles": 2, "drafted": 8, "accepted": 4, "accept_by_position": [1.0, 1.0, 0.0, 0.0],
                                  "reached_by_position": [2, 2, 2, 2], "seconds": 0.1}}}


def test_accept_bins_leave_plain_steps_out():
    d = plot.plot_data(_mixed())
    assert d["accept_hist"] == {0: 1, 1: 1, 3: 4}  # bin 0: one rejected draft, not the 4 plain steps with it
    assert d["plain_steps"] == 4 and d["drafting_cycles"] == 6


def test_acceptance_by_position_has_counts_and_marks_never_reached():
    pos = plot.plot_data(_mixed())["positions"]
    assert set(pos) == {"ngram", "model"}
    assert [r["label"] for r in pos["ngram"]] == ["4/4", "3/4", "2/4", "never reached"]
    assert pos["ngram"][3]["rate"] is None  # not drawn as 0.00
    assert [r["label"] for r in pos["model"]] == ["2/2", "2/2", "0/2", "0/2"]
    assert pos["model"][3]["rate"] == 0.0  # reached and rejected: a real 0


def test_headline_figures_belong_on_the_chart():
    h = plot.plot_data(_mixed())["headline"]
    assert "2.30 tokens/cycle" in h and "acceptance 72%" in h and "decode 191.4 tok/s" in h


def test_plain_run_has_no_drafts_to_chart_and_names_no_draft_model():
    st = {"generated_tokens": 5, "cycles": 5, "drafted": 0, "accepted": 0, "acceptance_rate": 0.0,
          "tokens_per_cycle": 1.0, "decode_tps": 40.0, "accept_by_position": [], "accept_length_hist": {"0": 5},
          "draft_width_hist": {"0": 5}, "width_trace": [0] * 5, "source_trace": ["plain"] * 5,
          "sources": {"plain": {"cycles": 5, "drafted": 0, "accepted": 0, "accept_by_position": [],
                                "reached_by_position": [], "seconds": 0.1}}}
    d = plot.plot_data(st)
    assert d["accept_hist"] == {} and d["positions"] == {}
    rec = {"id": 7, "profile": "ar (plain)", "settings": {"model": "smol", "draft_model": "tinydraft", "draft": "none"}}
    title = report.run_title(rec, st, "x")
    assert "smol" in title and "tinydraft" not in title and "draft model" not in title
    rec["settings"]["draft"] = "model"
    assert "draft model tinydraft" in report.run_title(rec, {**st, "drafted": 3}, "x")


def test_plot_image_of_a_run_by_id(cli, tmp_path):
    pytest.importorskip("matplotlib")
    for r in (fake(0, "a"), fake(1, "b")):
        runlog.append_safely(**r)
    r = cli("stats", "--run", 1, "--plot", tmp_path / "x.png")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plain_run_plot_has_whole_number_axes(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    seen = {}
    real = Figure.savefig

    def spy(fig, *a, **kw):
        seen["width_ticks"] = list(fig.axes[1].get_xticks())
        seen["title"] = fig._suptitle.get_text()
        return real(fig, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", spy)
    st = {"generated_tokens": 5, "cycles": 5, "drafted": 0, "accepted": 0, "acceptance_rate": 0.0,
          "tokens_per_cycle": 1.0, "decode_tps": 40.0, "accept_by_position": [], "accept_length_hist": {"0": 5},
          "draft_width_hist": {"0": 5}, "width_trace": [0] * 5, "source_trace": ["plain"] * 5}
    plot.plot(st, str(tmp_path / "p.png"), "plain run")
    assert seen["width_ticks"] == [0]  # not -0.4 .. 0.4
    assert "1.00 tokens/cycle" in seen["title"] and "decode 40.0 tok/s" in seen["title"]
