"""The history drafter on an agent-like workload: three templates (a tool-call JSON with different arguments, a
Python module re-emitted with one class renamed, a form letter with different fields), 20 prompts each
(bench/history_agent/templates.jsonl), run twice in sequence with the history on, at T = 0; then a novel-text
control set (control.jsonl) that nothing in the history answers. The draft model is given to the `model` arm only:
the history and n-gram arms differ by the history alone.

Arms (one process, models loaded once; every run is a fresh engine, as one `mtpcli generate` call would be):
  history  draft = auto over n-gram lookup and the history (--history; the store is read before each run and the
           run's output appended after it, through history.Store as the CLI does)
  ngram    draft = auto over n-gram lookup alone (no history)
  model    draft = auto over n-gram lookup and the draft model (no history): the default with a draft model
  plain    --draft none
  history-tree, history-tree-auto, ngram-tree: history or n-gram with draft trees (--spec-tree 16 / auto); in
           pass 2 the history's tree arms run before `history` on the same prompt, their answers not stored
  history-8, history-16, ngram-4: fixed chains (no auto) of the history (its answers not stored, as the trees') or
           of n-gram lookup, at that width: the fixed arms `auto` is held against
Pass 1 runs `history` on every template prompt (templates interleaved: tool call, module, letter, tool call, ...).
Pass 2 runs `history` on every template prompt again, and on every 4th prompt of each template also `ngram`,
`model` and `plain`, interleaved (history, ngram, model, plain on one prompt, then the next). The control set then
runs every arm on each prompt (`--control-rounds` times, the arms' order turning with each prompt and round), with
the history holding both passes; control answers are not stored, so every control run sees the same history (the
kept cycle-cost table still learns from them, as from any run). tok/s is decode speed after the first token.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 XDG_DATA_HOME=$(mktemp -d) \
        python bench/history_agent.py TARGET DRAFT OUT.json [--max-tokens 48] [--every 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from unittest import mock

import jsonfile

ROOT = Path(__file__).resolve().parent.parent


def read(name: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "bench/history_agent" / name).read_text().splitlines() if line]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--every", type=int, default=4, help="pass 2 runs ngram and plain on every N-th prompt")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts of each template (a smoke run)")
    ap.add_argument("--arms", default="ngram,model,plain", help="the arms beside history in pass 2 and the control set")
    ap.add_argument("--resume", default="", help="a JSON of this script: keep its runs of the phases not run now "
                    "(XDG_DATA_HOME must be the same: it holds the history and cycle costs they left)")
    ap.add_argument("--phases", default="", help="the phases to run, of pass1,pass2,control (default: all; with "
                    "--resume, pass2,control); the runs of the others are kept from the resumed JSON")
    ap.add_argument("--control-rounds", type=int, default=1, help="run the control set this many times")
    args = ap.parse_args()

    import mlx.core as mx

    from mtpcli import assemble, config, models
    from mtpcli.engine import Request
    from mtpcli.generate import encode_prompt

    target = models.load(args.target, "target model")
    draft = models.load(args.draft, "draft model")
    templates, control = read("templates.jsonl"), read("control.jsonl")
    if args.limit:
        seen: dict[str, int] = {}
        templates = [t for t in templates if seen.setdefault(t["template"], 0) < args.limit
                     and not seen.__setitem__(t["template"], seen[t["template"]] + 1)]
    arms = {"history": {"history": True, "draft_model": None}, "ngram": {"draft_model": None}, "model": {},
            "plain": {"draft": "none"}, "history-tree": {"history": True, "draft_model": None, "tree": "16"},
            "history-tree-auto": {"history": True, "draft_model": None, "tree": "auto"},
            "ngram-tree": {"draft_model": None, "tree": "16"},
            "history-8": {"history": True, "draft_model": None, "draft": "history", "num_draft_tokens": 8},
            "history-16": {"history": True, "draft_model": None, "draft": "history", "num_draft_tokens": 16},
            "ngram-4": {"draft_model": None, "draft": "ngram", "num_draft_tokens": 4}}
    results = {"config": {"target": args.target, "draft": args.draft, "max_tokens": args.max_tokens,
                          "every": args.every, "argv": sys.argv}, "runs": []}
    others = [a for a in args.arms.split(",") if a]
    phases = [p for p in (args.phases or ("pass2,control" if args.resume else "pass1,pass2,control")).split(",") if p]
    if not phases or set(phases) - {"pass1", "pass2", "control"}:
        sys.exit(f"--phases: expected some of pass1,pass2,control, got {args.phases!r}")
    if args.resume:
        old = jsonfile.load(args.resume)
        kept = sorted({r["phase"] for r in old["runs"]} - set(phases))
        results["config"]["resumed"] = {"phases": kept, "argv": old["config"]["argv"],
                                        "earlier": old["config"].get("resumed")}
        results["runs"] = [r for r in old["runs"] if r["phase"] in kept]

    def settings(extra, max_tokens=None):
        over = {"model": args.target, "draft_model": args.draft, "temp": 0.0,
                "max_tokens": max_tokens or args.max_tokens, **extra}
        cfg = config.resolve("exact", over, env={})
        if "draft_model" in extra:  # (a flag of None is no flag: the arm without the draft model says so here)
            cfg = replace(cfg, draft_model=extra["draft_model"])
        return config.settle(cfg, models.has_mtp(target))

    def one(cfg, ids, keep=True):
        t_open = time.perf_counter()
        store = assemble.open_history(cfg, target)
        engine = assemble.engine(cfg, target, draft if cfg.draft_model else None, store=store)
        hist = getattr(engine.drafter, "sources", {}).get("history")
        tokens, first = [], None
        t0 = time.perf_counter()
        for ev in engine.generate([Request(0, ids, cfg.max_tokens, 0)]):
            tokens.extend(ev.tokens)
            if first is None:
                first = (len(tokens), time.perf_counter())
        end = time.perf_counter()
        if store is not None and keep:
            store.add(ids, tokens)
            store.save()
        assemble.remember_costs(engine)
        return (engine.stats.to_dict(), tokens, (len(tokens) - first[0], end - first[1]), end - t0,
                {"setup_s": t0 - t_open, "history_load_s": hist.load_s if hist else None})

    def record(phase, item, arm, round_=0, keep=None):
        ids = encode_prompt(target.tokenizer, item["prompt"], None, None)
        d, toks, steady, wall, setup = one(settings(arms[arm]), ids, keep=phase != "control" if keep is None else keep)
        rec = {"phase": phase, "template": item["template"], "prompt": item["name"], "arm": arm, "tokens": toks,
               "text": target.tokenizer.decode(toks), "steady_tokens": steady[0], "steady_s": steady[1],
               "tok_s": steady[0] / steady[1] if steady[1] > 0 else 0.0, "wall_s": wall, **setup,
               "tokens_per_cycle": d["tokens_per_cycle"], "acceptance_rate": d["acceptance_rate"],
               "sources": d["sources"], "width_hist": d["draft_width_hist"], "round": round_, "trees": d.get("trees")}
        results["runs"].append(rec)
        mix = " ".join(f"{k}:{v['cycles']}" for k, v in d["sources"].items())
        print(f"{phase:7s} {item['name']:18s} {arm:8s} {rec['tok_s']:6.3f} tok/s {d['tokens_per_cycle']:5.2f} tok/cycle"
              f"  [{mix}]", file=sys.stderr, flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
        return rec

    tune = encode_prompt(target.tokenizer, "Write a Python function that merges two sorted lists.", None, None)
    for arm in arms:  # warm-up: compile, page the weights in (history off: nothing stored)
        one(settings({**arms[arm], "history": arms[arm].get("draft") == "history"}, 6), tune, keep=False)
    tree_arms = [a for a in others if "tree" in a]
    if tree_arms:  # trees' warm-up: their verify shapes compile on a history of their own (not the measured one)
        with tempfile.TemporaryDirectory() as home, mock.patch.dict(os.environ, {"XDG_DATA_HOME": home}):
            for item in templates[:6]:  # two of each template: the history has alternatives
                ids = encode_prompt(target.tokenizer, item["prompt"], None, None)
                one(settings(arms["history"]), ids)
                for arm in tree_arms:
                    one(settings(arms[arm]), ids, keep=False)
    for arm in ("history", "ngram", "model") if "pass1" in phases else ():  # calibration: this machine's cycle
        one(settings({**arms[arm], "history": False}, 32), tune)  # costs, as a user's first run stores them

    for phase in [p for p in ("pass1", "pass2") if p in phases]:
        counts: dict[str, int] = {}
        for item in templates:
            i = counts.get(item["template"], 0)
            counts[item["template"]] = i + 1
            trees = [a for a in others if a.startswith("history-")] if phase == "pass2" and i % args.every == 0 \
                else []
            for arm in trees:  # the history's other arms first, their answers not kept: every arm sees one history
                record(phase, item, arm, keep=False)
            record(phase, item, "history")
            if phase == "pass2" and i % args.every == 0:
                for arm in [a for a in others if a not in trees]:
                    record(phase, item, arm)
    order = ["history"] + others
    for r in range(args.control_rounds if "control" in phases else 0):
        for i, item in enumerate(control):  # the arms' order turns with each prompt and round
            for arm in order[(i + r) % len(order):] + order[:(i + r) % len(order)]:
                record("control", item, arm, r)
    mx.clear_cache()


if __name__ == "__main__":
    main()
