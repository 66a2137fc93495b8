"""How well the n-gram drafter's per-token estimate predicts acceptance, without a model: greedy acceptance of a
deterministic draft is "the draft token is the next token", so real text stands in for the target's output. The
tuning set is NOT the benchmark's prompts: this Python's standard library (code) and the licence and README texts
under /usr/share/doc (prose), tokenized with the Qwen2.5 tokenizer (bench/history_calibrate.texts). In each document
(400-800 tokens), every `--step` tokens from the 64th, the real NgramDrafter index drafts up to 8 tokens from the text
so far; each reached position (all before it right) records the true match length m, its depth d and whether it was
right. The estimate 1 / (1 + pseudo / (m + d) ** power) is then scored for each pair of constants.

    python bench/ngram_calibrate.py ~/.cache/mtpcli/models/qwen2.5-coder-0.5b [--pseudo 2 4 8 16] [--power 1 1.5 2]
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
from history_calibrate import texts  # noqa: E402
from mtpcli.drafters import ngram  # noqa: E402

BINS = [0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.01]


def documents(tok, kind: str, rng, lo: int = 400, hi: int = 800) -> list[list[int]]:
    docs = []
    for t in texts(kind, rng):
        ids = tok.encode(t)
        for i in range(0, len(ids) - lo + 1, hi):
            docs.append(ids[i:i + hi])
    return docs


def measure(docs, n_min: int, n_max: int, step: int, k: int = 8) -> np.ndarray:
    """Rows (m, d, right) for every reached draft position."""
    rows = []
    for q in docs:
        ix = ngram.Index(n_min, n_max)
        for t in range(64, len(q) - 1, step):
            found = ix.find(q[:t])
            if found is None:
                continue
            end, m = found
            for d, tok in enumerate(q[end:min(end + k, t)]):  # the draft: what Index.look gives
                right = t + d < len(q) and q[t + d] == tok
                rows.append((m, d, right))
                if not right:
                    break
    return np.array(rows, float)


def estimate(r: np.ndarray, pseudo: float, power: float) -> np.ndarray:
    return 1.0 / (1.0 + pseudo / (r[:, 0] + r[:, 1]) ** power)


def log_loss(p, y) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--pseudo", type=float, nargs="+", default=[1, 2, 4, 8, 10, 16, 32, 64])
    ap.add_argument("--power", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0, 3.0])
    ap.add_argument("--step", type=int, default=3)
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--ngram-max", type=int, default=4)
    a = ap.parse_args()
    from pathlib import Path

    from mlx_lm.utils import load_tokenizer
    tok = load_tokenizer(Path(a.model))
    rng = random.Random(0)
    sets = {kind: measure(documents(tok, kind, rng), a.ngram_min, a.ngram_max, a.step) for kind in ("code", "prose")}

    print("right by true match length m and depth d (reached positions: right/reached)")
    groups = [(2, 2), (3, 3), (4, 4), (5, 6), (7, 9), (10, 15), (16, 31), (32, 99)]
    for name, r in sets.items():
        print(f"  {name}: {len(r)} reached, {int(r[:, 2].sum())} right")
        for lo, hi in groups:
            cells = []
            for d in (0, 1, 2, 4, 7):
                s = (r[:, 0] >= lo) & (r[:, 0] <= hi) & (r[:, 1] == d)
                cells.append(f"d={d} {r[s, 2].mean():.2f}/{int(s.sum()):<5d}" if s.sum() else f"d={d} -/0       ")
            print(f"    m {lo:>2}-{hi:<2}  " + "  ".join(cells))

    print("\ngrid: sum of estimates / sum right (log loss), per set")
    for c in a.pseudo:
        for pw in a.power:
            cells = []
            for name, r in sets.items():
                p, y = estimate(r, c, pw), r[:, 2]
                cells.append(f"{name} {p.sum():7.0f}/{y.sum():<6.0f} ({log_loss(p, y):.3f})")
            print(f"  pseudo {c:>4g} power {pw:>3g}:  " + "   ".join(cells))

    print(f"\nchosen: ngram.PSEUDO {ngram.PSEUDO:g}, ngram.POWER {ngram.POWER:g}; per estimate bin, estimated vs right")
    for name, r in sets.items():
        p, y = estimate(r, ngram.PSEUDO, ngram.POWER), r[:, 2]
        print(f"  {name}: reached {len(r)}, right {int(y.sum())}, sum of estimates {p.sum():.0f}, "
              f"log loss {log_loss(p, y):.3f}")
        for lo, hi in zip(BINS, BINS[1:]):
            s = (p >= lo) & (p < hi)
            if s.sum():
                print(f"      [{lo:.1f},{hi:.1f}) {int(s.sum()):6d}: est {p[s].mean():.2f} right {y[s].mean():.2f}")


if __name__ == "__main__":
    main()
