"""Each tree arm over the chain (the first arm) from a `mtpcli bench --out` file: per prompt (decode tok/s ratio,
tokens per cycle, tree cycles of all drafted ones) and per class (the geometric mean of its prompts' ratios; a prompt's
class is its file's folder). usage: python bench/tree_table.py OUT.json PROMPTS   (PROMPTS as bench/tree_cpu.sh's)"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def main() -> None:
    result = json.loads(Path(sys.argv[1]).read_text())
    files = [Path(p) for p in sys.argv[2].split(",")]
    cls = {f.stem: f.parent.name for p in files for f in ([p] if p.is_file() else sorted(p.glob("*.txt")))}
    arms = [a["arm"] for a in result["arms"]]
    runs = {a: {o["prompt"]: o["stats"] for o in result["outputs"][a]} for a in arms}
    chain, rest = arms[0], arms[1:]
    ratios = {a: {} for a in rest}
    print(f"\nper prompt, over {chain}: ratio (tokens/cycle; tree cycles of drafted cycles)")
    for p, base in runs[chain].items():
        cells = []
        for a in rest:
            st = runs[a].get(p)
            if st is None:
                continue
            ratios[a][p] = st["decode_tps"] / base["decode_tps"]
            drafted = sum(v for k, v in st["draft_width_hist"].items() if k != "0")
            trees = (st.get("trees") or {}).get("cycles", 0)
            cells.append(f"{a} {ratios[a][p]:.3f}x ({st['tokens_per_cycle']:.2f}; trees {trees}/{drafted})")
        print(f"{p} ({cls.get(p, '?')}): {chain} {base['decode_tps']:.2f} tok/s ({base['tokens_per_cycle']:.2f}); "
              + "; ".join(cells))
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")  # noqa: E731
    print(f"\nper class, geometric mean over {chain}")
    for c in sorted(set(cls.get(p, "?") for p in runs[chain])):
        print(c + ": " + ", ".join(f"{a} {geo([r for p, r in ratios[a].items() if cls.get(p, '?') == c]):.3f}x"
                                   for a in rest))
    print("all: " + ", ".join(f"{a} {geo(list(ratios[a].values())):.3f}x" for a in rest))


if __name__ == "__main__":
    main()
