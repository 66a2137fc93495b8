"""A target sharded over the GPUs of one host (tensor mode, NCCL) against the same target on one GPU: plain decoding
and speculation with a zero-cost proposer, on random weights of real shapes (Qwen2.5 7B and 32B, bf16).

Random weights agree with nothing, so acceptance is set, not measured (as in bench/gpu_auto.py): plain decoding runs
first and its greedy output is the oracle; the proposer offers the oracle's continuation with its first error at a
position drawn from the code T=0 acceptance profile of docs/perf/gpu.md (1.0, 1.0, 0.9, 0.7, 0.7, 0.6, 0.6, 0.5),
deterministically per output position, so every arm and every run sees the same acceptance. It costs nothing, like
n-gram lookup. Rank 0 drafts and judges; the other ranks verify; one message per cycle
(mtpcli.distributed.sharded.Peer, every wait watched by distributed.data.watched) - the same code
`mtpcli generate --distributed tensor` runs.

Self-checks (the exit status is 1 when one fails, and the JSON says which): all_sum is right; speculative output equals
plain output token for token (greedy); every rank committed the same tokens as rank 0.

  2 GPUs:  python3 -c "from mlx._distributed_utils.launch import main; main()" -n 2 --backend nccl \\
               --python python3 bench/gpu_distributed.py --json two.json
  1 GPU:   python3 bench/gpu_distributed.py --json one.json
  table:   python3 bench/gpu_distributed.py --table one.json two.json
  CPU:     mtpcli launch -n 2 --backend ring -- python bench/gpu_distributed.py --tiny --json t.json   (the logic only)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib
from pathlib import Path

PROFILE = [1.0, 1.0, 0.9, 0.7, 0.7, 0.6, 0.6, 0.5]  # docs/perf/gpu.md: CPU-measured code T=0, by draft position
SHAPES = {  # Qwen2.5 configs (public config.json values)
    "7b": dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944, num_attention_heads=28,
               num_key_value_heads=4, tie_word_embeddings=False),
    "32b": dict(hidden_size=5120, num_hidden_layers=64, intermediate_size=27648, num_attention_heads=40,
                num_key_value_heads=8, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=False),
}


def build(shape: str, vocab: int, dtype, group):
    """Random weights (the same on every rank: one seed, one order), sharded before they exist in full."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.models import qwen2

    mx.random.seed(0)
    args = qwen2.ModelArgs(model_type="qwen2", rms_norm_eps=1e-6, vocab_size=vocab, rope_theta=1e6,
                           max_position_embeddings=32768, **SHAPES[shape])
    m = qwen2.Model(args)
    m.update(tree_map(lambda w: (w * 0.02).astype(dtype) if w.ndim > 1 else w.astype(dtype), m.parameters()))
    if group is not None:
        m.shard(group)
    for layer in m.model.layers:  # one layer at a time: the float32 draws of a 32B model would not fit at once
        mx.eval(layer.parameters())
    mx.eval(m.parameters())
    return m


def oracle_proposer(oracle: list[int], prompt_len: int):
    """Zero-cost drafts: the oracle's continuation, wrong from a position drawn from PROFILE (a Drafter, whose class
    is made here: mtpcli and MLX are imported only once a run needs them, so --table runs anywhere)."""
    import mlx.core as mx
    import numpy as np

    from mtpcli.drafters import Draft, Drafter

    class OracleProposer(Drafter):
        name = "oracle"

        def _first_error(self, at: int) -> int:
            rng = np.random.default_rng([zlib.crc32(b"code"), at])
            return next((i for i, a in enumerate(PROFILE) if rng.random() >= a), len(PROFILE))

        def propose(self, contexts, caps, sp, keys, plan=None):
            rows = []
            for c, k in zip(contexts, caps):
                at = len(c) - prompt_len
                good = (oracle[at: at + k] + [0] * k)[:k]
                bad = self._first_error(at)
                rows.append([t if i < bad else (t + 1) % 1000 for i, t in enumerate(good)])
            return Draft(mx.array(rows, dtype=mx.int32), None, list(caps), list(caps))

    return OracleProposer()


