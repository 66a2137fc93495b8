"""The table of bench/cpu_distributed.sh: per prompt and arm, decode tok/s, cycles, tokens per cycle, the time in our
collectives per cycle, and whether the tokens equal the one-process plain run's."""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = []
for i in sorted({p.stem.rsplit("-", 1)[1] for p in out.glob("dist-*-*.json")}):
    ref = json.loads((out / f"dist-one-plain-{i}.json").read_text())["tokens"]
    for arm in ("one-plain", "one-spec", "tensor2-plain", "tensor2-spec"):
        f = out / f"dist-{arm}-{i}.json"
        if not f.exists():
            continue
        d = json.loads(f.read_text())
        st, dist = d["stats"], d.get("distributed") or {}
        per = dist.get("collective_ms_per_cycle") if not dist.get("in_graph") else None
        rows.append([i, arm, f"{st['decode_tps']:.2f}", st["cycles"], f"{st['tokens_per_cycle']:.2f}",
                     "-" if per is None else f"{per:.2f}", dist.get("model_collectives_per_pass", "-"),
                     "yes" if d["tokens"] == ref else "NO"])
head = ["prompt", "arm", "decode tok/s", "cycles", "tokens/cycle", "our collective ms/cycle", "model collectives/pass",
        "tokens == one-process plain"]
w = [max(len(str(r[k])) for r in rows + [head]) for k in range(len(head))]
for r in [head] + rows:
    print("  ".join(str(c).ljust(x) for c, x in zip(r, w)))
a = out / "allsum.json"
if a.exists():
    x = json.loads(a.read_text())
    print(f"\nall_sum of one token's hidden state ({x['hidden']} floats) over {x['size']} ranks ({x['backend']}): "
          f"{x['allsum_us']:.0f} us median; x {x.get('per_pass', '?')} per pass of the 1.5B target")
