"""Ten identical runs in a row under `draft = auto`, one run log between them: does the kept cost table swing a
user's runs (issue 33)? A tiny random target and a draft model a quarter of its size (tests/tiny.py's quarter_pair:
hidden 512, 8 layers), one prompt, the same seed; prints each run's tokens per cycle, plain steps and tok/s against the median.
Run it on a busy machine too (another job on every core), where one run's timings can mislead the next.

    python bench/cost_stability.py OUT.json [--runs 10] [--max-tokens 800] [--temp 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny import quarter_pair  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=800)
    ap.add_argument("--temp", type=float, default=0.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    target, draft = quarter_pair(root, hidden=512)
    env = {**os.environ, "XDG_DATA_HOME": str(root / "data"), "XDG_CONFIG_HOME": str(root / "config")}
    runs = []
    for i in range(args.runs):
        stats = root / f"run{i}.json"
        subprocess.run(["mtpcli", "generate", "--model", str(target), "--draft-model", str(draft), "--no-chat",
                        "--prompt", "a b c a b c d", "--max-tokens", str(args.max_tokens), "--temp", str(args.temp),
                        "--seed", "0", "--stats-json", str(stats), "-q"], env=env, check=True, stdout=subprocess.DEVNULL)
        s = json.loads(stats.read_text())
        st = s.get("stats", s)
        runs.append({"tokens_per_cycle": st["tokens_per_cycle"], "plain_steps": st.get("plain_steps"),
                     "cycles": st.get("cycles"), "tok_s": st.get("decode_tps") or st.get("tok_s"),
                     "sources": st.get("sources")})
        print(i, json.dumps(runs[-1]), flush=True)
    med = statistics.median(r["tokens_per_cycle"] for r in runs)
    worst = max(abs(r["tokens_per_cycle"] / med - 1) for r in runs)
    print(f"median tokens per cycle {med:.2f}; the farthest run {worst:.0%} from it "
          f"({'within' if worst <= 0.2 else 'NOT within'} 20%)")
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs, "median": med, "worst": worst}, indent=1))


if __name__ == "__main__":
    main()
