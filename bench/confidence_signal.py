"""Does the target's confidence tell how often a draft model will pass, before it drafts? (`draft = auto`'s
content signal, policy.AutoPolicy.offset.)

For each prompt (the bench's classes and held-out prompts, as bench/auto_policy.py picks them): the target's greedy
continuation (--max-tokens), then one pass of each model over prompt + continuation. Per prompt, over the generated
positions: the draft's greedy agreement with the target (what T = 0 accepts), sum min(p, q) at T = 1 top-p 0.95
(what the exact law accepts there), and the target's mean largest probability at temperature 1 (the signal); also
over the first 8 positions, and the correlation of the signal at one position with agreement at the next. One JSON
line per prompt on stdout.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \
        python bench/confidence_signal.py TARGET DRAFT [--max-tokens 40]
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--max-tokens", type=int, default=40)
    args = ap.parse_args()

    import mlx.core as mx
    from auto_policy import prompts
    from auto_sim import continuation
    from mtpcli import models
    from mtpcli.generate import encode_prompt
    from mtpcli.sampling import SamplingParams, probs

    target, draft = models.load(args.target, "target model"), models.load(args.draft, "draft model")
    sp = SamplingParams(temp=1.0, top_p=0.95)
    for cls, name, text in prompts():
        ids = encode_prompt(target.tokenizer, text, None, None)
        _, lt, ld = continuation(target, draft, ids, args.max_tokens)
        agree = np.array((mx.argmax(lt, -1) == mx.argmax(ld, -1)).tolist(), dtype=float)
        conf = np.array(mx.exp(lt.max(-1) - mx.logsumexp(lt, -1)).tolist())
        passes = np.array(mx.minimum(probs(lt, sp, full=True), probs(ld, sp, full=True)).sum(-1).tolist())
        lag = np.corrcoef(conf[:-1], agree[1:])[0, 1] if agree[1:].std() > 0 else None
        print(json.dumps({"class": cls, "prompt": name, "agree_t0": round(agree.mean(), 3),
                          "pass_t1": round(passes.mean(), 3), "confidence": round(conf.mean(), 3),
                          "agree_t0_first8": round(agree[:8].mean(), 3), "confidence_first8": round(conf[:8].mean(), 3),
                          "lag_correlation": None if lag is None else round(float(lag), 3)}), flush=True)


if __name__ == "__main__":
    main()
