"""`mtpcli bench` on tiny models: arms, baselines, ratios, JSON, logging."""

import json

import pytest

from mtpcli import bench, prompts, runlog


def test_bench_runs_every_arm_on_the_same_prompts_and_seeds(tiny_paths, tmp_path):
    (tmp_path / "p" / "sub").mkdir(parents=True)
    (tmp_path / "p" / "a.txt").write_text("def fib(n):")
    (tmp_path / "p" / "sub" / "b.txt").write_text("the sea is ")
    result = bench.bench(model=str(tiny_paths["target"]), draft_model=str(tiny_paths["draft"]), draft=None,
                         profile_names=["exact", "typical-0.09"], seeds=2, prompt_source=str(tmp_path / "p"), max_tokens=12,
                         prompt_tokens=None, baselines=["ar", "mlx-lm", "mlx-lm-plain"],
                         flags={"temp": 1.0, "chat": False}, argv=["bench"], log=True)
    arms = [a["arm"] for a in result["arms"]]
    assert arms == ["exact", "typical-0.09", "ar (plain)", "mlx-lm speculative", "mlx-lm plain"]
    base = result["arms"][0]["decode_tps"]["median"]
    for a in result["arms"]:  # every ratio is the arm's median decode speed over the first arm's
        assert a["ratio"] == pytest.approx(a["decode_tps"]["median"] / base)
    assert len({a["ratio"] for a in result["arms"]}) > 1
    assert result["config"]["prompts"] == ["a", "b"]  # found recursively
    for a in result["arms"]:
        assert a["decode_tps"]["min"] <= a["decode_tps"]["median"] <= a["decode_tps"]["max"]
        assert len(result["outputs"][a["arm"]]) == 2 * 2  # seeds x prompts
    assert result["arms"][2]["tokens_per_cycle"]["median"] == 1.0  # plain decoding
    logged = runlog.query()
    assert [r["profile"] for r in logged] == arms
    json.dumps(result)  # serialisable for --json/--out


def test_bench_prompt_sources(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    t = tmp_path / "one.txt"
    t.write_text("c")
    assert [x.text for x in prompts.bench_set(f"{f},{t}")] == ["a", "b", "c"]
    shipped = prompts.bench_set(None)  # without --prompts: the content classes shipped with the package
    assert len(shipped) >= 7 and {"tool_calls", "rename", "history"} <= {x.name for x in shipped}
    assert bench.fit_length([1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1]


def test_bench_progress_is_numbered_with_the_total_and_the_time_left(tiny_paths, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.txt").write_text("abcabc")
    (tmp_path / "p" / "b.txt").write_text("the sea is ")
    lines = []
    bench.bench(model=str(tiny_paths["target"]), draft_model=None, draft="ngram", profile_names=["exact"], seeds=2,
                prompt_source=str(tmp_path / "p"), max_tokens=4, prompt_tokens=None, baselines=["ar"],
                flags={"chat": False}, argv=["bench"], log=False, progress=lines.append)
    assert [line.split(",")[0] for line in lines] == [f"[{i}/8" for i in range(1, 9)]  # 2 seeds x 2 prompts x 2 arms
    assert lines[-1].startswith("[8/8, 0m00s left]") and all(" left] " in line for line in lines)
