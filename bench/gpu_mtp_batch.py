"""Cost per cycle of the newer draft sources and of batching, on random weights of real shapes.

1. At the 7B shape (Qwen2.5-7B dims): plain decoding, the n-gram drafter (real lookup over the context), a
   zero-cost proposer, and a 1-layer MTP head (a full-attention decoder layer of the target's width, its own
   KV cache, the target's LM head) against draft width. Random weights give arbitrary acceptance, so tok/s
   come from the cycle times and an assumed acceptance by position (stated in the output).
2. Batches of 1, 4 and 16 rows: cycle time of plain decoding and of speculation with a zero-cost proposer
   (width 4) through the batched engine; throughput = rows x tokens per cycle / cycle time.

  python bench/gpu_mtp_batch.py --out result.json [--tiny] [--target 7b]
"""

from __future__ import annotations

import argparse
import json
import time

import mlx.core as mx
from mlx.utils import tree_map

from gpu_shapes import CPU_ACCEPTANCE, SHAPES, FixedProposer, cycle_time, expected_tokens, model
from mtpcli.controller import FixedWidth
from mtpcli.drafters.mtp import MtpDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.mtp import MtpHead

MTP_ACCEPTANCE = [0.85, 0.7, 0.6, 0.5]  # assumed conditional acceptance by depth (DeepSeek-V3 reports 85-90% at depth 1)


def mtp_head(shape: str, dtype):
    from mlx_lm.models import qwen2

    cfg = SHAPES[shape]
    args = qwen2.ModelArgs(model_type="qwen2", rms_norm_eps=1e-6, vocab_size=1, rope_theta=1e6,
                           max_position_embeddings=32768, **cfg)
    head = MtpHead("qwen", cfg["hidden_size"], 1e-6, qwen2.TransformerBlock(args), None)
    head.update(tree_map(lambda w: (w * 0.02).astype(dtype) if w.ndim > 1 else w.astype(dtype), head.parameters()))
    mx.eval(head.parameters())
    return head


def batch_cycle(target, rows: int, width: int, ctx: int, cycles: int) -> float:
    drafter = FixedProposer() if width else None
    eng = Engine(target, drafter, FixedWidth(width), (), DecodeConfig(), batch_size=rows)
    reqs = [Request(i, [(i * 31 + j) % 1000 + 1 for j in range(ctx)], 10**6, i) for i in range(rows)]
    events = eng.generate(reqs)
    while eng.cycles < 3:  # warm
        next(events)
    start, t = eng.cycles, time.perf_counter()
    while eng.cycles < start + cycles:
        next(events)
    return (time.perf_counter() - t) / (eng.cycles - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--target", default="7b")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--cycles", type=int, default=12)
    a = ap.parse_args()
    dtype = mx.float32 if a.tiny else mx.bfloat16
    vocab = 1000 if a.tiny else 151936
    shape = "tiny" if a.tiny else a.target
    m = model(shape, vocab, dtype)
    res = {"device": str(mx.default_device()), "mlx": mx.__version__, "shape": shape, "ctx": a.ctx}
    widths = [1, 2, 4]
    cyc = {"plain": {0: cycle_time(m, None, 0, a.ctx, a.cycles)}}
    prompt = [(j % 50) + 1 for j in range(a.ctx)]  # periodic: the n-gram drafter always finds a match
    cyc["zero_cost"] = {k: cycle_time(m, FixedProposer(), k, a.ctx, a.cycles) for k in widths}
    cyc["ngram"] = {k: cycle_time(m, NgramDrafter(2, 4), k, a.ctx, a.cycles, prompt) for k in widths}
    head = mtp_head(shape, dtype)
    cyc["mtp_1_layer"] = {k: cycle_time(m, MtpDrafter(head, m), k, a.ctx, a.cycles) for k in widths}
    res["cycle_s"] = cyc
    plain = cyc["plain"][0]
    res["tok_s"] = {}
    for label, acc in (("code T=0 (CPU-measured, n-gram/zero-cost)", CPU_ACCEPTANCE["code T=0"]),
                       ("assumed MTP acceptance " + str(MTP_ACCEPTANCE), MTP_ACCEPTANCE)):
        res["tok_s"][label] = {arm: {k: expected_tokens(acc, k) / cyc[arm][k] for k in widths}
                               for arm in ("zero_cost", "ngram", "mtp_1_layer")}
        res["tok_s"][label]["plain"] = 1 / plain
    print(json.dumps({"cycle_s": cyc}), flush=True)

    bctx = min(a.ctx, 512)
    res["batch"] = {"ctx": bctx, "width": 4, "rows": {}}
    for rows in (1, 4, 16):
        p = batch_cycle(m, rows, 0, bctx, a.cycles)
        s = batch_cycle(m, rows, 4, bctx, a.cycles)
        e = expected_tokens(CPU_ACCEPTANCE["code T=0"], 4)
        res["batch"]["rows"][rows] = {"plain_cycle_s": p, "spec_cycle_s": s, "plain_tok_s": rows / p,
                                      "spec_tok_s": rows * e / s, "tokens_per_cycle_per_row": e}
        print(json.dumps({rows: res["batch"]["rows"][rows]}), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
