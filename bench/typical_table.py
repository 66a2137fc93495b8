"""Issue 57's table from `mtpcli bench --task ... --out FILE` results: one row per arm and temperature, the runs of
every file pooled (a task split into ranges over several processes, e.g. bench/gpu_typical.sh).

    python bench/typical_table.py docs/perf/gpu/typical/t1-*.json docs/perf/gpu/typical/t0-*.json [--md]

Per arm: pass@1 with its Wilson 95% interval, decode tok/s (committed tokens over decode seconds, pooled over the
runs) and tokens per cycle (pooled), the paired comparison with the first arm (tasks that flipped each way, exact
McNemar) and, at T = 0, whether the arms' texts are byte-identical.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from jsonfile import load
from mtpcli.tasks import mcnemar, wilson


def pooled(paths: list[str]) -> dict[float, dict[str, list[dict]]]:
    """{temp: {arm: outputs}} over the files; a file's temperature is its first arm's (bench flags set it for all)."""
    runs: dict[float, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        result = load(path)  # (plain or gzipped)
        temp = result["config"]["flags"].get("temp")
        for arm, outs in result["outputs"].items():
            runs[temp][arm] += [o for o in outs if "passed" in o]
    return runs


def rows(arms: dict[str, list[dict]]) -> list[list[str]]:
    first = next(iter(arms))
    ref = {(o["prompt"], o["seed"]): o for o in arms[first]}
    out = []
    for arm, outs in arms.items():
        k, n = sum(o["passed"] for o in outs), len(outs)
        lo, hi = wilson(k, n)
        tokens = sum(len(o["tokens"]) for o in outs)
        seconds = sum(len(o["tokens"]) / o["stats"]["decode_tps"] for o in outs if o["stats"]["decode_tps"])
        cycles = sum(len(o["tokens"]) / o["stats"]["tokens_per_cycle"] for o in outs if o["stats"]["tokens_per_cycle"])
        pairs = [(ref[key]["passed"], o["passed"], ref[key]["text"] == o["text"]) for o in outs
                 if (key := (o["prompt"], o["seed"])) in ref]
        gained, lost = sum(b and not a for a, b, _ in pairs), sum(a and not b for a, b, _ in pairs)
        vs = "-" if arm == first else f"+{gained} -{lost}, p={mcnemar(gained, lost):.3g}"
        same = "-" if arm == first else f"{sum(s for *_, s in pairs)}/{len(pairs)}"
        out.append([arm, f"{k / n:.3f} [{lo:.3f}-{hi:.3f}]", f"{k}/{n}", f"{tokens / seconds:.2f}" if seconds else "-",
                    f"{tokens / cycles:.2f}" if cycles else "-", vs, same])
    return out


def main(argv: list[str]) -> None:
    md = "--md" in argv
    head = ["arm", "pass@1 [Wilson 95%]", "passed", "decode tok/s", "tokens/cycle", "vs first: flips, McNemar p",
            "same text"]
    for temp, arms in sorted(pooled([a for a in argv if a != "--md"]).items(), reverse=True):
        print(f"\nT = {temp}, {len({o['prompt'] for o in next(iter(arms.values()))})} problems")
        if md:
            print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows(arms):
            print("| " + " | ".join(r) + " |" if md else "  ".join(r))


if __name__ == "__main__":
    main(sys.argv[1:])
