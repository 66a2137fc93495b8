"""A trace-driven simulation of `draft = auto`, for tuning the policy without running the models each time.

`record`: for each prompt, the target's greedy continuation (--max-tokens), then one pass of each model over prompt
+ continuation: per generated position, whether the draft's argmax agrees with the target's (at T = 0 a draft of k
tokens from position t passes exactly as far as these agree: its tokens are the true ones until the first
disagreement), the target's largest probability (what `AutoPolicy.observe` sees) and the draft's (what its
confidence floor reads). `simulate`: the real AutoPolicy, the real n-gram lookup and the draft model's floor run on
those records, each cycle charged a fixed cost model (plain step, fixed part and per-token seconds per source, as
measured on this CPU: docs/perf/auto.md) against a kept table as a warm run finds it; prints each prompt's tokens per
second against plain steps and its cycles (`--arm`: a fixed arm of bench/auto_policy.py instead of auto, as its
profile runs it: lookup alone at width K, the draft model at width K, the EMA width; `compare`: every arm per prompt,
and auto against the best of the others, as issue 14's per-class bar reads it). Knobs of the policy module can be
set for a run (--set NAME=VALUE).
Tune on prompts that are not reported (bench/auto_tune/); the simulation ignores how a draft after a disagreement
would go on (only where it stops costs anything). `record --temp 1` draws the continuation at T = 1 (top-p 0.95) and
records each position's sum min(p, q), a drafted token's chance to pass there under the exact law: `simulate` draws
each model token's pass from it (--seeds times; the text stays the recorded one, the lookup's tokens pass where they
match it: a deterministic token x passes with probability p(x), the chance the text has x there).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python bench/auto_sim.py record TARGET DRAFT OUT.json FILES... \
        [--temp 1]
    python bench/auto_sim.py simulate OUT.json [MORE.json ...] [--tokens 40] [--arm auto] [--set ROW_SD=1.0 ...]
    python bench/auto_sim.py compare OUT.json [MORE.json ...] [--tokens 40]   (auto against the fixed arms, per prompt)
    python bench/auto_sim.py fit OUT.json        (how well the policy's confidence figure predicts agreement)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
from statistics import geometric_mean

STEP, PLAIN, FIXED, PER_TOKEN = 0.30, 0.26, {"model": 0.17, "ngram": 0.12}, {"model": 0.15, "ngram": 0.03}
KEPT = {"plain": PLAIN, "step": STEP, "per_token": PER_TOKEN, "fixed": FIXED,
        "accept": {"model": [0.95, 0.93, 0.9, 0.88, 0.87, 0.86, 0.85, 0.85], "ngram": [0.8] * 4},
        "visits": {"model": [100.0] * 8, "ngram": [50.0] * 4}, "shift": {"ngram": [0.5, 50.0], "model": [1.0, 50.0]},
        "conf": {"model": [0.9, 100.0]}}
# drawn at T = 1 (top-p 0.95): as the kept tables of bench/auto_policy.py's T = 1 runs have them (docs/perf/cpu)
KEPT_SAMPLED = {"accept": {"model": [0.9, 0.9, 0.9, 0.88, 0.87, 0.86, 0.85, 0.85], "ngram": [0.8] * 4},
                "shift": {"ngram": [1.0, 50.0], "model": [0.45, 100.0]}}


def continuation(target, draft, ids: list[int], n: int, sp=None, seed: int = 0):
    """The target's continuation of `ids` (n tokens: greedy, or drawn under SamplingParams `sp`), and both models'
    logits (float32) at the positions that predict it."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mtpcli.sampling import probs, sample

    seq, cache, key = list(ids), make_prompt_cache(target.model), mx.random.key(seed)
    logits = target.model(mx.array([seq]), cache=cache)[:, -1]
    for _ in range(n):
        if sp is None:
            seq.append(int(mx.argmax(logits, -1).item()))
        else:
            key, sub = mx.random.split(key)
            seq.append(int(sample(probs(logits.astype(mx.float32), sp)[0], sub).item()))
        logits = target.model(mx.array([seq[-1:]]), cache=cache)[:, -1]
    x = mx.array([seq[:-1]])
    return seq[len(ids):], *(m.model(x)[0, len(ids) - 1:].astype(mx.float32) for m in (target, draft))


