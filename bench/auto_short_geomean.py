"""Per prompt, the first arm's median decode tok/s over the seeds against the second's; their geometric mean.

    python bench/auto_short_geomean.py OUT.json   (an `mtpcli bench --out` result)
"""

import json
import math
import statistics
import sys

result = json.load(open(sys.argv[1]))
outputs = result["outputs"]
arms = list(outputs)
per: dict[str, dict[str, list[float]]] = {}
for arm in arms:
    for run in outputs[arm]:
        per.setdefault(run["prompt"], {}).setdefault(arm, []).append(run["stats"]["decode_tps"])
ratios = []
for prompt, got in per.items():
    med = {a: statistics.median(v) for a, v in got.items()}
    ratios.append(med[arms[0]] / med[arms[1]])
    print(f"{prompt:12s} " + "  ".join(f"{a} {med[a]:.2f}" for a in arms) + f"  ratio {ratios[-1]:.3f}")
print(f"per-prompt geometric mean, {arms[0]} / {arms[1]}: {math.exp(statistics.fmean(map(math.log, ratios))):.3f}")
