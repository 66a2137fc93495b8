"""`draft = auto` in replay: every arm and every variant of the policy decides on the same recorded text, so timing
noise is gone (issue 33's ablation; the method of bench/auto_sim.py at b092569).

`record`: for each prompt, the target's continuation (--max-tokens; greedy, or drawn at --temp with top-p 0.95), then
one pass of each model over prompt + continuation: per generated position, whether the draft's argmax agrees with
the target's (at T = 0 a draft of k tokens from position t passes exactly as far as these agree), the target's
largest probability (what the policy's confidence signal reads) and the draft's (what its in-draft stop reads); at
T > 0 also sum min(p, q), a drafted token's chance to pass there under the exact law. The continuations come from
mlx-lm's batch_generate (its sampler is mtpcli's law).

`compare` / `ablate`: the real AutoPolicy, the real n-gram lookup and the draft model's in-draft stop run on those
records, each cycle charged the kept cost table given (--costs: this machine's, as the run log keeps it), the policy
deciding with that table as a warm run does; at T > 0 a draft model's token passes with its recorded chance (drawn
--seeds times), a lookup token where it is the recorded text. `compare`: auto against the fixed arms per prompt, and
the fixed arm a choice knowing each prompt's class would take.
`ablate`: the full policy against each mechanism removed (and all the removable ones together), geometric means of
tokens per second against plain steps, overall and per class, the worst class's loss.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python bench/auto_replay.py record TARGET DRAFT OUT.json \\
        bench/auto_eval/*/*.txt [--temp 1]
    python bench/auto_replay.py compare --costs COSTS.json REC.json [REC.json ...] [--tokens 40]
    python bench/auto_replay.py ablate --costs COSTS.json REC.json [REC.json ...] [--tokens 40 80]
    python bench/auto_replay.py eliminate|first --costs COSTS.json REC.json [...]   (see their docstrings)
`--costs-sampled` gives the kept table of sampled runs for records drawn at T > 0. The ablation's mechanisms are those
of the policy before it (commit 489a900); run against the package as it is, a mechanism it no longer has is left out.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from statistics import geometric_mean

import jsonfile

TOP_P = 0.95


def record(args) -> None:
    import mlx.core as mx
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    from mtpcli import models
    from mtpcli.generate import encode_prompt
    from mtpcli.sampling import SamplingParams, probs

    target, draft = models.load(args.target, "target model"), models.load(args.draft, "draft model")
    sp = SamplingParams(temp=args.temp, top_p=TOP_P) if args.temp else SamplingParams()
    out = json.load(open(args.out)) if Path(args.out).exists() else {}
    files = [f for f in args.files if f not in out]
    mx.random.seed(args.seed)
    for i in range(0, len(files), args.batch):
        chunk = files[i: i + args.batch]
        prompts = [encode_prompt(target.tokenizer, open(f).read(), None, None) for f in chunk]
        sampler = make_sampler(temp=args.temp, top_p=TOP_P if args.temp else 0.0)
        gens = batch_generate(target.model, target.tokenizer, prompts, max_tokens=args.max_tokens,
                              sampler=sampler, return_token_ids=True).token_ids
        for f, ids, gen in zip(chunk, prompts, gens):
            gen = [int(t) for t in gen]
            x = mx.array([ids + gen[:-1]])
            lt, ld = (m.model(x)[0, len(ids) - 1:].astype(mx.float32) for m in (target, draft))
            top = lambda lg: mx.exp(lg.max(-1) - mx.logsumexp(lg, -1)).tolist()  # noqa: E731
            r = {"ids": ids, "gen": gen, "agree": (mx.argmax(lt, -1) == mx.argmax(ld, -1)).tolist(),
                 "conf": top(lt), "qmax": top(ld)}
            if args.temp:
                r["pass"] = mx.minimum(probs(lt, sp), probs(ld, sp)).sum(-1).tolist()
                r["temp"] = args.temp
            out[f] = r
            print(f, len(gen), f"{sum(r['agree']) / max(len(gen), 1):.2f}", flush=True)
        Path(args.out).write_text(json.dumps(out))


def load(paths: list[str]) -> dict:
    """Records of one or more files, each prompt named by its file and temperature."""
    data = {}
    for path in paths:
        for name, r in jsonfile.load(path).items():
            data[f"{name}@T{r.get('temp', 0):g}"] = r
    return data


def klass(name: str) -> str:
    return Path(name.split("@")[0]).parent.name


# ---- the variants: the full policy, and each mechanism taken out -------------------------------------------------
def _flat(pol):  # the kept acceptance without its shape by position: one figure per source
    orig = pol.costs.prior_accept

    def prior_accept(source, n):
        got = orig(source, n)
        return [sum(got) / len(got)] * n if got else got
    pol.costs.prior_accept = prior_accept


def _no_rowfit(pol):
    pol.row_shift = lambda source, member=0: pol.offset(source, member)


def _no_offset(pol):
    pol.offset = lambda source, member=0: 0.0


def _no_shift(pol):
    pol.shift = lambda source, member=0: 0.0


def _no_watch(pol):
    pol.watch = lambda contexts: None
    start = pol.start

    def no_shadows(batch, law):
        start(batch, law)
        pol.watching = False
    pol.start = no_shadows


# name -> (policy module knobs, patches of the policy object, the in-draft stop on)
MECHANISMS = {
    "per-position shape": ({}, [_flat], True),
    "row fit": ({}, [_no_rowfit], True),
    "confidence signal": ({}, [_no_offset], True),
    "lookup calibration": ({}, [_no_shift], True),
    "shadow drafts": ({}, [_no_watch], True),
    "exploration": ({"EXPLORE": 0.0}, [], True),
    "decay": ({"DECAY": 1.0}, [], True),
    "in-draft stop": ({}, [], False),
}


# what the policy as it is has (the mechanisms the ablation took out are gone from it)
NEEDS = {"per-position shape": "visits", "row fit": "row_shift", "confidence signal": "offset",
         "shadow drafts": "watch", "exploration": "EXPLORE", "decay": "DECAY"}


def present() -> list[str]:
    from mtpcli import policy
    has = lambda name: any(hasattr(x, name) for x in (policy, policy.AutoPolicy, policy.Costs))  # noqa: E731
    return [m for m in MECHANISMS if m not in NEEDS or has(NEEDS[m]) or
            NEEDS[m] in getattr(policy.Costs, "__dataclass_fields__", {})]


def without(names) -> tuple:
    knobs, patches, stops = {}, [], True
    for n in names:
        k, p, s = MECHANISMS[n]
        knobs, patches, stops = {**knobs, **k}, patches + p, stops and s
    return knobs, patches, stops


def run_one(r: dict, arm: str, tokens: int, seed: int, costs: dict, variant=None) -> tuple[float, list[str]]:
    """One record under `arm` (auto; plain; ngram:K lookup at width K where it has a match, else a plain step;
    model:K the draft model at width K; ema the draft model at the EMA width 3..7 of profile adaptive; the peers'
    simple gates over the draft model (issue 58): profit:K, width K while its measured tokens per second beat a plain
    step's, else plain steps with a probe every PROBE cycles (beellama.cpp's `profit`); ema0, an EMA of the accepted
    length that may fall to 0 (Ollama's MLX runner), probed as profit is; ev, the depth of most expected tokens per
    second at the measured acceptance, 0 where none beats a plain step (MTPLX)): tokens per second against plain
    steps, and the cycles (source letter, drafted:committed)."""
    from mtpcli.controller import EmaController
    from mtpcli.stop import Rule
    from mtpcli.drafters.ngram import NgramDrafter
    from mtpcli.policy import AutoPolicy
    try:
        from mtpcli.costs import Costs
    except ImportError:  # (the package before costs.py: 489a900, the policy the ablation started from)
        from mtpcli.policy import Costs

    table = Costs.from_dict(costs)
    ids, gen, agree, conf, qmax = r["ids"], r["gen"], r["agree"], r["conf"], r["qmax"]
    greedy = "pass" not in r
    if not greedy:
        rng = random.Random(seed)
        agree = [rng.random() < x for x in r["pass"]]
    lookup = NgramDrafter(2, 4)
    lookup.add_rows(1)
    lookup.start(0, ids)
    patches, stops = (variant[1], variant[2]) if variant else ([], True)
    pol = AutoPolicy(["ngram", "model"], 8, Costs.from_dict(costs),
                     lambda s, c, k: lookup.available(c, k) if s == "ngram" else None, warm=True,
                     stops=["model"] if stops else [])
    for patch in patches:
        patch(pol)
    pol.start(1, "greedy" if greedy else "exact")
    fixed, width = (arm.split(":") + ["0"])[:2] if arm != "auto" else (None, "0")
    ema = EmaController(n_min=3, n_max=7) if arm == "ema" else None
    gate = Gate(arm, table) if fixed in ("profit", "ema0", "ev") else None
    t, seconds, trace = 0, 0.0, []
    while t < min(tokens, len(gen) - 1):
        context = ids + gen[:t]
        if fixed is None:
            source, k = (plan := pol.plan([context])).source, plan.width
        elif fixed == "ngram":
            k = min(int(width), len(lookup.available([context], int(width))[0]))
            source = "ngram" if k else None
        elif fixed in ("model", "ema"):
            source, k = "model", ema.width() if ema else int(width)
        elif gate is not None:
            k = gate.width()
            source = "model" if k else None
        else:
            source, k = None, 0
        k = min(k, len(gen) - t - 1)
        chances, n, a = None, 0, 0
        if source == "model" and k > 0:
            n = k
            if fixed is None and stops:  # the in-draft stop, as drafters.autoregress applies it
                rule = Rule([k], greedy, stop=plan.stop)
                for j in range(k):
                    rule.weigh(j, [qmax[t + j]])
                    if rule.lengths[0] <= j + 1:
                        break
                n, chances = rule.lengths[0], rule.chances()[0]
            while a < n and agree[t + a]:
                a += 1
        elif source == "ngram" and k > 0:
            draft, est = lookup.look(0, context, k)
            n, chances = len(draft), list(est)[: len(draft)]
            while a < n and draft[a] == gen[t + a]:
                a += 1
        sec = table.time(source if n else None, n)
        seconds += sec
        trace.append(f"{(source or 'plain')[0] if n else 'p'}{n}:{a + 1}")
        if fixed is None:
            pol.update([n], [a], seconds=sec, source=source if k > 0 else None, requested=[k if source else 0],
                       chances=None if chances is None else [chances])
            if hasattr(pol, "observe"):  # (the policy before the ablation read the target's confidence)
                pol.observe([conf[t: t + a + 1]])
        elif ema is not None:
            ema.update([n], [a])
        elif gate is not None:
            gate.update(n, a, sec)
        t += a + 1
        lookup.commit([ids + gen[:t]], [a], None)
    return t / seconds * table.time(None, 0), trace


class Gate:
    """The peers' simple gates over the draft model (run_one's profit:K, ema0, ev): each decides by what it has
    measured on committed tokens only (its own drafts' outcomes, the table's seconds)."""

    PROBE = 8  # cycles between probes of a gate that turned drafting off
    ALPHA = 0.3  # the EMAs' weight of the newest cycle

    def __init__(self, arm: str, table):
        self.kind, _, k = arm.partition(":")
        self.k, self.table, self.off = int(k or 4), table, 0
        self.rate = None  # profit: the EMA of drafting cycles' tokens per second
        self.length = 3.0  # ema0: the EMA of the accepted length
        self.passed, self.tested = 3.0, 4.0  # ev: drafted tokens passed over tested (a prior of 0.75)

    def width(self) -> int:
        if self.kind == "profit":
            on = self.rate is None or self.rate >= 1 / self.table.time(None, 0)
            k = self.k
        elif self.kind == "ema0":
            k = min(8, round(self.length))
            on = k > 0
            k = max(k, 1)
        else:  # ev: E(k) = 1 + a + ... + a^k tokens in T(model, k)
            a = self.passed / self.tested
            k = max(range(9), key=lambda j: sum(a**i for i in range(j + 1)) / self.table.time("model" if j else None,
                                                                                             j))
            on, k = k > 0, max(k, 1)
        if on:
            return k
        self.off += 1
        return k if self.off % self.PROBE == 0 else 0

    def update(self, n: int, a: int, seconds: float) -> None:
        if not n:
            return
        rate = (a + 1) / seconds
        self.rate = rate if self.rate is None else (1 - self.ALPHA) * self.rate + self.ALPHA * rate
        self.length = (1 - self.ALPHA) * self.length + self.ALPHA * (a + (a == n))  # (a full accept: one more)
        self.passed, self.tested = self.passed + a, self.tested + min(n, a + 1)


def kept(args) -> tuple[dict, dict]:
    """The kept tables a warm run decides with: (greedy, sampled)."""
    tables = [json.load(open(args.costs)), json.load(open(args.costs_sampled)) if args.costs_sampled else None]
    for t in filter(None, tables):  # (the kept tables predate `runs`, and kept an acceptance per position: its
        t.setdefault("runs", 1)  # mean over the tokens tested there, as one figure)
        for s, rates in t.get("accept", {}).items():
            if len(rates) != 2 or "visits" in t:
                n = t["visits"][s]
                t["accept"][s] = [sum(a * v for a, v in zip(rates, n)) / sum(n), sum(n)]
    if args.concave:  # as a warm run reads a table an earlier version kept: its verification concave (issue 58)
        from mtpcli.assemble import _kept
        tables = [t if t is None else _kept(t).to_dict() for t in tables]
    return tables[0], tables[1] or tables[0]


def per_prompt(data: dict, arm: str, tokens: int, seeds: int, costs: tuple, variant=None) -> dict[str, float]:
    """Each record's tokens per second against plain steps (geometric mean over its draws at T > 0)."""
    out = {}
    for name, r in data.items():
        table = costs[1] if "pass" in r else costs[0]
        got = [run_one(r, arm, tokens, s, table, variant)[0] for s in range(seeds if "pass" in r else 1)]
        out[name] = geometric_mean(got)
    return out


