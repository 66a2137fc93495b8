"""Ratios new/old of median decode tok/s per arm, from bench/engine_ab.sh's JSON files (old-rN.json, new-rN.json)."""

import json
import statistics
import sys
from pathlib import Path

runs = {}
for f in sys.argv[1:]:
    tree = Path(f).stem.split("-")[0]
    for arm in json.loads(Path(f).read_text())["arms"]:
        runs.setdefault(arm["arm"], {}).setdefault(tree, []).append(arm["decode_tps"]["median"])
print(f"{'arm':<14} {'old tok/s':>22} {'new tok/s':>22} {'new/old':>8}")
for arm, by in runs.items():
    old, new = statistics.median(by["old"]), statistics.median(by["new"])
    fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    print(f"{arm:<14} {fmt(by['old']):>22} {fmt(by['new']):>22} {new / old:8.3f}")
