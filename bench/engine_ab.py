"""A change to the engine, before against after, in ONE process on the same loaded models: the previous tree's package
is imported as `mtpcli_old` (a copy of its src/mtpcli under that name, on PYTHONPATH) beside this tree's `mtpcli`,
and every repetition runs each arm on both, alternating which goes first, so drift hits both alike. Arms: `plain`
(--draft none), `ngram` (lookup at width 4), `model` (the draft model at width 4), `auto` (the default profile over
lookup and the draft model, both trees deciding with ONE cost table measured at the start, so they make the same
choices). Greedy: both trees emit the same tokens, which is checked. Decode tok/s is the tokens after the first
event over the time after it (as `mtpcli bench` measures it); the ratio is new over old.

  git worktree add /tmp/old <previous commit>; mkdir /tmp/oldpkg; cp -r /tmp/old/src/mtpcli /tmp/oldpkg/mtpcli_old
  PYTHONPATH=/tmp/oldpkg python bench/engine_ab.py --model M --draft-model D --prompts P1,P2 --max-tokens 40 \
      --reps 3 [--arms plain,ngram,auto] --out result.json

The old tree is driven through its own front end: `profiles.resolve`, `generate.settle_draft` and
`generate.build_engine` (the trees before the configuration was typed); this one through `config` and `assemble`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

FLAGS = {"plain": {"draft": "none"}, "ngram": {"draft": "ngram", "num_draft_tokens": 4},
         "model": {"draft": "model", "num_draft_tokens": 4}, "auto": {}}


def new_engine(arm, flags, target, draft, table):
    from mtpcli import assemble, config, models

    cfg = config.settle(config.resolve("exact", {**flags, **FLAGS[arm]}, env={}), models.has_mtp(target))
    eng = assemble.engine(cfg, target, draft if cfg.draft in ("model", "auto") else None)
    if table is not None and arm == "auto":
        from mtpcli.costs import Costs

        eng.policy.use(Costs.from_dict(table), warm=True)
    return eng


def old_engine(arm, flags, target, draft, table):
    from mtpcli_old import generate, profiles

    s = profiles.resolve("exact", {**flags, **FLAGS[arm]}, env={})
    generate.settle_draft(s, target)
    eng = generate.build_engine(s, target, draft if s.values["draft"] in ("model", "auto") else None)
    if table is not None and arm == "auto":
        from mtpcli_old.policy import Costs

        eng.controller.use(Costs.from_dict(table), warm=True)
    return eng


def steady(eng, request) -> tuple[list[int], int, float]:
    """The tokens, and the tokens after the first event with the seconds they took."""
    tokens, n, t0 = [], 0, None
    for ev in eng.generate([request]):
        tokens += ev.tokens
        if t0 is None:
            t0 = time.perf_counter()
        else:
            n += len(ev.tokens)
    return tokens, n, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", required=True)
    ap.add_argument("--prompts", required=True, help="comma-separated prompt files")
    ap.add_argument("--arms", default="plain,ngram,auto")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    os.environ["MTPCLI_NO_LOG"] = "1"  # neither tree reads or writes a kept table: both use the one measured here
    from mtpcli import assemble, config, models, prompts
    from mtpcli.engine import Request
    from mtpcli.generate import encode_prompt

    target, draft = models.load(a.model), models.load(a.draft_model)
    flags = {"model": a.model, "draft_model": a.draft_model, "max_tokens": a.max_tokens, "temp": 0.0}
    ids = [encode_prompt(target.tokenizer, it.text, None, None) for it in prompts.read_files(a.prompts.split(","))]
    req = lambda i, n: Request(0, ids[i], n, 0)  # noqa: E731
    table = None
    if "auto" in a.arms:  # one cost table for both trees: measured by a run of this tree's auto, kept in a temp log
        with tempfile.TemporaryDirectory() as home:
            os.environ.update(XDG_DATA_HOME=home, MTPCLI_NO_LOG="")
            cfg = config.settle(config.resolve("exact", flags, env={}), models.has_mtp(target))
            for i in range(len(ids)):
                eng = assemble.engine(cfg, target, draft)
                steady(eng, req(i, a.max_tokens))
                assemble.remember_costs(eng)
            from mtpcli import runlog

            table = runlog.load_costs(eng.policy.key)
            os.environ["MTPCLI_NO_LOG"] = "1"
        print("cost table:", json.dumps(table), flush=True)
    build = {"new": new_engine, "old": old_engine}
    arms = a.arms.split(",")
    rates = {(tree, arm): [] for arm in arms for tree in build}
    texts: dict = {}
    for rep in range(a.reps + 1):  # repetition 0 warms up (8 tokens a run)
        for arm in arms:
            for tree in (("old", "new") if rep % 2 else ("new", "old")):
                n = t = 0
                for i in range(len(ids)):
                    eng = build[tree](arm, flags, target, draft, table)
                    toks, dn, dt = steady(eng, req(i, a.max_tokens if rep else 8))
                    n, t = n + dn, t + dt
                    if rep:
                        texts.setdefault((arm, i), {})[tree] = toks
                if rep:
                    rates[(tree, arm)].append(n / t)
                    print(f"rep {rep} {arm:6s} {tree}: {n / t:8.3f} tok/s", flush=True)
    same = all(v["old"] == v["new"] for v in texts.values())
    rows = []
    print(f"{'arm':<7} {'old tok/s':>10} {'new tok/s':>10} {'new/old':>8}  paired ratios   (same tokens: {same})")
    for arm in arms:
        old, new = rates[("old", arm)], rates[("new", arm)]
        ratios = [y / x for x, y in zip(old, new)]
        rows.append({"arm": arm, "old": old, "new": new, "ratio_of_medians": statistics.median(new) /
                     statistics.median(old), "median_paired_ratio": statistics.median(ratios)})
        print(f"{arm:<7} {statistics.median(old):10.3f} {statistics.median(new):10.3f} "
              f"{rows[-1]['ratio_of_medians']:8.3f}  {' '.join(f'{r:.3f}' for r in ratios)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"argv": vars(a), "same_tokens": same, "cost_table": table, "arms": rows}, f, indent=1)


if __name__ == "__main__":
    main()
