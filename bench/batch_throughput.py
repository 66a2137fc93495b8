"""Batched decoding: throughput and per-row speed for 1, 4, 16 prompts, speculative against plain.

Arms, each run through the batched engine on the same prompts (greedy, so every arm emits the same tokens):
plain (no draft), the draft model at fixed width 4, and the draft model with the adaptive EMA width (one
shared width per cycle). Reports total decode tokens/s (all rows, prefill excluded), the mean per-row decode
tok/s, tokens per cycle per row and acceptance, so a collapse of acceptance with the batch would show.

  python bench/batch_throughput.py --model M --draft-model D --prompts src/mtpcli/bench_prompts --sizes 1,4,16 \
      --max-tokens 32 --prompt-tokens 64 --out result.json
"""

from __future__ import annotations

import argparse
import json
import time

from mtpcli import models, prompts
from mtpcli.bench import fit_length
from mtpcli.controller import EmaController, FixedWidth
from mtpcli.drafters.model import ModelDrafter
from mtpcli.engine import DecodeConfig, Engine, Request


def run(target, draft, arm: str, reqs: list[Request], size: int) -> dict:
    if arm == "plain":
        drafter, ctl = None, FixedWidth(0)
    else:
        drafter = ModelDrafter(draft.model)
        ctl = FixedWidth(4) if arm == "fixed-4" else EmaController(1, 6)
    eng = Engine(target.model, drafter, ctl, target.tokenizer.eos_token_ids, DecodeConfig(), size)
    tokens = {r.index: [] for r in reqs}
    for ev in eng.generate(reqs):
        tokens[ev.request].extend(ev.tokens)
    runs = list(eng.runs.values())
    prefill = sum(r.prefill_s for r in runs)
    decode_wall = eng.wall_s - prefill
    total = sum(r.generated_tokens for r in runs)
    drafted, accepted, cycles = (sum(getattr(r, a) for r in runs) for a in ("drafted", "accepted", "cycles"))
    return {"arm": arm, "rows": size, "tokens": total, "wall_s": eng.wall_s, "prefill_s": prefill,
            "decode_wall_s": decode_wall, "throughput_tok_s": total / decode_wall, "batch_cycles": eng.cycles,
            "per_row_tok_s": sum(r.generated_tokens / r.decode_s for r in runs) / len(runs),
            "tokens_per_cycle_per_row": total / cycles, "acceptance": accepted / drafted if drafted else None,
            "outputs": [tokens[r.index] for r in reqs]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--arms", default="plain,fixed-4,adaptive")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    target, draft = models.load(a.model), models.load(a.draft_model)
    texts = [it.text for it in prompts.bench_set(a.prompts)]
    res = {"argv": vars(a), "runs": []}
    for size in [int(x) for x in a.sizes.split(",")]:
        reqs = [Request(i, fit_length(list(target.tokenizer.encode(texts[i % len(texts)])), a.prompt_tokens),
                        a.max_tokens, i) for i in range(size)]
        for arm in a.arms.split(","):
            t = time.perf_counter()
            r = run(target, draft, arm, reqs, size)
            res["runs"].append(r)
            print(f"rows={size:3d} {arm:9s} total {r['throughput_tok_s']:7.2f} tok/s  per-row {r['per_row_tok_s']:6.2f} "
                  f"tok/s  tokens/cycle/row {r['tokens_per_cycle_per_row']:.2f}  acceptance "
                  f"{r['acceptance'] if r['acceptance'] is None else round(r['acceptance'], 3)}  "
                  f"({time.perf_counter() - t:.0f} s)", flush=True)
        outs = [r["outputs"] for r in res["runs"] if r["rows"] == size]
        print(f"rows={size}: every arm emitted the same tokens: {all(o == outs[0] for o in outs)}", flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
