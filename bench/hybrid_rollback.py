"""What a rejected cycle costs a recurrent/hybrid target: snapshot, verify, restore and replay.

Random Qwen3-Next-style hybrid (gated-delta layers between attention layers), CPU float32 or GPU bf16.
Compares one verify pass over k+1 tokens that is fully accepted (no rollback) with one that is rejected
after `a` drafts (restore the snapshot, replay a+1 tokens).

  python bench/hybrid_rollback.py [--hidden 1024 --layers 8 --k 4 --reps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
from mlx.utils import tree_map

from mtpcli.cache import LM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    from mlx_lm.models import qwen3_next

    h = a.hidden
    cfg = dict(model_type="qwen3_next", hidden_size=h, num_hidden_layers=a.layers, intermediate_size=3 * h,
               num_attention_heads=h // 128, num_key_value_heads=2, head_dim=128, linear_num_value_heads=h // 128,
               linear_num_key_heads=h // 256, linear_key_head_dim=128, linear_value_head_dim=128,
               linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
               shared_expert_intermediate_size=h, mlp_only_layers=list(range(a.layers)), moe_intermediate_size=h,
               rms_norm_eps=1e-6, vocab_size=32000, rope_theta=1e6, partial_rotary_factor=0.25,
               max_position_embeddings=4096, full_attention_interval=4)
    model = qwen3_next.Model(qwen3_next.ModelArgs.from_dict(cfg))
    model.update(tree_map(lambda w: w * 0.02 if w.ndim > 1 else w, model.parameters()))
    lm = LM(model)
    lm.add_rows(1)
    lm.set_row(0, list(range(1, a.ctx)), keep=True)
    toks = (mx.arange(a.k + 1, dtype=mx.int32) + 3)[None]

    def cycle(accepted: int):
        lm.checkpoint()
        mx.eval(lm.forward(toks))
        lm.truncate(lm.pos - a.k + accepted)
        mx.eval([getattr(c, "state", []) for c in lm.caches])
        lm.set_row(0, list(range(1, a.ctx)), keep=True)  # back to the prompt for the next repetition (prefix reuse)

    out = {}
    for accepted in (a.k, 0, a.k // 2):
        cycle(accepted)
        ts = []
        for _ in range(a.reps):
            t = time.perf_counter()
            cycle(accepted)
            ts.append(time.perf_counter() - t)
        out[accepted] = statistics.median(ts)
    full = out[a.k]
    print(f"device={mx.default_device()} hidden={h} layers={a.layers} k={a.k}")
    print(f"full accept (no rollback): {full * 1e3:.1f} ms")
    for acc in (0, a.k // 2):
        print(f"rejected after {acc} drafts (restore + replay {acc + 1} tokens): {out[acc] * 1e3:.1f} ms "
              f"(+{(out[acc] - full) * 1e3:.1f} ms, {out[acc] / full:.2f}x)")


if __name__ == "__main__":
    main()
