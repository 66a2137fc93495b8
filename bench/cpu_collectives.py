"""What a tensor-sharded target's own collectives cost per verify pass: the same pass (1 token, and 5 = a width-4
draft plus the bonus) timed as it is and with shard_linear's all_sum skipped (wrong numbers, the same compute), on
every rank at once, back to back; the difference is the time in the model's collectives.

  mtpcli launch -n 2 --backend ring -- python bench/cpu_collectives.py MODEL [--json OUT] [--reps 9]
"""

import argparse
import json
import statistics
import time

import mlx.core as mx
from mlx.nn.layers.distributed import ShardedToAllLinear

from mtpcli.cache import LM
from mtpcli.distributed import group, sharded


def skip(self, x):  # ShardedToAllLinear without its all_sum
    x = x @ self["weight"].T
    return x + self["bias"] if "bias" in self else x


def timed(lm, n: int, reps: int, ctx: int) -> tuple[float, float]:
    """Median seconds of a pass with and without the collectives, alternated (after one warm-up of each)."""
    toks = (mx.arange(n, dtype=mx.int32) + 100)[None]
    call, ts = ShardedToAllLinear.__call__, {True: [], False: []}
    for _ in range(reps + 1):
        for real in (True, False):
            ShardedToAllLinear.__call__ = call if real else skip
            t = time.perf_counter()
            mx.eval(lm.forward(toks))
            ts[real].append(time.perf_counter() - t)
            lm.truncate(lm.pos * 0 + ctx)
    ShardedToAllLinear.__call__ = call
    return statistics.median(ts[True][1:]), statistics.median(ts[False][1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--ctx", type=int, default=64)
    a = ap.parse_args()
    g = mx.distributed.init()
    loaded = sharded.load_target(a.model, "tensor", g)
    per_pass = sharded.collectives_per_pass(loaded.model, "tensor")
    lm = LM(loaded.model)
    lm.add_rows(1)
    lm.set_row(0, list(range(1, a.ctx + 1)))
    res = {"ranks": g.size(), "backend": group.backend_name(), "collectives_per_pass": per_pass, "passes": {}}
    for n in (1, 5):
        with_s, without_s = timed(lm, n, a.reps, a.ctx)
        with_ms, without_ms = 1e3 * with_s, 1e3 * without_s
        res["passes"][n] = {"pass_ms": with_ms, "without_collectives_ms": without_ms,
                            "collectives_ms": with_ms - without_ms,
                            "per_collective_us": 1e3 * (with_ms - without_ms) / per_pass}
    if g.rank() == 0:
        print(json.dumps(res, indent=1))
        if a.json:
            open(a.json, "w").write(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