def record(args) -> None:
    import mlx.core as mx

    from mtpcli import models
    from mtpcli.generate import encode_prompt
    from mtpcli.sampling import SamplingParams, probs

    target, draft = models.load(args.target, "target model"), models.load(args.draft, "draft model")
    sp = SamplingParams(temp=args.temp, top_p=0.95) if args.temp else None
    out = {}
    for f in args.files:
        ids = encode_prompt(target.tokenizer, open(f).read(), None, None)
        gen, lt, ld = continuation(target, draft, ids, args.max_tokens, sp)
        top = lambda lg: mx.exp(lg.max(-1) - mx.logsumexp(lg, -1)).tolist()  # noqa: E731
        out[f] = {"ids": ids, "gen": gen, "agree": (mx.argmax(lt, -1) == mx.argmax(ld, -1)).tolist(),
                  "conf": top(lt), "qmax": top(ld)}
        if sp is not None:  # a drafted token's chance to pass there: sum min(p, q) (exact law)
            out[f]["pass"] = mx.minimum(probs(lt, sp), probs(ld, sp)).sum(-1).tolist()
            out[f]["temp"] = args.temp
        print(f, sum(out[f]["agree"]) / len(out[f]["agree"]), flush=True)
    json.dump(out, open(args.out, "w"))


def load(paths: list[str]) -> dict:
    """Records of one or more files, each prompt named by its file (and its temperature where it was drawn at T > 0,
    so one prompt's records at two temperatures are two entries; a prompt in two files at one: the later file's)."""
    data = {}
    for path in paths:
        for name, r in json.load(open(path)).items():
            data[f"{name}@T{r['temp']:g}" if r.get("temp") else name] = r
    return data


ARM = re.compile(r"auto|plain|ema|(ngram|model):[1-9][0-9]*")


def arm_name(value: str) -> str:
    if not ARM.fullmatch(value):
        raise argparse.ArgumentTypeError(f"unknown arm {value!r}: auto, plain, ema, ngram:K or model:K")
    return value