def decode(model, dist, width: int, oracle, prompt, tokens: int):
    """One greedy run; (tokens, stats, decode seconds, our collective seconds, messages)."""
    from mtpcli.controller import FixedWidth
    from mtpcli.distributed.data import watched
    from mtpcli.distributed.sharded import Follower, Peer
    from mtpcli.engine import DecodeConfig, Engine, Request

    cfg = DecodeConfig()
    root = dist is None or dist.root
    if root:
        drafter = oracle_proposer(oracle, len(prompt)) if width else None
        engine = Engine(model, drafter, FixedWidth(width), (), cfg)
    else:
        engine = Engine(model, Follower(bool(width), False), FixedWidth(0), (), cfg)
    before = (0.0, 0)
    if dist is not None:
        engine.peer = Peer(dist, 1, max(width, 1), bool(width), ["oracle"])
        before = (dist.collective_s, dist.messages)
    out, t0 = [], time.perf_counter()
    requests = [Request(0, prompt, tokens, 0)]
    for ev in engine.generate(requests) if dist is None else watched(dist, engine, requests):
        out.extend(ev.tokens)
    wall = time.perf_counter() - t0 - engine.stats.prefill_s
    coll = (dist.collective_s - before[0], dist.messages - before[1]) if dist is not None else (0.0, 0)
    return out, engine.stats, wall, coll


def allsum_us(dist, n: int, dtype, reps: int = 200) -> float:
    import mlx.core as mx

    x = mx.ones((1, n), dtype)
    for _ in range(10):
        mx.eval(mx.distributed.all_sum(x, group=dist.group))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(mx.distributed.all_sum(x, group=dist.group))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def group():
    """The group under a launcher (a Group as mtpcli's tensor mode makes it, the other ranks'
    output not silenced), else None (one device)."""
    import mlx.core as mx

    from mtpcli.distributed.group import Group, Watchdog, backend_name, launched

    if not launched():
        return None
    g = mx.distributed.init()
    if g.size() == 1:
        return None
    d = Group("tensor", g, g.rank(), g.size(), backend_name(), 600.0)
    d.watchdog = Watchdog(d.timeout, d.rank)
    return d


def main(a) -> int:
    import mlx.core as mx

    dist = group()
    root = dist is None or dist.root
    say = (lambda *x: print(*x, flush=True)) if root else (lambda *x: None)
    dtype = mx.float32 if a.tiny else mx.bfloat16
    vocab = 1000 if a.tiny else 152064
    shapes = ["tiny"] if a.tiny else a.shapes.split(",")
    widths = [int(w) for w in a.widths.split(",")]
    res = {"device": str(mx.default_device()), "mlx": mx.__version__, "ranks": dist.size if dist else 1,
           "backend": dist.backend if dist else "none", "tokens": a.tokens, "profile": PROFILE, "checks": {},
           "shapes": {}}
    failed = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        res["checks"][name] = {"ok": bool(ok), "detail": detail}
        say(f"check {name}: {'ok' if ok else 'FAILED'} {detail}")
        if not ok:
            failed.append(name)

    if dist is not None:
        got = mx.distributed.all_sum(mx.array([dist.rank + 1.0, 1.0]), group=dist.group).tolist()
        want = [sum(range(1, dist.size + 1)), float(dist.size)]
        check("all_sum", got == want, f"{got} (want {want})")
        res["allsum_us"] = {"int32 x 1 (a message)": allsum_us(dist, 1, mx.int32)}
        for s in shapes:
            h = SHAPES[s]["hidden_size"]
            res["allsum_us"][f"{dtype} x {h} (one token's hidden state, {s})"] = allsum_us(dist, h, dtype)
        say("all_sum us (median of 200):", json.dumps(res["allsum_us"]))
        if a.allsum_only:
            us = allsum_us(dist, 1536, mx.float32)  # (every rank takes part)
            if a.json and root:  # for bench/cpu_distributed.sh: the Qwen2.5-1.5B hidden state, float32, 56 per pass
                Path(a.json).write_text(json.dumps({"size": dist.size, "backend": dist.backend, "hidden": 1536,
                                                    "allsum_us": us, "per_pass": 56}))
            return 0
    prompt = [(7 * i) % (vocab - 1) + 1 for i in range(a.prompt)]
    for s in shapes:
        t = time.perf_counter()
        model = build(s, vocab, dtype, dist.group if dist else None)
        say(f"== {s}: built in {time.perf_counter() - t:.1f} s; peak memory {mx.get_peak_memory() / 2**30:.1f} GiB")
        from mtpcli.distributed.sharded import collectives_per_pass

        r = res["shapes"][s] = {"model_collectives_per_pass": collectives_per_pass(model, "tensor") if dist else 0,
                                "arms": {}}
        oracle, _, _, _ = decode(model, dist, 0, None, prompt, a.tokens + 16)  # (also the warm-up)
        for rep in range(a.repeats):
            for w in [0] + widths:
                name = "plain" if w == 0 else f"spec-{w}"
                out, st, wall, (coll, msgs) = decode(model, dist, w, oracle, prompt, a.tokens)
                arm = r["arms"].setdefault(name, {"tok_s": [], "tokens_per_cycle": [], "cycle_ms": [],
                                                  "message_ms_per_cycle": []})
                arm["tok_s"].append(len(out) / wall)
                arm["tokens_per_cycle"].append(st.tokens_per_cycle)
                arm["cycle_ms"].append(1e3 * wall / max(st.cycles, 1))
                arm["message_ms_per_cycle"].append(1e3 * coll / max(st.cycles, 1) if w else None)
                if rep == 0:
                    same = out == oracle[: a.tokens]
                    first = next((i for i, (x, y) in enumerate(zip(out, oracle)) if x != y), None)
                    check(f"{s} {name}: output equals plain decoding", same, "" if same else f"first diff at {first}")
                    if dist is not None:  # every rank committed rank 0's tokens
                        mine = mx.array(out + [0] * (a.tokens - len(out)), mx.int32)
                        every = mx.distributed.all_gather(mine[None], group=dist.group).tolist()
                        check(f"{s} {name}: every rank committed rank 0's tokens",
                              all(x == every[0] for x in every))
                say(f"{s} rep {rep} {name:8s} {len(out) / wall:8.1f} tok/s  {st.tokens_per_cycle:.2f} tok/cycle  "
                    f"{1e3 * wall / max(st.cycles, 1):.2f} ms/cycle")
        del model
        mx.clear_cache()
    res["failed_checks"] = failed
    if a.json and root:
        Path(a.json).write_text(json.dumps(res, indent=1))
    say(table([res]))
    return 1 if failed else 0


