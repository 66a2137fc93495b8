"""Share of a cycle spent shaping p/q (temperature, top-k, top-p) at T=1 on the real pair: the full sort of the
vocabulary (151,936 tokens for Qwen) against the partial selection (sampling.shaped: top-4096 first).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python bench/sampling_share.py TARGET DRAFT
"""
import sys, time, statistics
import mlx.core as mx
from mtpcli import models
from mtpcli.cache import LM
from mtpcli.sampling import SamplingParams, probs

def timed(fn, n=7):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); mx.eval(fn()); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)

target = models.load(sys.argv[1], "target model"); draft = models.load(sys.argv[2], "draft model")
prompt = list(range(1000, 1200))
rows = []
for name, m, k in (("target verify (5 positions)", target.model, 5), ("draft step (1 position)", draft.model, 1)):
    lm = LM(m, name, 512); lm.add_rows(1); lm.set_row(0, prompt)
    block = mx.array([prompt[-k:]], dtype=mx.int32)
    def fwd():
        out = lm.forward(block); lm.truncate(lm.pos.copy() * 0 + len(prompt)); return out
    logits = fwd(); mx.eval(logits)
    t_fwd = timed(fwd)
    for label, sp in (("T=1 top-p 0.95", SamplingParams(1.0, 0.95)), ("T=1 top-k 50 top-p 0.95", SamplingParams(1.0, 0.95, 50)),
                      ("T=1 (no top-k/p)", SamplingParams(1.0))):
        t_full = timed(lambda: probs(logits, sp, full=True))
        t_part = timed(lambda: probs(logits, sp))
        rows.append((name, label, t_fwd * 1e3, t_full * 1e3, t_full / t_fwd, t_part * 1e3, t_part / t_fwd))
for r in rows:
    print(f"{r[0]:28s} {r[1]:24s} forward {r[2]:7.1f} ms | full sort {r[3]:6.2f} ms = {r[4]:.3f} of it"
          f" | partial {r[5]:6.2f} ms = {r[6]:.3f}")
