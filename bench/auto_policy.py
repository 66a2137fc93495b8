"""`draft = auto` against every fixed choice, per content class, interleaved in one process.

Arms: auto (the default profile), plain decoding (--draft none), n-gram alone (profile ngram, width 4), the draft
model at fixed width 4 (profile fixed-4), the EMA adaptive width (profile adaptive, 3..7). For each temperature,
each prompt runs every arm in turn (A B C D E, A B C D E, ...). Classes: the shipped bench prompts (one per class)
and held-out prompts (bench/auto_heldout/) that nothing was tuned on. Before measuring, one calibration run of
`auto` per temperature on a tuning prompt stores this machine's cycle costs in the run log (a fresh
XDG_DATA_HOME), as a user's first run would.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 XDG_DATA_HOME=$(mktemp -d) \
        python bench/auto_policy.py TARGET DRAFT OUT.json [--max-tokens 40] [--temps 0,1] [--seed 0]

At T > 0 every arm draws its own text, so one seed compares each class on one draw per arm: give each round its own
--seed, so that pooling rounds averages over draws (at T = 0 the text is the same in every arm and every seed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARMS = [("auto", "exact", {}), ("plain", "exact", {"draft": "none"}), ("ngram", "ngram", {}),
        ("model-4", "fixed-4", {}), ("ema", "adaptive", {})]


def prompts() -> list[tuple[str, str, str]]:
    """(class, name, text): the first prompt of each shipped class, then every held-out prompt."""
    out = []
    for d in sorted((ROOT / "src/mtpcli/bench_prompts").iterdir()):
        f = sorted(d.glob("*.txt"))[0]
        out.append((d.name, f.stem, f.read_text()))
    for f in sorted((ROOT / "bench/auto_heldout").glob("*.txt")):
        out.append((f"held-out/{f.stem}", f.stem, f.read_text()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--classes", default="", help="only classes whose name contains one of these (comma-separated)")
    ap.add_argument("--prompts", nargs="*", help="these prompt files instead (tuning: tune on prompts not reported)")
    ap.add_argument("--arms", default=",".join(a for a, _, _ in ARMS), help="these arms only (comma-separated)")
    ap.add_argument("--reverse", action="store_true", help="the arms in reverse order (a second round)")
    ap.add_argument("--seed", type=int, default=0, help="the requests' seed (what T > 0 draws)")
    args = ap.parse_args()

    import mlx.core as mx

    from mtpcli import assemble, config, models
    from mtpcli.engine import Request
    from mtpcli.generate import encode_prompt

    target = models.load(args.target, "target model")
    draft = models.load(args.draft, "draft model")
    arms = [a for a in ARMS if a[0] in args.arms.split(",")][:: -1 if args.reverse else 1]
    items = [(f"tune/{Path(f).stem}", Path(f).stem, Path(f).read_text()) for f in args.prompts] if args.prompts else \
        [it for it in prompts() if not args.classes or any(c in it[0] for c in args.classes.split(","))]
    results = {"config": {"target": args.target, "draft": args.draft, "max_tokens": args.max_tokens,
                          "arms": [a for a, _, _ in arms], "seed": args.seed, "argv": sys.argv}, "runs": []}

    def settings(profile, extra, temp):
        over = {"model": args.target, "draft_model": args.draft, "temp": float(temp), "max_tokens": args.max_tokens,
                **({"top_p": 0.95} if temp else {}), **extra}
        return config.settle(config.resolve(profile, over, env={}), models.has_mtp(target))

    def one(cfg, ids):
        engine = assemble.engine(cfg, target, draft if cfg.draft in ("model", "auto") else None)
        tokens, first = [], None
        for ev in engine.generate([Request(0, ids, cfg.max_tokens, args.seed)]):
            tokens.extend(ev.tokens)
            if first is None:
                first = (len(tokens), time.perf_counter())
        steady = (len(tokens) - first[0], time.perf_counter() - first[1])
        auto = assemble.remember_costs(engine)
        return engine.stats, tokens, steady, auto

    tune = encode_prompt(target.tokenizer, (ROOT / "src/mtpcli/bench_prompts/code/lru_cache.txt").read_text(),
                         None, None)
    for temp in args.temps.split(","):
        for arm, profile, extra in arms:  # warm-up: compile, page the weights in
            one(settings(profile, {**extra, "max_tokens": 6}, temp), tune)
        st, _, _, auto = one(settings("exact", {"max_tokens": 32}, temp), tune)  # calibration: costs stored
        print(f"T={temp} calibration: {json.dumps(auto)}", file=sys.stderr, flush=True)
        for cls, name, text in items:
            ids = encode_prompt(target.tokenizer, text, None, None)
            for arm, profile, extra in arms:
                st, toks, steady, auto = one(settings(profile, extra, temp), ids)
                d = st.to_dict()
                rec = {"temp": float(temp), "class": cls, "prompt": name, "arm": arm, "tokens": toks,
                       "text": target.tokenizer.decode(toks), "steady_tokens": steady[0], "steady_s": steady[1],
                       "tok_s": steady[0] / steady[1] if steady[1] > 0 else 0.0,
                       "tokens_per_cycle": d["tokens_per_cycle"], "acceptance_rate": d["acceptance_rate"],
                       "sources": d["sources"], "width_hist": d["draft_width_hist"], "auto": auto,
                       "trace": [d["source_trace"], d["width_trace"], d["tokens_per_cycle_trace"]]}
                results["runs"].append(rec)
                mix = " ".join(f"{k}:{v['cycles']}" for k, v in d["sources"].items())
                print(f"T={temp} {cls:24s} {arm:8s} {rec['tok_s']:.3f} tok/s  {d['tokens_per_cycle']:.2f} tok/cycle  "
                      f"[{mix}]", file=sys.stderr, flush=True)
                Path(args.out).write_text(json.dumps(results, indent=1))
    mx.clear_cache()


if __name__ == "__main__":
    main()
