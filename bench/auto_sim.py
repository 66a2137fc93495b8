"""A trace-driven simulation of `draft = auto`, for tuning the policy without running the models each time.

`record`: for each prompt, the target's greedy continuation (--max-tokens), then one pass of each model over prompt
+ continuation: per generated position, whether the draft's argmax agrees with the target's (at T = 0 a draft of k
tokens from position t passes exactly as far as these agree: its tokens are the true ones until the first
disagreement), the target's largest probability (what `AutoPolicy.observe` sees) and the draft's (what its
confidence floor reads). `simulate`: the real AutoPolicy, the real n-gram lookup and the draft model's floor run on
those records, each cycle charged a fixed cost model (plain step, fixed part and per-token seconds per source, as
measured on this CPU: docs/perf/auto.md) against a kept table as a warm run finds it; prints each prompt's tokens per
second against plain steps and its cycles. Knobs of the policy module can be set for a run (--set NAME=VALUE).
Tune on prompts that are not reported (bench/auto_tune/); the simulation ignores how a draft after a disagreement
would go on (only where it stops costs anything). `record --temp 1` draws the continuation at T = 1 (top-p 0.95) and
records each position's sum min(p, q), a drafted token's chance to pass there under the exact law: `simulate` draws
each model token's pass from it (--seeds times; the text stays the recorded one, the lookup's tokens pass where they
match it: a deterministic token x passes with probability p(x), the chance the text has x there).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python bench/auto_sim.py record TARGET DRAFT OUT.json FILES... \
        [--temp 1]
    python bench/auto_sim.py simulate OUT.json [--tokens 40] [--set ROW_SD=1.0 ...]
    python bench/auto_sim.py fit OUT.json        (how well the policy's confidence figure predicts agreement)
"""

from __future__ import annotations

import argparse
import json
import math
import random

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


def simulate(args) -> None:
    from mtpcli import policy
    from mtpcli.drafters import passes
    from mtpcli.drafters.ngram import NgramDrafter
    from mtpcli.policy import AutoPolicy, Costs, shifted

    for kv in args.kept:  # an entry of the kept table (JSON), e.g. conf={}
        name, value = kv.split("=", 1)
        KEPT[name] = KEPT_SAMPLED[name] = json.loads(value)
    for kv in args.set:
        name, value = kv.split("=")
        setattr(policy, name, type(getattr(policy, name))(json.loads(value)))
    data = json.load(open(args.records))
    cost = lambda s, k: STEP if s is None or not k else PLAIN + FIXED[s] + PER_TOKEN[s] * k  # noqa: E731
    ratios = []
    for name, r, seed in ((n, r, seed) for n, r in data.items() for seed in range(args.seeds if "pass" in r else 1)):
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
        t, seconds, trace = 0, 0.0, []
        while t < min(args.tokens, len(gen) - 1):
            context = ids + gen[:t]
            source, k = pol.plan([context])
            k = min(k, len(gen) - t - 1)
            chances = None
            n = a = 0
            if source == "model" and k > 0:  # the floor as drafters.autoregress applies it
                keep, go_on, shift = pol.floor("model")
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
                tokens = look.tokens[:k]
                n, chances = len(tokens), list(look)[: len(tokens)]
                while a < n and tokens[a] == gen[t + a]:
                    a += 1
            sec = cost(source, n)
            seconds += sec
            trace.append(f"{(source or 'plain')[0] if n else 'p'}{n}:{a + 1}")
            pol.update([n], [a], seconds=sec, source=source if k > 0 else None, requested=[k if source else 0],
                       chances=None if chances is None else [chances], chained=source is None)
            if hasattr(pol, "observe"):  # after update, as the engine (a policy from before it has none)
                pol.observe([conf[t: t + a + 1]])
            t += a + 1
            lookup.commit([ids + gen[:t]], [a], None)
        ratios.append(t / seconds * STEP)
        print(f"{name.split('/')[-1]:24s} {ratios[-1]:.2f}x plain  {' '.join(trace)}"[:args.width])
    print(f"geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}x plain")


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
    sim = sub.add_parser("simulate")
    sim.add_argument("records")
    sim.add_argument("--tokens", type=int, default=40)
    sim.add_argument("--set", nargs="*", default=[])
    sim.add_argument("--kept", nargs="*", default=[], help="NAME=JSON: an entry of the kept table, at every T")
    sim.add_argument("--seeds", type=int, default=8, help="records drawn at T > 0: the passes drawn this many times")
    sim.add_argument("--width", type=int, default=1000, help="print lines cut to this many characters")
    fitting = sub.add_parser("fit")
    fitting.add_argument("records")
    args = ap.parse_args()
    {"record": record, "simulate": simulate, "fit": fit}[args.cmd](args)


if __name__ == "__main__":
    main()
