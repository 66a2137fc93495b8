"""Choose the n-gram drafter's defaults by measurement, without re-running the model.

At temperature 0 the output is the target's greedy continuation whatever the drafter, so the n-gram drafter's
acceptance can be replayed exactly from greedy outputs: every cycle it proposes from the committed context,
the longest prefix that matches the true continuation is accepted, and the next true token is committed.
Reads the greedy outputs of `mtpcli bench --out` JSON files (any arm at temp 0), re-encodes their prompts with the
target's tokenizer, and reports tokens per cycle and drafted tokens per cycle for each (ngram_min, ngram_max) and
width, per prompt and in all.

  python bench/ngram_sweep.py --model qwen2.5-coder-1.5b --prompts src/mtpcli/bench_prompts docs/perf/cpu/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mtpcli import prompts
from mtpcli.bench import fit_length
from mtpcli.generate import encode_prompt
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.sampling import SamplingParams

SETTINGS = [(1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (2, 5), (3, 4), (3, 6)]
WIDTHS = [2, 4, 6, 8]


def replay(prompt: list[int], out: list[int], n_min: int, n_max: int, width: int) -> tuple[int, int]:
    """(cycles, drafted) to commit `out` after `prompt` with the n-gram drafter at this width."""
    d = NgramDrafter(n_min, n_max)
    d.begin(prompt)
    ctx, pos, cycles, drafted = list(prompt), 0, 0, 0
    while pos < len(out):
        prop = d.propose(ctx, min(width, len(out) - pos - 1), SamplingParams(), None).tokens.tolist()
        acc = 0
        while acc < len(prop) and prop[acc] == out[pos + acc]:
            acc += 1
        new = out[pos : pos + acc + 1]
        ctx += new
        pos += len(new)
        cycles += 1
        drafted += len(prop)
    return cycles, drafted


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the target (for its tokenizer)")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out")
    ap.add_argument("results", nargs="+", help="mtpcli bench --out JSON files with temp 0 outputs")
    a = ap.parse_args()
    from mlx_lm.utils import load_tokenizer

    from mtpcli import models

    tok = load_tokenizer(Path(models.resolve(a.model)))
    texts = {it.name: it.text for it in prompts.bench_set(a.prompts)}
    cases = {}
    for f in a.results:
        r = json.load(open(f))
        cfg = r["config"]
        if cfg["flags"].get("temp") not in (0, 0.0):
            continue
        for outputs in r["outputs"].values():
            for o in outputs:
                if o["prompt"] in texts and o["prompt"] not in cases:
                    ids = encode_prompt(tok, texts[o["prompt"]], cfg["flags"].get("chat"), None)
                    cases[o["prompt"]] = (fit_length(ids, cfg.get("prompt_tokens")), o["tokens"])
    res = {"prompts": sorted(cases), "rows": []}
    print(f"{len(cases)} greedy outputs: {', '.join(sorted(cases))}")
    print("n_min n_max width | tokens/cycle in all | drafted/cycle | per prompt tokens/cycle")
    for n_min, n_max in SETTINGS:
        for w in WIDTHS:
            per = {name: replay(p, o, n_min, n_max, w) for name, (p, o) in sorted(cases.items())}
            toks = sum(len(cases[n][1]) for n in per)
            cycles = sum(c for c, _ in per.values())
            drafted = sum(d for _, d in per.values())
            row = {"n_min": n_min, "n_max": n_max, "width": w, "tokens_per_cycle": toks / cycles,
                   "drafted_per_cycle": drafted / cycles,
                   "per_prompt": {n: len(cases[n][1]) / c for n, (c, _) in per.items()}}
            res["rows"].append(row)
            print(f"{n_min:5d} {n_max:5d} {w:5d} | {row['tokens_per_cycle']:19.2f} | {row['drafted_per_cycle']:13.2f} | "
                  + " ".join(f"{v:.2f}" for v in row["per_prompt"].values()))
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
