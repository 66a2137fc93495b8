"""How well the history drafter's per-token estimate predicts acceptance, without a model: greedy acceptance of a
deterministic draft is "the draft token is the next token", so real text stands in for the target's output. The
tuning set is NOT the benchmark's prompts: this Python's own standard library (code: many modules, shared idioms)
and the licence and README texts under /usr/share/doc (prose), tokenized with the Qwen2.5 tokenizer. Earlier
"answers" fill the store; later ones are drafted for, every `--step` tokens, and each drafted position (reached:
all before it right) records the estimate and whether it was right.

    python bench/history_calibrate.py ~/.cache/mtpcli/models/qwen2.5-coder-0.5b [--pseudo 1 4 8 16] [--power 1 1.5 2]
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from mtpcli.drafters import history as hd  # noqa: E402
from mtpcli.history import Doc, Store  # noqa: E402


def texts(kind: str, rng: random.Random) -> list[str]:
    if kind == "code":
        files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    else:
        files = sorted(glob.glob("/usr/share/doc/*/README*") + glob.glob("/usr/share/common-licenses/*"))
    rng.shuffle(files)
    out = []
    for f in files[:80]:
        try:
            out.append(open(f, errors="ignore").read()[:6000])
        except OSError:
            pass
    return out


def answers(tok, kind: str, rng, size: int = 96) -> list[list[int]]:
    docs = []
    for t in texts(kind, rng):
        ids = tok.encode(t)
        for i in range(0, len(ids) - size, size * 3):  # a few pieces a file, apart
            docs.append(ids[i:i + size])
    rng.shuffle(docs)
    return docs


def measure(store_docs, queries, step: int, k: int = 16):
    store = Store("t")
    store.docs = [Doc(np.array(d, np.int64), None) for d in store_docs]
    rows = []  # (estimate, right, depth, match len proxy)
    for q in queries:
        d = hd.HistoryDrafter(store)
        d.add_rows(1)
        d.start(0, [0])
        for t in range(0, len(q) - 1, step):
            draft, probs = d.look(0, [0] + q[:t], k)
            for i, (tok, p) in enumerate(zip(draft, probs)):
                right = t + i < len(q) and q[t + i] == tok
                rows.append((p, right, i))
                if not right:
                    break
    return np.array(rows, float)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--pseudo", type=float, nargs="+", default=[1, 4, hd.PSEUDO, 16])
    ap.add_argument("--power", type=float, nargs="+", default=[1.0, hd.POWER, 2.0])
    ap.add_argument("--step", type=int, default=3)
    a = ap.parse_args()
    from mlx_lm.utils import load_tokenizer
    from pathlib import Path
    tok = load_tokenizer(Path(a.model))
    rng = random.Random(0)
    sets = {}
    for kind in ("code", "prose"):
        docs = answers(tok, kind, rng)
        half = len(docs) // 2
        sets[kind] = (docs[:half], docs[half:half + 40])
    # the novel control: prose drafted from a store of code (and code's own idioms)
    sets["prose-from-code"] = (sets["code"][0], sets["prose"][1])
    bins = [0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.01]
    for c in a.pseudo:
        for pw in a.power:
            hd.PSEUDO, hd.POWER = c, pw
            print(f"pseudo-count {c}/m^{pw}")
            for name, (st, qs) in sets.items():
                r = measure(st, qs, a.step)
                if not len(r):
                    print(f"  {name}: no drafts")
                    continue
                p, y = r[:, 0], r[:, 1]
                ll = -np.mean(y * np.log(np.clip(p, 1e-6, 1)) + (1 - y) * np.log(np.clip(1 - p, 1e-6, 1)))
                cells = []
                for lo, hi in zip(bins, bins[1:]):
                    m = (p >= lo) & (p < hi)
                    if m.sum():
                        cells.append(f"[{lo:.1f},{hi:.1f}) {int(m.sum())}: est {p[m].mean():.2f} got {y[m].mean():.2f}")
                print(f"  {name}: drafted {len(r)}, right {int(y.sum())}, log loss {ll:.3f}, est {p.sum():.0f}")
                for cell in cells:
                    print("     ", cell)


if __name__ == "__main__":
    main()
