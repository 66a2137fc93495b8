#!/usr/bin/env python3
"""An agent loop end to end (issue 54): every turn is a fresh process that gets the whole transcript (a source file
of this repository, the earlier questions and answers, a new question) and answers with 64 new tokens at T = 0.
The arms (`ARMS`, easy to edit) run interleaved per turn: mlx-lm's own `generate` (with the OpenBLAS mtpcli
preloads), mtpcli plain with and without the prefill cache, the default with and without a draft model. Measured per
turn and arm: the wall time from process start to exit, and the time to the first token (mtpcli: --stats-json's
ttft_s, from the prefill's start to the first token, the models loaded; mlx-lm: its prompt's tokens over its prompt
tokens-per-sec); mtpcli's runs keep where their time went (SECONDS). Each arm has its own XDG_CACHE_HOME,
XDG_DATA_HOME and XDG_CONFIG_HOME (kept across its turns, never shared with another arm); models are absolute paths.
The transcript's answers are the reference arm's (REFERENCE), so that every arm gets the same prompts.

    python bench/agent_loop.py --model /root/.cache/mtpcli/models/qwen2.5-coder-1.5b \\
        --draft-model /root/.cache/mtpcli/models/qwen2.5-coder-0.5b --out docs/perf/cpu/agent-loop.json
    python bench/agent_loop.py --smoke    # the tiny random models, in seconds (a check that it runs, no figure)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from mtpcli.blas import candidates  # noqa: E402  (no MLX: the parent process stays light)

PREFIX_FILE, PREFIX_COMMIT = "src/mtpcli/writers.py", "85e8e22"  # the shared prefix: 1.6k tokens of Qwen2.5
QUESTIONS = [
    "What does Writer do once stdout has been closed by the reader? Answer in one sentence.",
    "How does write_file keep a result file whole if the run is interrupted? Answer in one sentence.",
    "In which order are completions written in the text format when several prompts are decoded together? "
    "Answer in one sentence.",
    "What does check_writable refuse, and why is it called before the work? Answer in one sentence.",
    "Which class would you change to add a CSV output format, and which method first? Answer in one sentence.",
]
# the prefill cache's flags (on by default)
CACHE_ON: list[str] = []
CACHE_OFF: list[str] = ["--no-prefill-cache"]
ARMS = [  # (name, kind, flags); "{draft}" is --draft-model's path
    ("mlx-lm plain", "mlx-lm", []),
    ("mtpcli --draft none, cache off", "mtpcli", ["--draft", "none", *CACHE_OFF]),
    ("mtpcli --draft none, cache on", "mtpcli", ["--draft", "none", *CACHE_ON]),
    ("default + --draft-model, cache on", "mtpcli", ["--draft-model", "{draft}", *CACHE_ON]),
    ("default, no draft model, cache on", "mtpcli", [*CACHE_ON]),
]
REFERENCE = "mtpcli --draft none, cache off"  # whose answers go into the transcript
SECONDS = ("load_s", "prefill_s", "prompt_cached_tokens", "draft_prefill_s", "draft_prefill_tokens",
           "decode_s")  # kept from each mtpcli run's --stats-json: where its time went


def openblas_env() -> dict[str, str]:
    """mlx-lm with the BLAS mtpcli loads (blas.load: the first of blas.candidates) on Linux."""
    lib = next((p for _, p in candidates()), None)
    if lib is None:
        return {}
    return {"LD_PRELOAD": ":".join(filter(None, [lib, os.environ.get("LD_PRELOAD")]))}


def prefix_text(smoke: bool, files: list[str]) -> str:
    """The shared prefix: FILES of this repository at PREFIX_COMMIT, each in a fence."""
    if smoke:
        return "the file says: " + "abc def ghi. " * 12
    texts = []
    for name in files:
        try:
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{PREFIX_COMMIT}:{name}"], check=True,
                                  capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError):
            text = (ROOT / name).read_text()
        texts.append(f"Here is {name}:\n\n```python\n{text}```\n\n")
    return "".join(texts)


def transcript(prefix: str, done: list[tuple[str, str]], question: str, smoke: bool) -> str:
    if smoke:
        return prefix + "".join(f" q: {q} a: {a}" for q, a in done) + f" q: {question} a:"
    turns = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in done)
    return f"{prefix}{turns}Question: {question}\nAnswer:"


def has_cache_flags() -> bool:
    """Whether this mtpcli has the prefill cache's flags (else the cache arms run alike)."""
    helptext = subprocess.run([sys.executable, "-m", "mtpcli", "generate", "-h"], capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "200"}).stdout
    return all(f in helptext for f in CACHE_ON + CACHE_OFF if f.startswith("--"))


