"""How well the draft model's confidence (its most likely token's probability) predicts acceptance, teacher-forced
on text that is not the benchmark's: Python's standard library (code) and the READMEs and licences under
/usr/share/doc (prose), as in bench/history_calibrate.py. One forward pass of each model over each text gives, at
every position, the draft's q and the target's p: at T = 0 a draft token is accepted when both argmaxes agree; at
T > 0 a drafted token is accepted with probability sum min(p, q) (one minus the total variation). Prints acceptance
by confidence bin.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python bench/draft_confidence.py TARGET DRAFT [--texts 24]
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
from history_calibrate import texts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--texts", type=int, default=24, help="texts per kind")
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    import mlx.core as mx

    from mtpcli import models
    from mtpcli.sampling import SamplingParams, probs

    target, draft = models.load(args.target, "target"), models.load(args.draft, "draft")
    tok = target.tokenizer
    rng = random.Random(0)
    sps = {"T=0": None, "T=1 top-p 0.95": SamplingParams(temp=1.0, top_p=0.95)}
    for kind in ("code", "prose"):
        rows = {name: [] for name in sps}  # (confidence, acceptance)
        for t in texts(kind, rng)[: args.texts]:
            ids = tok.encode(t)[: args.tokens]
            if len(ids) < 32:
                continue
            x = mx.array(ids)[None]
            lp, lq = target.model(x)[0].astype(mx.float32), draft.model(x)[0].astype(mx.float32)
            lp, lq = lp[:, : lq.shape[-1]], lq[:, : lp.shape[-1]]
            for name, sp in sps.items():
                if sp is None:
                    q = mx.softmax(lq, axis=-1)
                    acc = (mx.argmax(lp, -1) == mx.argmax(lq, -1)).astype(mx.float32)
                else:
                    q, p = probs(lq, sp), probs(lp, sp)
                    acc = mx.minimum(p, q).sum(-1)
                c = q.max(-1)
                rows[name] += list(zip(np.array(c).tolist(), np.array(acc).tolist()))
        for name, r in rows.items():
            c, a = np.array(r).T
            print(f"\n{kind}, {name}: {len(c)} positions, mean confidence {c.mean():.3f}, mean acceptance {a.mean():.3f}")
            print("  confidence bin   n      acceptance")
            for lo in np.arange(0, 1, 0.1):
                m = (c >= lo) & (c < lo + 0.1 + (lo >= 0.9))
                if m.sum():
                    print(f"  {lo:.1f}-{lo + 0.1:.1f}      {m.sum():5d}  {a[m].mean():.3f}")
    mx.clear_cache()


if __name__ == "__main__":
    main()
