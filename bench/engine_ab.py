"""The one-engine change, before against after, in ONE process on the same loaded models: the previous engine is
imported as `mtpcli_old` (a copy of the previous commit's src/mtpcli under that name, on PYTHONPATH), and every
repetition runs each arm on the old and the new engine, alternating, so drift hits both alike. Decode tok/s is the
tokens after the first cycle over the time after it (as `mtpcli bench` measures it); ratios new/old per arm.

  git worktree add /tmp/old <previous commit>; mkdir /tmp/oldpkg; cp -r /tmp/old/src/mtpcli /tmp/oldpkg/mtpcli_old
  PYTHONPATH=/tmp/oldpkg python bench/engine_ab.py --model M --draft-model D --prompts P --max-tokens 64 --reps 5 \
      [--rows 4] [--no-chat] --out result.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mtpcli_old.drafters.model as old_model
import mtpcli_old.drafters.ngram as old_ngram
import mtpcli_old.engine as old_engine
from mtpcli import models, prompts
from mtpcli.controller import FixedWidth
from mtpcli.drafters import NoDraft
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.generate import encode_prompt
from mtpcli.sampling import SamplingParams


class Unchained(NoDraft):
    """Arm "plain-sync": plain steps, each read back before the next is launched (a drafter that "speculates"
    with width 0 turns the engine's overlap of plain steps off), to see what the overlap is worth here."""

    speculates = True


def steady(events) -> tuple[int, float]:
    """Tokens after the first event, and the seconds they took."""
    n, t0 = 0, None
    for ev in events:
        if t0 is None:
            t0 = time.perf_counter()
            continue
        n += len(ev.tokens)
    return n, time.perf_counter() - t0


def run(tree: str, arm: str, target, draft, ids: list[list[int]], cfg: DecodeConfig, eos) -> tuple[int, float]:
    width = 0 if arm.startswith("plain") else 4
    if tree == "new":
        drafter = {"plain": None, "model": lambda: ModelDrafter(draft.model), "ngram": lambda: NgramDrafter(),
                   "plain-sync": Unchained}[arm]
        eng = Engine(target.model, drafter and drafter(), FixedWidth(width, batch=len(ids)), eos, cfg,
                     batch_size=len(ids))
        return steady(eng.generate([Request(i, x, cfg.max_tokens, cfg.seed + i) for i, x in enumerate(ids)]))
    if len(ids) == 1:
        drafter = {"plain": None, "plain-sync": None, "model": lambda: old_model.ModelDrafter(draft.model),
                   "ngram": lambda: old_ngram.NgramDrafter()}[arm]
        eng = old_engine.Engine(target.model, drafter and drafter(), FixedWidth(width), eos,
                                old_engine.DecodeConfig(**vars(cfg)))
        return steady(eng.generate(ids[0]))
    import mtpcli_old.batch_engine as old_batch

    drafter = {"plain": None, "model": lambda: old_model.ModelBatchDrafter(draft.model),
               "ngram": lambda: old_ngram.NgramBatch()}[arm]
    eng = old_batch.BatchEngine(target.model, drafter and drafter(), FixedWidth(width, batch=len(ids)), eos,
                                old_engine.DecodeConfig(**vars(cfg)), len(ids))
    return steady(eng.generate([old_batch.Request(i, x, cfg.max_tokens, cfg.seed + i) for i, x in enumerate(ids)]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", required=True)
    ap.add_argument("--prompts")
    ap.add_argument("--arms", default="model,ngram,plain")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1, help="prompts decoded together (1: one prompt at a time)")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--no-chat", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    target, draft = models.load(a.model), models.load(a.draft_model)
    items = prompts.bench_set(a.prompts)
    enc = [encode_prompt(target.tokenizer, it.text, False if a.no_chat else None, None) for it in items]
    groups = [enc[i : i + a.rows] for i in range(0, len(enc), a.rows)]
    cfg = DecodeConfig(sampling=SamplingParams(temp=a.temp), max_tokens=a.max_tokens)
    eos = target.tokenizer.eos_token_ids
    totals = {(tree, arm): [] for arm in a.arms.split(",") for tree in ("old", "new")}
    warm = DecodeConfig(sampling=cfg.sampling, max_tokens=8)
    for rep in range(a.reps + 1):  # repetition 0 warms up (8 tokens a run)
        for arm in a.arms.split(","):
            for tree in (("old", "new") if rep % 2 else ("new", "old")):
                n = t = 0
                for g in groups:
                    dn, dt = run(tree, arm, target, draft, g, cfg if rep else warm, eos)
                    n, t = n + dn, t + dt
                if rep:
                    totals[(tree, arm)].append(n / t)
                    print(f"rep {rep} {arm:6s} {tree}: {n / t:8.2f} tok/s", flush=True)
    rows = []
    print(f"{'arm':<8} {'old tok/s median':>17} {'new tok/s median':>17} {'new/old':>8}")
    for arm in a.arms.split(","):
        old, new = statistics.median(totals[("old", arm)]), statistics.median(totals[("new", arm)])
        ratios = [n / o for o, n in zip(totals[("old", arm)], totals[("new", arm)])]
        rows.append({"arm": arm, "old": totals[("old", arm)], "new": totals[("new", arm)],
                     "ratio_of_medians": new / old, "median_paired_ratio": statistics.median(ratios)})
        print(f"{arm:<8} {old:17.2f} {new:17.2f} {new / old:8.3f}   (paired ratios {' '.join(f'{r:.3f}' for r in ratios)})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"argv": vars(a), "arms": rows}, f, indent=1)


if __name__ == "__main__":
    main()