def one(arm: tuple, prompt: str, args, home: Path, scratch: Path) -> dict:
    """Run one arm on one turn's prompt in a fresh process: wall seconds, time to first token, the answer."""
    name, kind, flags = arm
    env = {**os.environ, **{f"XDG_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "DATA", "CONFIG")}}
    (scratch / "prompt.txt").write_text(prompt)
    stats = scratch / "stats.json"
    stats.unlink(missing_ok=True)
    if kind == "mlx-lm":
        cmd = [sys.executable, "-m", "mlx_lm", "generate", "--model", args.model, "--prompt", "-",
               "--max-tokens", str(args.max_tokens), "--temp", "0.0"] + (["--ignore-chat-template"] if args.smoke
                                                                           else [])
        env.update(openblas_env())
    else:
        cmd = [sys.executable, "-m", "mtpcli", "generate", "--model", args.model, "--prompt-file",
               str(scratch / "prompt.txt"), "--max-tokens", str(args.max_tokens), "--temp", "0", "--stats-json",
               str(stats)] + (["--no-chat"] if args.smoke else []) + [f.format(draft=args.draft_model) for f in flags]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, input=prompt if kind == "mlx-lm" else "", capture_output=True, text=True, env=env,
                       cwd=scratch)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"agent_loop: arm {name!r} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    if kind == "mlx-lm":  # its text between the '==========' lines, its prompt's pace after them
        parts = r.stdout.split("=" * 10)
        text = parts[1].strip() if len(parts) > 2 else ""
        m = re.search(r"Prompt: (\d+) tokens, ([\d.]+) tokens-per-sec", r.stdout)
        tokens, ttft = (int(m[1]), int(m[1]) / float(m[2])) if m and float(m[2]) > 0 else (None, None)
    else:
        doc = json.loads(stats.read_text())
        text, tokens, ttft = r.stdout.strip(), doc["prompt_tokens"], doc["ttft_s"]
        return {"wall_s": wall, "ttft_s": ttft, "prompt_tokens": tokens, "text": text,
                "seconds": {k: doc.get(k) for k in SECONDS}}
    return {"wall_s": wall, "ttft_s": ttft, "prompt_tokens": tokens, "text": text}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="the target's folder (absolute: `mtpcli models list`)")
    ap.add_argument("--draft-model", help="the draft model's folder (absolute; without it, no draft-model arm)")
    ap.add_argument("--prefix", default=PREFIX_FILE, help="the shared prefix: files of this repository at "
                    f"{PREFIX_COMMIT}, comma-separated (default {PREFIX_FILE}: 1.6k Qwen2.5 tokens)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--arms", help="the arms to run, by their index in ARMS, comma-separated (default: all; "
                    f"{ARMS.index(next(a for a in ARMS if a[0] == REFERENCE))}, the reference, always)")
    ap.add_argument("--out", help="write the result here (JSON)")
    ap.add_argument("--smoke", action="store_true", help="tiny random models, 2 turns of 8 tokens: that it runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-loop-") as tmp:
        tmp = Path(tmp)
        if args.smoke:
            sys.path.insert(0, str(ROOT / "tests"))
            from tiny import make_model, noisy_copy

            target = make_model(tmp / "target", max_positions=4096)
            args.model, args.draft_model = str(target), str(noisy_copy(target, tmp / "draft"))
            args.turns, args.max_tokens = min(args.turns, 2), 8
        if not args.model:
            ap.error("--model is needed (or --smoke)")
        args.model = str(Path(args.model).resolve())
        if args.arms:
            ARMS[:] = [a for i, a in enumerate(ARMS) if str(i) in args.arms.split(",") or a[0] == REFERENCE]
        if args.draft_model:
            args.draft_model = str(Path(args.draft_model).resolve())
        else:
            ARMS[:] = [a for a in ARMS if "{draft}" not in a[2]]
        if not has_cache_flags():
            print(f"agent_loop: note: this mtpcli has no {' '.join(CACHE_OFF)}: the cache arms run alike",
                  file=sys.stderr)
            ARMS[:] = [(n, k, [f for f in fl if f not in CACHE_OFF + CACHE_ON]) for n, k, fl in ARMS]
        prefix, done, turns = prefix_text(args.smoke, args.prefix.split(",")), [], []
        for t in range(args.turns):
            prompt = transcript(prefix, done, QUESTIONS[t % len(QUESTIONS)], args.smoke)
            got = {}
            for i, arm in enumerate(ARMS):  # interleaved: every arm on this turn before the next turn
                scratch = tmp / f"arm{i}" / "run"
                scratch.mkdir(parents=True, exist_ok=True)
                got[arm[0]] = one(arm, prompt, args, tmp / f"arm{i}", scratch)
                print(f"turn {t + 1} {arm[0]}: {got[arm[0]]['wall_s']:.2f} s", file=sys.stderr, flush=True)
            turns.append({"turn": t + 1, "prompt_tokens": got[REFERENCE]["prompt_tokens"], "arms": got})
            done.append((QUESTIONS[t % len(QUESTIONS)], got[REFERENCE]["text"]))
        for i in range(len(ARMS)):
            shutil.rmtree(tmp / f"arm{i}", ignore_errors=True)
    loop = {name: sum(t["arms"][name]["wall_s"] for t in turns) for name, _, _ in ARMS}
    doc = {"config": {"model": args.model, "draft_model": args.draft_model, "turns": args.turns,
                      "max_tokens": args.max_tokens, "prefix": f"{PREFIX_COMMIT}:{args.prefix}", "smoke": args.smoke,
                      "command": sys.argv},
           "arms": [{"name": n, "kind": k, "flags": fl} for n, k, fl in ARMS], "turns": turns, "loop": loop}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    render(doc)


def render(doc: dict) -> None:
    """One row per turn (wall s, and the time to first token in brackets), then the loop with its ratios."""
    from mtpcli.tables import table

    names = [a["name"] for a in doc["arms"]]
    rows = [[f"{t['turn']} ({t['prompt_tokens']})"] + [f"{t['arms'][n]['wall_s']:.1f} s ({t['arms'][n]['ttft_s']:.1f})"
                                                       if t["arms"][n]["ttft_s"] is not None else
                                                       f"{t['arms'][n]['wall_s']:.1f} s" for n in names]
            for t in doc["turns"]]
    loop, first, plain = doc["loop"], names[0], REFERENCE
    rows.append(["loop"] + [f"{loop[n]:.1f} s" for n in names])
    rows.append([f"x {first}"] + [f"{loop[first] / loop[n]:.2f}x" for n in names])
    rows.append([f"x {plain}"] + [f"{loop[plain] / loop[n]:.2f}x" for n in names])
    table(["turn (prompt tokens)"] + names, rows, title="wall s from start to exit (time to first token, s)")


if __name__ == "__main__":
    main()