def with_knobs(knobs: dict, fn):
    from mtpcli import policy
    saved = {k: getattr(policy, k) for k in knobs}
    for k, v in knobs.items():
        setattr(policy, k, v)
    try:
        return fn()
    finally:
        for k, v in saved.items():
            setattr(policy, k, v)


def by_class(ratios: dict[str, float]) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for name, x in ratios.items():
        groups.setdefault(klass(name), []).append(x)
    return {c: geometric_mean(v) for c, v in sorted(groups.items())}


def compare(args) -> None:
    """Per prompt: auto and the fixed arms against plain steps, and auto against the best fixed arm; then the
    geometric means, auto over the best single arm, and how many prompts are below 0.97x their best fixed arm."""
    costs = kept(args)
    data = load(args.records)
    arms, gates = ["auto", "ngram:4", "model:4", "ema"], ["profit:4", "ema0", "ev"]
    for tokens in args.tokens:
        per = {arm: per_prompt(data, arm, tokens, args.seeds, costs) for arm in arms}
        print(f"\n### {tokens} tokens\n\n| prompt | " + " | ".join(arms) + " | auto / best fixed |\n|---|" +
              "---|" * (len(arms) + 1))
        below = 0
        for name in data:
            best = max([1.0] + [per[a][name] for a in arms[1:]])
            ratio = per["auto"][name] / best
            below += ratio < 0.97
            print(f"| {name} | " + " | ".join(f"{per[a][name]:.2f}" for a in arms) +
                  f" | {ratio:.2f}{' (below)' if ratio < 0.97 else ''} |")
        means = {a: geometric_mean(per[a].values()) for a in arms}
        best_arm = max(["plain"] + arms[1:], key=lambda a: 1.0 if a == "plain" else means[a])
        best = 1.0 if best_arm == "plain" else means[best_arm]
        print("\ngeometric means against plain: " + ", ".join(f"{a} {m:.3f}" for a, m in means.items()) +
              f"; auto / best single arm ({best_arm}) {means['auto'] / best:.3f}; auto >= 0.97x the best fixed arm on "
              f"{len(data) - below} of {len(data)} prompts ({(len(data) - below) / len(data):.0%})")
        # the same count for a choice that knows each prompt's class in advance: the fixed arm (plain included)
        # whose geometric mean over the class is best; what knowing the class, not the prompt, can reach
        fixed = {"plain": {n: 1.0 for n in data}, **{a: per[a] for a in arms[1:]}}
        hits = 0
        for c in {klass(n) for n in data}:
            names = [n for n in data if klass(n) == c]
            arm = max(fixed, key=lambda a: geometric_mean([fixed[a][n] for n in names]))
            hits += sum(fixed[arm][n] >= 0.97 * max(f[n] for f in fixed.values()) for n in names)
        print(f"the best fixed arm of each class, chosen in hindsight: >= 0.97x the best fixed arm on {hits} of "
              f"{len(data)} prompts ({hits / len(data):.0%})")
        # the peers' simple gates beside auto: overall and per class, and whether one comes within 2% of auto
        per.update({g: per_prompt(data, g, tokens, args.seeds, costs) for g in gates})
        classes = {a: by_class(per[a]) for a in ["auto", *gates]}
        print("\n| arm | overall | " + " | ".join(classes["auto"]) + " |\n|---|---|" + "---|" * len(classes["auto"]))
        for a in ["auto", *gates]:
            print(f"| {a} | {geometric_mean(per[a].values()):.3f} | " +
                  " | ".join(f"{v:.3f}" for v in classes[a].values()) + " |")
        for g in gates:
            ratios = [geometric_mean(per[g].values()) / means["auto"]] + [
                classes[g][c] / classes["auto"][c] for c in classes["auto"]]
            print(f"{g} / auto: overall {ratios[0]:.3f}, the worst class {min(ratios[1:]):.3f}, the best "
                  f"{max(ratios[1:]):.3f}; within 2% of auto (>= 0.98) overall and on every class: "
                  f"{'yes' if min(ratios) >= 0.98 else 'no'}")


