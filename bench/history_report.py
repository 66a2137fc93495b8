"""Tables of bench/history_agent.py's JSON, in markdown: pass 1 against pass 2 per template, then pass 2's history
against every other arm run on the same prompts (n-gram lookup, fixed chains, plain decoding), then the control set,
then draft = auto over each arm in geometric mean of per-prompt ratios.
tok/s is the sum of tokens after the first over the sum of their seconds (prompts weigh by their length).

    python bench/history_report.py docs/perf/cpu/history-agent.json.gz
"""

from __future__ import annotations

import math
import statistics
import sys

import jsonfile


def rate(runs) -> float:
    t = sum(r["steady_s"] for r in runs)
    return sum(r["steady_tokens"] for r in runs) / t if t else 0.0


def tpc(runs) -> float:
    return statistics.mean(r["tokens_per_cycle"] for r in runs) if runs else 0.0


def main(path: str) -> None:
    data = jsonfile.load(path)
    runs = data["runs"]
    pick = lambda phase, arm, tmpl=None, names=None: [  # noqa: E731
        r for r in runs if r["phase"] == phase and r["arm"] == arm and (tmpl is None or r["template"] == tmpl)
        and (names is None or r["prompt"] in names)]
    templates = list(dict.fromkeys(r["template"] for r in runs if r["phase"] == "pass1"))
    print("| template | prompts | pass 1 tok/s | pass 2 tok/s | pass 2 / pass 1 | tokens/cycle pass 1 | pass 2 |")
    print("|---|---|---|---|---|---|---|")
    for t in templates + ["all"]:
        a, b = pick("pass1", "history", None if t == "all" else t), pick("pass2", "history", None if t == "all" else t)
        if not a or not b:
            continue
        print(f"| {t} | {len(a)} | {rate(a):.2f} | {rate(b):.2f} | {rate(b) / rate(a):.2f}x | {tpc(a):.2f} | {tpc(b):.2f} |")
    print()
    arms = ["history"] + sorted({r["arm"] for r in runs if r["phase"] != "pass1"} - {"history"})
    others = [a for a in arms if a != "history"]
    print("| pass 2, same prompts | prompts | " + " | ".join(f"{a} tok/s" for a in arms)
          + "".join(f" | history / {a}" for a in others) + " | tokens/cycle " + " / ".join(arms) + " |")
    print("|---|---|" + "---|" * (len(arms) + len(others) + 1))
    for t in templates + ["all", "control"]:
        phase = "control" if t == "control" else "pass2"
        names = {r["prompt"] for r in runs if r["phase"] == phase and r["arm"] == others[-1]
                 and (t in ("all", "control") or r["template"] == t)}
        got = {a: pick(phase, a, names=names) for a in arms}
        if not all(got.values()):
            continue
        v = {a: rate(got[a]) for a in arms}
        print(f"| {t} | {len(names)} | " + " | ".join(f"{v[a]:.2f}" for a in arms)
              + "".join(f" | {v['history'] / v[a]:.2f}x" for a in others) + " | "
              + " / ".join(f"{tpc(got[a]):.2f}" for a in arms) + " |")
    control = [r for r in runs if r["phase"] == "control"]
    if control:
        print("\n| control prompt | round | " + " | ".join(f"{a} tok/s" for a in arms)
              + "".join(f" | history / {a}" for a in others) + " | history arm: cycles by source |")
        print("|---|---|" + "---|" * (len(arms) + len(others) + 1))
        keys = list(dict.fromkeys((r["prompt"], r.get("round", 0)) for r in control))
        for prompt, rnd in sorted(keys, key=lambda k: (k[1], keys.index(k))):
            got = {r["arm"]: r for r in control if r["prompt"] == prompt and r.get("round", 0) == rnd}
            if not all(a in got for a in arms):
                continue
            mix = ", ".join(f"{k} {v['cycles']}" + (f" ({v['accepted']}/{v['drafted']} accepted)" if v["drafted"] else "")
                            for k, v in got["history"]["sources"].items())
            print(f"| {prompt} | {rnd + 1} | " + " | ".join(f"{got[a]['tok_s']:.2f}" for a in arms)
                  + "".join(f" | {got['history']['tok_s'] / got[a]['tok_s']:.2f}x" for a in others) + f" | {mix} |")
        for arm in arms:
            drafted = sum(v["drafted"] for r in control if r["arm"] == arm for v in r["sources"].values())
            accepted = sum(v["accepted"] for r in control if r["arm"] == arm for v in r["sources"].values())
            cycles = sum(v["cycles"] for r in control if r["arm"] == arm for k, v in r["sources"].items() if k != "plain")
            print(f"\ncontrol, {arm}: {cycles} drafting cycles, {drafted} tokens drafted, {accepted} accepted", end="")
        print()
    print("\n| history (draft = auto) over | pass 2 | control | both |\n|---|---|---|---|")
    for arm in others:  # geometric means of per-prompt ratios: every prompt weighs the same
        logs = {phase: [math.log(h["tok_s"] / o["tok_s"]) for h in runs if h["phase"] == phase and h["arm"] == "history"
                        for o in runs if o["phase"] == phase and o["arm"] == arm and o["prompt"] == h["prompt"]
                        and o.get("round", 0) == h.get("round", 0)] for phase in ("pass2", "control")}
        geo = lambda v: f"{math.exp(sum(v) / len(v)):.3f}x ({len(v)})" if v else "-"  # noqa: E731
        print(f"| {arm} | {geo(logs['pass2'])} | {geo(logs['control'])} | {geo(logs['pass2'] + logs['control'])} |")
    loads = [r["history_load_s"] for r in runs if r.get("history_load_s") is not None]
    if loads:
        print(f"\nReading and indexing the store before each history run: median {statistics.median(loads) * 1000:.0f} ms,"
              f" max {max(loads) * 1000:.0f} ms.")


if __name__ == "__main__":
    main(sys.argv[1])
