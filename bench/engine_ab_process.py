"""One arm, one engine per process, timed whole (600-800 tokens of one prompt, eos ignored, 3 runs after a warm-up):
run it alternately with the previous tree and this one on PYTHONPATH, as engine.md shows. Prints the cycles (equal
for both trees: the same tokens) and the seconds of each run.

  for i in 1 2 3; do PYTHONPATH=/tmp/old/src python3 bench/engine_ab_process.py M D ngram; \
                     PYTHONPATH=src python3 bench/engine_ab_process.py M D ngram; done
"""

import sys
import time

from mtpcli import models
from mtpcli.controller import FixedWidth
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine

new = hasattr(__import__("mtpcli.engine", fromlist=["Request"]), "Request")
target_path, draft_path, arm = sys.argv[1:4]
n = 600 if arm == "model" else 800
t = models.load(target_path)
d = models.load(draft_path) if arm == "model" else None
ids = list(t.tokenizer.encode("def fib(n):\n    return"))


def once():
    drafter = {"model": lambda: ModelDrafter(d.model), "ngram": NgramDrafter, "plain": lambda: None}[arm]()
    e = Engine(t.model, drafter, FixedWidth(4 if drafter else 0), (), DecodeConfig(max_tokens=n))
    if new:
        from mtpcli.engine import Request

        events = e.generate([Request(0, ids, n, 0)])
    else:
        events = e.generate(ids)
    for _ in events:
        pass
    return e


once()
times = []
for _ in range(3):
    t0 = time.perf_counter()
    e = once()
    times.append(time.perf_counter() - t0)
print("new" if new else "old", arm, e.stats.cycles, " ".join(f"{x:.3f}" for x in times))