def run_one(r: dict, arm: str, tokens: int, seed: int) -> tuple[float, list[str]]:
    """One prompt's record under `arm` (auto; plain; ngram:K, lookup at width K where it has a match, else a plain
    step; model:K, the draft model at width K; ema, the draft model at the EMA width 3..7 of profile adaptive; the
    fixed arms with no confidence floor, as their profiles): tokens per second against plain steps, and the cycles."""
    from mtpcli.controller import EmaController
    from mtpcli.drafters import passes
    from mtpcli.drafters.ngram import NgramDrafter
    from mtpcli.policy import AutoPolicy, Costs, shifted

    cost = lambda s, k: STEP if s is None or not k else PLAIN + FIXED[s] + PER_TOKEN[s] * k  # noqa: E731
    ids, gen, agree, conf, qmax = r["ids"], r["gen"], r["agree"], r["conf"], r["qmax"]
    rng = random.Random(seed)
    if "pass" in r:  # drawn at T > 0: a model's token passes with its chance there, sum min(p, q)
        agree = [rng.random() < x for x in r["pass"]]  # (one draw per position: redrawn per seed)
    greedy = "pass" not in r
    lookup = NgramDrafter(2, 4)  # (the default profile's ngram_min, ngram_max)
    lookup.add_rows(1)
    lookup.start(0, ids)
    pol = AutoPolicy(["ngram", "model"], 8, Costs.from_dict(KEPT if greedy else {**KEPT, **KEPT_SAMPLED}),
                     lambda s, c, k: lookup.available(c, k) if s == "ngram" else None, warm=True, stops=["model"])
    fixed, width = (arm.split(":") + ["0"])[:2] if arm != "auto" else (None, "0")
    ema = EmaController(n_min=3, n_max=7) if arm == "ema" else None
    t, seconds, trace = 0, 0.0, []
    while t < min(tokens, len(gen) - 1):
        context = ids + gen[:t]
        if fixed is None:
            source, k = pol.plan([context])
        elif fixed == "ngram":
            have = lookup.available([context], int(width))[0]
            k = min(int(width), len(have))
            source = "ngram" if k else None
        elif fixed in ("model", "ema"):
            source, k = "model", ema.width() if ema else int(width)
        else:
            source, k = None, 0
        k = min(k, len(gen) - t - 1)
        chances = None
        n = a = 0
        if source == "model" and k > 0:  # the floor as drafters.autoregress applies it (auto only)
            keep, go_on, shift = pol.floor("model") if fixed is None else (0.0, 0.0, [0.0])
            chance, n, chances = 1.0, k, []
            for j in range(k):
                raw = passes(qmax[t + j], greedy)
                chance *= shifted(raw, shift[0])
                if chance < keep:
                    n = j
                    break
                chances.append(raw)
                if chance < go_on:
                    n = j + 1
                    break
            while a < n and agree[t + a]:
                a += 1
        elif source == "ngram" and k > 0:
            look = lookup.available([context], k)[0]
            draft = look.tokens[:k]
            n, chances = len(draft), list(look)[: len(draft)]
            while a < n and draft[a] == gen[t + a]:
                a += 1
        sec = cost(source, n)
        seconds += sec
        trace.append(f"{(source or 'plain')[0] if n else 'p'}{n}:{a + 1}")
        if fixed is None:
            pol.update([n], [a], seconds=sec, source=source if k > 0 else None, requested=[k if source else 0],
                       chances=None if chances is None else [chances], chained=source is None)
            pol.observe([conf[t: t + a + 1]])  # after update, as the engine
        elif ema is not None:
            ema.update([n], [a])
        t += a + 1
        lookup.commit([ids + gen[:t]], [a], None)
    return t / seconds * STEP, trace


def runs(data: dict, arm: str, tokens: int, seeds: int):
    """(prompt, seed, ratio to plain, cycles) of every record: records drawn at T > 0 `seeds` times."""
    for name, r in data.items():
        for seed in range(seeds if "pass" in r else 1):
            yield (name, seed, *run_one(r, arm, tokens, seed))


def settings(args) -> None:
    from mtpcli import policy

    for kv in args.kept:  # an entry of the kept table (JSON), e.g. conf={}
        name, value = kv.split("=", 1)
        KEPT[name] = KEPT_SAMPLED[name] = json.loads(value)
    for kv in args.set:
        name, value = kv.split("=")
        setattr(policy, name, type(getattr(policy, name))(json.loads(value)))


def simulate(args) -> None:
    settings(args)
    ratios = []
    for name, _, ratio, trace in runs(load(args.records), args.arm, args.tokens, args.seeds):
        ratios.append(ratio)
        print(f"{name.split('/')[-1]:24s} {ratio:.2f}x plain  {' '.join(trace)}"[:args.width])
    print(f"geometric mean {geometric_mean(ratios):.3f}x plain")