def ablate(args) -> None:
    """Leave-one-out from a base (the full policy, or the full policy less --base mechanisms): each mechanism of the
    base taken out in turn, and --drop (all of them together)."""
    costs = kept(args)
    data = load(args.records)
    rest = [m for m in present() if m not in args.base]
    variants = {"base": without(args.base), **{f"without {m}": without(args.base + [m]) for m in rest}}
    if args.drop:
        variants["without " + " + ".join(args.drop)] = without(args.base + args.drop)
    for tokens in args.tokens:
        res = {v: with_knobs(k[0], lambda k=k: per_prompt(data, "auto", tokens, args.seeds, costs, k))
               for v, k in variants.items()}
        base, base_cls = geometric_mean(res["base"].values()), by_class(res["base"])
        print(f"\n### {tokens} tokens, {len(data)} records; base: the full policy" +
              (f" without {', '.join(args.base)}" if args.base else "") +
              "\n\n| variant | x plain | removal costs | worst class (its loss) |\n|---|---|---|---|")
        for v in variants:
            m, cls = geometric_mean(res[v].values()), by_class(res[v])
            loss = {c: 1 - cls[c] / base_cls[c] for c in cls}
            worst = max(loss, key=loss.get)
            print(f"| {v} | {m:.3f} | {1 - m / base:+.1%} | {worst} ({loss[worst]:+.1%}) |")


