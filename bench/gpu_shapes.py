"""Cycle cost on random weights of real shapes (for the lent GPU; --tiny runs it on a CPU in seconds).

Measures, at a 1,024-token context: target forward latency against the number of tokens verified, the
draft model's step, and the whole mtpcli cycle (draft + verify + host) against draft width for a draft
model and for a zero-cost proposer (the n-gram drafter's cost class); splits the cycle into draft,
verify and host time, and turns cycle times into tok/s for acceptance rates measured on the CPU.

  python bench/gpu_shapes.py --out result.json [--tiny] [--targets 1.5b,7b]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
from mlx.utils import tree_map

from mtpcli.controller import FixedWidth
from mtpcli.drafters import Draft, Drafter
from mtpcli.drafters.model import ModelDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli import cache as lm_module
from mtpcli.cache import LM

SHAPES = {  # Qwen2.5 configs (public config.json values)
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, intermediate_size=4864, num_attention_heads=14,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, intermediate_size=8960, num_attention_heads=12,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944, num_attention_heads=28,
               num_key_value_heads=4, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True),
}
CPU_ACCEPTANCE = {  # accept_by_position measured on the CPU with the real pair (docs/perf/cpu), per class
    "code T=0": [1.0, 1.0, 0.9, 0.7, 0.7, 0.6, 0.6, 0.5],
}


def model(name: str, vocab: int, dtype):
    from mlx_lm.models import qwen2

    args = qwen2.ModelArgs(model_type="qwen2", rms_norm_eps=1e-6, vocab_size=vocab, rope_theta=1e6,
                           max_position_embeddings=32768, **SHAPES[name])
    m = qwen2.Model(args)
    m.update(tree_map(lambda w: (w * 0.02).astype(dtype) if w.ndim > 1 else w.astype(dtype), m.parameters()))
    mx.eval(m.parameters())
    return m


def nbytes(m) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(m.parameters()))


def median_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def forward_latency(m, ctx: int, ns, reps: int) -> dict[int, float]:
    lm = LM(m)
    lm.add_rows(1)
    lm.set_row(0, list(range(1, ctx + 1)))
    out = {}
    for n in ns:
        toks = (mx.arange(n, dtype=mx.int32) + 5)[None]

        def step():
            mx.eval(lm.forward(toks))
            lm.truncate(lm.pos * 0 + ctx)
        out[n] = median_time(step, reps)
    return out


class FixedProposer(Drafter):
    """A zero-cost proposer (like n-gram lookup): always proposes k known tokens per row."""

    name = "fixed"

    def propose(self, contexts, caps, sp, keys, plan=None):
        return Draft(mx.full((len(contexts), max(caps)), 7, mx.int32), None, list(caps), list(caps))


def cycle_time(target, drafter, width: int, ctx: int, cycles: int, prompt: list[int] | None = None) -> float:
    eng = Engine(target, drafter, FixedWidth(width), (), DecodeConfig())
    gen = eng.generate([Request(0, prompt or list(range(1, ctx + 1)), 10**6, 0)])
    for _ in range(3):  # warm
        next(gen)
    t = time.perf_counter()
    for _ in range(cycles):
        next(gen)
    return (time.perf_counter() - t) / cycles


def expected_tokens(acc: list[float], k: int) -> float:
    """Tokens per cycle for conditional acceptance by position: 1 + sum_i prod_{j<=i} a_j."""
    total, run = 1.0, 1.0
    for a in acc[:k]:
        run *= a
        total += run
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--targets", default="1.5b,7b")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--cycles", type=int, default=12)
    a = ap.parse_args()
    dtype = mx.float32 if a.tiny else mx.bfloat16
    vocab = 1000 if a.tiny else 151936
    targets = ["tiny"] if a.tiny else a.targets.split(",")
    draft_name = "tiny" if a.tiny else "0.5b"
    res = {"device": str(mx.default_device()), "mlx": mx.__version__, "ctx": a.ctx, "targets": {}}
    x = mx.random.normal((256 * 2**20,)).astype(mx.bfloat16)  # 512 MiB
    mx.eval(x)
    t = median_time(lambda x=x: mx.eval(x * 2), 10)  # (x is deleted below)
    res["bandwidth_GBps"] = 2 * x.nbytes / t / 1e9
    del x
    draft = model(draft_name, vocab, dtype)
    res["draft"] = {"shape": draft_name, "weight_bytes": nbytes(draft),
                    "step_s": forward_latency(draft, a.ctx, [1], a.reps)[1]}
    widths = [0, 1, 2, 4, 8]
    for name in targets:
        m = model(name, vocab, dtype)
        r = {"weight_bytes": nbytes(m), "bound_s": nbytes(m) / (res["bandwidth_GBps"] * 1e9),
             "forward_s": forward_latency(m, a.ctx, sorted({1, 2, 4, 8, 16} | {k + 1 for k in widths}), a.reps)}
        for label, bucketed in (("before", False), ("after", True)):  # plain KV cache, then bucketed
            lm_module.BUCKETED_DEFAULT = bucketed
            r[f"cycle_zero_cost_s_{label}"] = {k: cycle_time(m, FixedProposer(), k, a.ctx, a.cycles) for k in widths}
            r[f"cycle_draft_model_s_{label}"] = {k: cycle_time(m, ModelDrafter(draft), k, a.ctx, a.cycles)
                                                for k in widths[1:]}
            # a host sync after every draft step (what a confidence floor needs) against one sync per cycle
            r[f"cycle_draft_model_sync_each_step_s_{label}"] = {
                k: cycle_time(m, ModelDrafter(draft, p_min=1e-9), k, a.ctx, a.cycles) for k in (2, 4)}
        lm_module.BUCKETED_DEFAULT = None
        r["cycle_zero_cost_s"] = r["cycle_zero_cost_s_after"]
        r["cycle_draft_model_s"] = r["cycle_draft_model_s_after"]
        # split: draft = k draft steps, verify = forward over k+1 tokens, host = the rest of the cycle
        r["split"] = {k: {"draft_s": k * res["draft"]["step_s"], "verify_s": r["forward_s"].get(k + 1) or None,
                          "cycle_s": r["cycle_draft_model_s"][k]} for k in (1, 4) if (k + 1) in r["forward_s"]}
        for k, s in r["split"].items():
            s["host_s"] = s["cycle_s"] - s["draft_s"] - s["verify_s"]
        plain = r["cycle_zero_cost_s"][0]
        r["tok_s"] = {}
        for cls, acc in CPU_ACCEPTANCE.items():
            rows = {}
            for k in widths[1:]:
                e = expected_tokens(acc, k)
                rows[k] = {"tokens_per_cycle": e, "zero_cost_tok_s": e / r["cycle_zero_cost_s"][k],
                           "draft_model_tok_s": e / r["cycle_draft_model_s"][k]}
            r["tok_s"][cls] = {"plain_tok_s": 1 / plain, "by_width": rows}
        res["targets"][name] = r
        del m
        print(json.dumps({name: {k: v for k, v in r.items() if k.startswith(("forward", "cycle", "split"))}}),
              flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