def compare(args) -> None:
    """Per prompt (geometric mean over its draws): auto and the fixed arms against plain steps, and auto against
    the best of the others (plain steps included), as issue 14's per-class bar reads it; then the geometric means
    over prompts and how many prompts are below 0.97x the best other."""
    settings(args)
    data = load(args.records)
    arms = ["auto", "ngram:4", "model:4", "ema"]
    per = {}
    for arm in arms:
        got: dict[str, list[float]] = {}
        for name, _, ratio, _ in runs(data, arm, args.tokens, args.seeds):
            got.setdefault(name, []).append(ratio)
        per[arm] = {name: geometric_mean(v) for name, v in got.items()}
    print("| prompt | " + " | ".join(arms) + " | auto / best other |")
    print("|---|" + "---|" * (len(arms) + 1))
    below, worst = 0, math.inf
    for name in data:
        best = max([1.0] + [per[a][name] for a in arms[1:]])
        ratio = per["auto"][name] / best
        below, worst = below + (ratio < 0.97), min(worst, ratio)
        print(f"| {name.split('/')[-1].replace('.txt', '')} | " + " | ".join(f"{per[a][name]:.2f}" for a in arms)
              + f" | {ratio:.2f}{' (below)' if ratio < 0.97 else ''} |")
    print("\ngeometric means against plain: " + ", ".join(f"{a} {geometric_mean(per[a].values()):.3f}" for a in arms)
          + f"; auto below 0.97x the best other on {below} of {len(data)} prompts (worst {worst:.2f}x)")


def fit(args) -> None:
    """How well the row's decayed mean confidence before a position (the policy's figure: CONF_DECAY, CONF_PRIOR
    tokens of a kept 0.91) predicts the draft's agreement there: a logistic fit on its log-odds offset, against a
    constant; log-loss per position and the fitted slope, per decay."""
    import numpy as np

    from mtpcli.policy import CONF_PRIOR, _logit

    data = json.load(open(args.records))
    for decay in (0.8, 0.9, 0.95, 0.99, 1.0):
        x, y = [], []
        for r in data.values():
            total = weight = 0.0
            for agree, conf in zip(r["agree"], r["conf"]):
                x.append(_logit((total + CONF_PRIOR * 0.91) / (weight + CONF_PRIOR)) - _logit(0.91))
                y.append(float(agree))
                total, weight = total * decay + conf, weight * decay + 1.0
        a, y = np.stack([np.ones(len(x)), np.array(x)], 1), np.array(y)
        for cols in ([0], [0, 1]):
            b = np.zeros(len(cols))
            for _ in range(50):  # Newton on the log-likelihood
                p = 1 / (1 + np.exp(-a[:, cols] @ b))
                b -= np.linalg.solve(-(a[:, cols].T * (p * (1 - p))) @ a[:, cols] - 1e-9 * np.eye(len(cols)),
                                     a[:, cols].T @ (y - p))
            p = np.clip(1 / (1 + np.exp(-a[:, cols] @ b)), 1e-9, 1 - 1e-9)
            loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
            print(f"decay {decay}: " + (f"constant log-loss {loss:.3f}" if len(cols) == 1 else
                                         f"with the confidence {loss:.3f}, slope {b[1]:.2f}"))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("target")
    rec.add_argument("draft")
    rec.add_argument("out")
    rec.add_argument("files", nargs="+")
    rec.add_argument("--max-tokens", type=int, default=80)
    rec.add_argument("--temp", type=float, default=0.0, help="a continuation drawn at this temperature (top-p 0.95)")
    for cmd in ("simulate", "compare"):
        sim = sub.add_parser(cmd)
        sim.add_argument("records", nargs="+")
        sim.add_argument("--tokens", type=int, default=40)
        sim.add_argument("--set", nargs="*", default=[])
        sim.add_argument("--kept", nargs="*", default=[], help="NAME=JSON: an entry of the kept table, at every T")
        sim.add_argument("--seeds", type=int, default=8,
                         help="records drawn at T > 0: the passes drawn this many times")
        if cmd == "simulate":
            sim.add_argument("--arm", type=arm_name, default="auto", help="auto, plain, ngram:K, model:K or ema")
            sim.add_argument("--width", type=int, default=1000, help="print lines cut to this many characters")
    fitting = sub.add_parser("fit")
    fitting.add_argument("records")
    args = ap.parse_args()
    {"record": record, "simulate": simulate, "compare": compare, "fit": fit}[args.cmd](args)


if __name__ == "__main__":
    main()