def eliminate(args) -> None:
    """Backward elimination: from the full policy, take out the mechanism whose removal costs least, while that
    costs under 1% overall (at every length) and under 5% on every class; print every step."""
    costs, data = kept(args), load(args.records)

    def score(removed):
        v = without(removed)
        res = {t: with_knobs(v[0], lambda t=t: per_prompt(data, "auto", t, args.seeds, costs, v)) for t in args.tokens}
        return {t: (geometric_mean(r.values()), by_class(r)) for t, r in res.items()}

    removed, base = [], score([])
    print("full policy:", ", ".join(f"{t} tokens {m:.3f}x plain" for t, (m, _) in base.items()))
    while True:
        steps = []
        for m in (m for m in present() if m not in removed):
            got = score(removed + [m])
            loss = max(1 - got[t][0] / base[t][0] for t in got)
            cls = max(1 - got[t][1][c] / base[t][1][c] for t in got for c in got[t][1])
            steps.append((loss, cls, m, got))
            print(f"  without {m}: overall {loss:+.1%}, worst class {cls:+.1%}")
        ok = [st for st in steps if st[0] < 0.01 and st[1] < 0.05]
        if not ok:
            break
        loss, _, m, base = min(ok)
        removed.append(m)
        print(f"remove {m}:", ", ".join(f"{t} tokens {x:.3f}x plain" for t, (x, _) in base.items()))
    print("kept:", ", ".join(m for m in present() if m not in removed), "| removed:", ", ".join(removed))