def table(results: list[dict]) -> str:
    """Median tok/s per shape and arm, for each result (1 GPU, 2 GPUs...), and the ratio of each to the first."""
    lines = []
    shapes = [s for s in results[0]["shapes"]]
    head = ["shape", "arm"] + [f"{r['ranks']} rank(s) tok/s" for r in results] + \
        [f"ratio {r['ranks']}/{results[0]['ranks']}" for r in results[1:]] + ["tokens/cycle", "ms/cycle (last)",
                                                                            "message ms/cycle (last)"]
    lines.append(" | ".join(head))
    lines.append("|".join(["---"] * len(head)))
    for s in shapes:
        for arm in results[0]["shapes"][s]["arms"]:
            med = [statistics.median(r["shapes"][s]["arms"][arm]["tok_s"]) if s in r["shapes"] else float("nan")
                   for r in results]
            last = results[-1]["shapes"].get(s, {}).get("arms", {}).get(arm, {})
            msg = [x for x in last.get("message_ms_per_cycle", []) if x is not None]
            lines.append(" | ".join([s, arm] + [f"{x:.1f}" for x in med] + [f"{x / med[0]:.2f}" for x in med[1:]] +
                                    [f"{statistics.median(last.get('tokens_per_cycle', [0])):.2f}",
                                     f"{statistics.median(last.get('cycle_ms', [0])):.2f}",
                                     f"{statistics.median(msg):.3f}" if msg else "-"]))
    for r in results:
        bad = r.get("failed_checks")
        lines.append(f"{r['ranks']} rank(s), {r['backend']}, {r['device']}: checks "
                     f"{'all ok' if not bad else 'FAILED: ' + ', '.join(bad)}"
                     + (f"; all_sum us {json.dumps(r['allsum_us'])}" if r.get("allsum_us") else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the result here (rank 0)")
    ap.add_argument("--tiny", action="store_true", help="tiny float32 shapes: checks the logic on a CPU")
    ap.add_argument("--shapes", default="7b,32b")
    ap.add_argument("--widths", default="4,8", help="draft widths of the speculative arms")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--allsum-only", action="store_true", help="only the all_sum latencies")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table of earlier results and exit")
    a = ap.parse_args()
    if a.table:
        print(table([json.loads(Path(p).read_text()) for p in a.table]))
        sys.exit(0)
    sys.exit(main(a))
