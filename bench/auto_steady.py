"""Ten identical runs in a row under `draft = auto`, a fresh data folder before the first (issue 58): does a user's
run draft as much the first time as later, and while the machine is busy? The deep tiny pair (tests/tiny.py
quarter_pair: hidden 512, 8 layers, a draft of the target's first quarter), one prompt, the same seed, T = 1, 40 tokens,
`-n 8`; prints each run's tokens per cycle, then the median and the farthest run from it. `--busy K` runs K spinning
processes beside the runs (the issue's "busy" case; a machine already loaded is busy as it is). `--root DIR` keeps the
data folder there (a fresh one where DIR does not exist): a second call with the same DIR goes on from the table the
first kept, so ten runs that do not fit one locked job can be two.

    python bench/auto_steady.py [OUT.json] [--runs 10] [--max-tokens 40] [--temp 1] [-n 8] [--busy 0] [--real]
        [--prompt TEXT] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SPIN = "while True: pass"
REAL = Path.home() / ".cache/mtpcli/models"


def kept(log: Path) -> dict:
    """The kept table after a run, as the decision sees it: a cycle's time over a plain step's, per source and width."""
    from mtpcli.costs import Costs

    with sqlite3.connect(log) as con:
        (value,), = con.execute("SELECT value FROM costs").fetchall()
    t = Costs.from_dict(json.loads(value))
    return {"step": round(t.step, 4), **{f"{s}@{k}": round(t.time(s, k) / t.step, 2) for s in t.per_token
                                         for k in (1, 4, 8)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--temp", type=float, default=1.0)
    ap.add_argument("-n", type=int, default=8, help="completions per run (rows)")
    ap.add_argument("--busy", type=int, default=0, help="spinning processes beside the runs")
    ap.add_argument("--real", action="store_true", help="the real pair (qwen2.5-coder 1.5b over 0.5b) instead")
    ap.add_argument("--prompt", default="a b c a b c d")
    ap.add_argument("--root", help="the runs' data folder, kept between calls (default: a fresh temporary one)")
    args = ap.parse_args()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp())
    root.mkdir(parents=True, exist_ok=True)
    if args.real:
        target, draft = REAL / "qwen2.5-coder-1.5b", REAL / "qwen2.5-coder-0.5b"
    else:
        from tiny import quarter_pair
        target, draft = quarter_pair(root, hidden=512)
    env = {**os.environ, "XDG_DATA_HOME": str(root / "data"), "XDG_CONFIG_HOME": str(root / "config"),
           "XDG_CACHE_HOME": str(root / "cache")}
    spin = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    runs = []
    try:
        for i in range(args.runs):
            stats = root / f"run{i}.json"
            subprocess.run(["mtpcli", "generate", "--model", str(target), "--draft-model", str(draft), "--no-chat",
                            "--draft", "auto", "--prompt", args.prompt, "--max-tokens", str(args.max_tokens),
                            "--temp", str(args.temp), "-n", str(args.n), "--seed", "0", "--stats-json", str(stats),
                            "-q"], env=env, check=True, stdout=subprocess.DEVNULL)
            st = json.loads(stats.read_text())
            st = st.get("stats", st)
            runs.append({k: st.get(k) for k in ("tokens_per_cycle", "cycles", "plain_steps", "decode_tps",
                                                "draft_width_hist")} | {"kept": kept(root / "data/mtpcli/runs.sqlite")})
            print(i, json.dumps(runs[-1]), flush=True)
    finally:
        for p in spin:
            p.kill()
    tpc = [r["tokens_per_cycle"] for r in runs]
    med = statistics.median(tpc)
    worst = max(abs(t / med - 1) for t in tpc)
    print("tokens per cycle:", " ".join(f"{t:.2f}" for t in tpc))
    print(f"median {med:.2f}; the farthest run {worst:.0%} from it ({'within' if worst <= 0.2 else 'NOT within'} 20%)")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs, "median": med, "worst": worst},
                                             indent=1))


if __name__ == "__main__":
    main()