def first(args) -> None:
    """What any choice at a row's first cycle could gain: the policy as it is against an oracle that, per prompt,
    forces the best of plain, the draft model at 1-8 and lookup at 1-4 at the first cycle (the rest as the policy)."""
    from mtpcli import policy

    costs, data = kept(args), load(args.records)
    plan = policy.AutoPolicy.plan
    for tokens in args.tokens:
        base = per_prompt(data, "auto", tokens, args.seeds, costs)
        best = dict(base)
        for forced in [(None, 0)] + [("model", k) for k in (1, 2, 3, 4, 8)] + [("ngram", k) for k in (1, 2, 4)]:
            def forcing(self, contexts, forced=forced):
                p = plan(self, contexts)
                if self.tick == 0:
                    return policy.Plan(*forced, self.stop("model") if forced[0] == "model" else None)
                return p
            policy.AutoPolicy.plan = forcing
            try:
                best = {k: max(v, x) for (k, v), x in zip(best.items(), per_prompt(data, "auto", tokens, args.seeds,
                                                                                     costs).values())}
            finally:
                policy.AutoPolicy.plan = plan
        print(f"{tokens} tokens: auto {geometric_mean(base.values()):.3f}x plain, with the best first cycle of each "
              f"prompt {geometric_mean(best.values()):.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("target")
    rec.add_argument("draft")
    rec.add_argument("out")
    rec.add_argument("files", nargs="+")
    rec.add_argument("--max-tokens", type=int, default=80)
    rec.add_argument("--temp", type=float, default=0.0)
    rec.add_argument("--batch", type=int, default=8)
    rec.add_argument("--seed", type=int, default=0)
    for cmd in ("compare", "ablate", "eliminate", "first"):
        sim = sub.add_parser(cmd)
        sim.add_argument("records", nargs="+")
        sim.add_argument("--costs", required=True, help="the kept cost table at T = 0 (JSON, as the run log keeps it)")
        sim.add_argument("--costs-sampled", help="the kept cost table for records drawn at T > 0 (default: --costs)")
        sim.add_argument("--concave", action="store_true", help="the tables read as the package reads one an earlier "
                         "version kept: a verification concave in its width, charged and decided by")
        sim.add_argument("--tokens", type=int, nargs="+", default=[40, 80])
        sim.add_argument("--seeds", type=int, default=8, help="records drawn at T > 0: their passes drawn this often")
        if cmd == "ablate":
            sim.add_argument("--base", nargs="*", default=[], choices=list(MECHANISMS), help="mechanisms left out")
            sim.add_argument("--drop", nargs="*", default=[], choices=list(MECHANISMS),
                             help="also: these left out together")
    args = ap.parse_args()
    {"record": record, "compare": compare, "ablate": ablate, "eliminate": eliminate, "first": first}[args.cmd](args)


if __name__ == "__main__":
    main()
