#!/usr/bin/env python3
"""Where a kept prefill can resume (issues 54 and 56), measured on this machine's backend: is a prefill's state the
same bit for bit however it is chunked (then a kept state could resume anywhere), and what a cold prefill costs a
token in chunks of each step (a kept state resumes on the step's grid: a finer one re-prefills fewer old tokens).

Bitwise: every layer's keys and values after N random tokens prefilled in chunks of 128, against the same tokens
chunked otherwise (CHUNKINGS). Cost: the first N tokens of the agent loop's first prompt (bench/agent_loop.py), cold,
in chunks of each --steps, interleaved, --rounds times. The BLAS is the one mtpcli loads (blas.load).

    python bench/prefill_chunks.py --model /root/.cache/mtpcli/models/qwen2.5-coder-1.5b --rounds 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from mtpcli import blas  # noqa: E402

blas.load(["generate"])  # (before MLX)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from agent_loop import prefix_text, transcript, QUESTIONS, PREFIX_FILE  # noqa: E402

CHUNKINGS = {  # name: the chunks' ends before N (the last chunk ends at N)
    "resume at 64 (a 64 grid's boundary)": [64, 192],
    "resume at 100": [100, 228],
    "resume at 200": [128, 200],
    "a chunk of 1 token": [128, 129],
    "chunks of 2, 3 (the start)": [2, 5, 133],
    "chunks of 2, 3, 5, 7": [128, 256, 258, 261, 266, 273],
    "one chunk of 300": [300],
}


def prefill(lm, tokens: list[int], ends: list[int]) -> list[np.ndarray]:
    """Each attention layer's keys and values after `tokens` fed in the chunks that end at `ends` (then len(tokens))."""
    from mtpcli.cache import RowKV

    layout, caches = lm._fresh(1, False)
    start = 0
    for end in [e for e in ends if e < len(tokens)] + [len(tokens)]:
        layout.begin(end - start, None)
        lm.parts[0](mx.array(tokens[start:end])[None], cache=caches)
        layout.end()
        mx.eval([c.state for c in caches if isinstance(c, RowKV)])
        start = end
    return [np.array(x[..., : len(tokens), :]) for c in caches if isinstance(c, RowKV) for x in (c.keys, c.values)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bitwise-tokens", type=int, default=320, help="0: the cost alone")
    ap.add_argument("--tokens", type=int, default=640, help="the cold prefill's length (the cost)")
    ap.add_argument("--steps", default="128,96,64")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from mlx_lm import load

    from mtpcli.cache import LM

    model, tok = load(args.model)
    mx.eval(model.parameters())
    print(f"BLAS {blas.loaded or 'reference'}, {mx.default_device()}", flush=True)
    if args.bitwise_tokens:
        lm = LM(model, prefill_step=128)
        tokens = [int(t) for t in np.random.default_rng(1).integers(0, 30000, args.bitwise_tokens)]
        ref = prefill(lm, tokens, list(range(128, len(tokens), 128)))
        for name, ends in CHUNKINGS.items():
            got = prefill(lm, tokens, ends)
            same = sum(np.array_equal(a, b) for a, b in zip(ref, got))
            diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, got))
            print(f"{name}: {'the same' if same == len(ref) else 'DIFFERENT'} ({same}/{len(ref)} arrays bit for bit, "
                  f"largest difference {diff:.3g})", flush=True)
    text = transcript(prefix_text(False, [PREFIX_FILE]), [], QUESTIONS[0], False)
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)[: args.tokens]
    steps = [int(s) for s in args.steps.split(",")]
    cost = {s: [] for s in steps}
    for r in range(args.rounds):
        for s in steps if r % 2 == 0 else steps[::-1]:  # interleaved, the order alternating
            lm = LM(model, prefill_step=s)
            lm.add_rows(1)
            t = time.perf_counter()
            lm.set_row(0, prompt)
            cost[s].append((time.perf_counter() - t) / len(prompt) * 1000)
    for s in steps if args.rounds else ():
        print(f"cold prefill of {len(prompt)} tokens in chunks of {s}: ms a token "
              f"{sorted(round(x, 2) for x in cost[s])}, median {np.median(cost[s]):.2f}", flush=True)


if __name__ == "__main__":
    main()
