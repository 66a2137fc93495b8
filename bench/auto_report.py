"""Tables of bench/auto_policy.py's JSON: per class and temperature, tok/s of every arm, auto's ratio to plain
decoding and to the best other arm; then over all classes, every arm's tokens over its time, and the geometric
mean of auto's per-class ratio to each arm.

    python bench/auto_report.py docs/perf/cpu/auto-policy.json [ROUND2.json ...] > table.md
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict

import jsonfile


def pool(runs: list[dict]) -> list[dict]:
    """One record per (temperature, class, arm): steady tokens and seconds summed over rounds, cycles by source
    summed."""
    out: dict[tuple, dict] = {}
    for r in runs:
        key = (r["temp"], r["class"], r["arm"])
        if key not in out:
            out[key] = {**r, "sources": {k: dict(v) for k, v in r["sources"].items()}}
            continue
        o = out[key]
        o["steady_tokens"] += r["steady_tokens"]
        o["steady_s"] += r["steady_s"]
        for k, v in r["sources"].items():
            o["sources"].setdefault(k, {"cycles": 0})["cycles"] = o["sources"].get(k, {}).get("cycles", 0) + v["cycles"]
    for o in out.values():
        o["tok_s"] = o["steady_tokens"] / o["steady_s"] if o["steady_s"] > 0 else 0.0
    return list(out.values())


def main() -> None:
    files = [jsonfile.load(f) for f in sys.argv[1:]]  # several rounds: each arm's tokens over its time, pooled
    same = {(d["config"]["target"], d["config"]["draft"], d["config"]["max_tokens"]) for d in files}
    assert len(same) == 1, f"rounds of different runs: {same}"
    arms = files[0]["config"]["arms"]
    runs = pool([r for d in files for r in d["runs"]])
    by = defaultdict(dict)
    for r in runs:
        by[(r["temp"], r["class"])][r["arm"]] = r
    print("| T | class | " + " | ".join(arms) + " | auto / plain | auto / best other | auto's mix (cycles) |")
    print("|---|---|" + "---|" * (len(arms) + 3))
    worst_plain, worst_best = 9.0, 9.0
    for (temp, cls), row in sorted(by.items()):
        if set(row) != set(arms):
            continue
        tps = {a: row[a]["tok_s"] for a in arms}
        best_other = max((a for a in arms if a != "auto"), key=lambda a: tps[a])
        rp, rb = tps["auto"] / tps["plain"], tps["auto"] / tps[best_other]
        worst_plain, worst_best = min(worst_plain, rp), min(worst_best, rb)
        mix = " ".join(f"{k} {v['cycles']}" for k, v in sorted(row["auto"]["sources"].items()))
        cells = " | ".join(f"{tps[a]:.2f}" for a in arms)
        print(f"| {temp:g} | {cls} | {cells} | {rp:.2f}x | {rb:.2f}x ({best_other}) | {mix} |")
    print()
    print(f"Worst class: auto / plain {worst_plain:.2f}x, auto / best other arm {worst_best:.2f}x.")
    print()
    for temps, label in (((0.0,), "T=0"), ((1.0,), "T=1"), ((0.0, 1.0), "both temperatures")):
        for held in (False, True, None):
            pick = [r for r in runs if r["temp"] in temps and
                    (held is None or r["class"].startswith("held-out") == held)]
            if not pick:
                continue
            tot = {a: sum(r["steady_tokens"] for r in pick if r["arm"] == a) /
                   max(sum(r["steady_s"] for r in pick if r["arm"] == a), 1e-9) for a in arms}
            fixed = max((a for a in arms if a != "auto"), key=lambda a: tot[a])
            which = {False: "shipped classes", True: "held-out prompts", None: "all prompts"}[held]
            tps = {(r["temp"], r["class"], r["arm"]): r["tok_s"] for r in pick}
            cells = {(t, c) for t, c, _ in tps if all((t, c, a) in tps and tps[(t, c, a)] > 0 for a in arms)}
            geo = {a: math.exp(sum(math.log(tps[(t, c, "auto")] / tps[(t, c, a)]) for t, c in cells) / max(len(cells), 1))
                   for a in arms if a != "auto"}
            print(f"- {label}, {which}: " + ", ".join(f"{a} {tot[a]:.2f}" for a in arms) +
                  f" tok/s; auto / best single arm ({fixed}) = {tot['auto'] / max(tot[fixed], 1e-9):.2f}x; geometric mean of "
                  f"auto's per-class ratios: " + ", ".join(f"{geo[a]:.2f}x {a}" for a in geo))


if __name__ == "__main__":
    main()
