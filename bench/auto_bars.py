"""How many draws decide issue 14's per-class bars at T > 0: from bench/auto_policy.py rounds, each arm's spread
per class across draws (rounds at the same seed draw the same texts at T > 0: their timings are averaged into one
draw), then the chance that a policy passes "auto >= 0.97x the best of the other arms on every class" when each
arm is measured over n draws. The bar compares auto to the largest of four noisy figures (the winner's curse): a
policy exactly as fast as the best arm of a class passes that class a little more than half the time against one
arm alone, less where several arms are close.

    python bench/auto_bars.py docs/perf/cpu/auto-policy.json docs/perf/cpu/auto-policy-r2.json \
        docs/perf/cpu/auto-policy-t1-s1.json ... [--temp 1] [--draws 1 4 10 20 50 100]

Three policies: one exactly as fast as the best other arm of every class (in truth), one 5% faster than it on every
class, and auto as measured. The truths: each (class, arm)'s mean over the draws, or, for "auto as measured", drawn
around it afresh in every trial with its standard error (what the draws so far leave open, so the measured best
other arm's upward bias is not taken for the truth). A figure of n draws is drawn around its truth with the arm's
spread of one draw / sqrt(n): the spread of log tok/s, pooled over classes by degrees of freedom, per arm (plain
steps vary little with the text; speculative arms vary with it). The draws of different arms are taken as
independent; interleaved arms share the machine's slow and fast spells, so this errs on the pessimistic side.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections import defaultdict


def draws(files: list[str], temp: float) -> dict[tuple[str, str], list[float]]:
    """(class, arm) -> log tok/s per draw (the rounds of one seed averaged: the same texts timed again; a round
    that records no seed ran seed 0)."""
    by_seed: dict[int, dict[tuple[str, str], list[float]]] = defaultdict(lambda: defaultdict(list))
    for f in files:
        d = json.load(open(f))
        seed = d["config"].get("seed") or 0
        for r in d["runs"]:
            if r["temp"] == temp:
                by_seed[seed][(r["class"], r["arm"])].append(r["tok_s"])
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for seed in sorted(by_seed):
        for key, xs in by_seed[seed].items():
            out[key].append(math.log(sum(xs) / len(xs)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds", nargs="+")
    ap.add_argument("--temp", type=float, default=1.0)
    ap.add_argument("--draws", type=int, nargs="*", default=[1, 4, 10, 20, 50, 100])
    ap.add_argument("--trials", type=int, default=4000)
    args = ap.parse_args()
    logs = draws(args.rounds, args.temp)
    classes = sorted({c for c, _ in logs})
    arms = sorted({a for _, a in logs}, key=lambda a: (a != "auto", a))
    others = [a for a in arms if a != "auto"]
    missing = [f"{c}/{a}" for c in classes for a in arms if len(logs.get((c, a), [])) < 2]
    if "auto" not in arms or not others or missing:
        short = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        sys.exit(f"auto_bars: every class needs auto and other arms, each at two draws or more at T = {args.temp:g} "
                 f"(rounds at other seeds); short: {short or 'the arms'}")
    counts = sorted({len(v) for v in logs.values()})
    mean = {k: statistics.mean(v) for k, v in logs.items()}
    var = {k: statistics.variance(v) for k, v in logs.items()}
    spread = {a: math.sqrt(sum((len(logs[c, a]) - 1) * var[c, a] for c in classes) /
                           sum(len(logs[c, a]) - 1 for c in classes)) for a in arms}
    print(f"T = {args.temp:g}: {len(classes)} classes, {counts[0]}" + (f"-{counts[-1]}" if len(counts) > 1 else "") +
          " draws each. The spread of one draw (sd of log tok/s, pooled over classes): " +
          ", ".join(f"{a} {spread[a]:.3f}" for a in arms) + "\n")
    print("| class | " + " | ".join(arms) + " |")
    print("|---|" + "---|" * len(arms))
    for c in classes:
        cells = (f"{math.exp(mean[c, a]):.2f} ± {math.sqrt(var[c, a]):.2f}" for a in arms)
        print(f"| {c} | " + " | ".join(cells) + " |")
    rng = random.Random(0)

    def trial(truth: dict[tuple[str, str], float], n: int) -> list[bool]:
        got = {k: t + rng.gauss(0, spread[k[1]] / math.sqrt(n)) for k, t in truth.items()}
        return [got[c, "auto"] >= math.log(0.97) + max(got[c, a] for a in others) for c in classes]

    def fixed(edge: float) -> dict[tuple[str, str], float]:
        truth = {k: v for k, v in mean.items() if k[1] != "auto"}
        return {**truth, **{(c, "auto"): max(mean[c, a] for a in others) + math.log(edge) for c in classes}}

    policies = {"as fast as the best other arm": lambda: fixed(1.0),
                "5% faster than the best other arm": lambda: fixed(1.05),
                "auto as measured": lambda: {k: m + rng.gauss(0, math.sqrt(var[k] / len(logs[k])))
                                             for k, m in mean.items()}}
    print("\n| draws per class | policy | P(every class passes) | classes passing (mean) |")
    print("|---|---|---|---|")
    for n in args.draws:
        for name, truth in policies.items():
            every = passing = 0
            for _ in range(args.trials):
                ok = trial(truth(), n)
                every += all(ok)
                passing += sum(ok)
            print(f"| {n} | {name} | {every / args.trials:.3f} | {passing / args.trials:.1f} of {len(classes)} |")


if __name__ == "__main__":
    main()
