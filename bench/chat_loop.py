#!/usr/bin/env python3
"""A conversation of 4 turns (issue 56): a source file of this repository and a question (1.6k tokens), then short
questions, at T = 0. Arms: `generate --save` then `generate -c` (a process per turn, the states kept on disk), the
same turns cold (`--conversation ID --no-prefill-cache`, a process per turn), `mtpcli chat` over the same turns (one
process, piped stdin, the states kept in memory), and mlx-lm's own `generate` on each turn's whole transcript (a
process per turn, the chat template applied here, the BLAS mtpcli loads in LD_PRELOAD). The first message is one line
(chat reads a turn per line): the file's lines joined by " \\n ". Measured: wall seconds from process start to exit,
and each mtpcli turn's time to first token (--stats-json; chat: the run log's ttft_s). Every arm has its own XDG
folders; the transcripts are the -c arm's answers (checked equal across the mtpcli arms).

    python bench/chat_loop.py --model /root/.cache/mtpcli/models/qwen2.5-coder-1.5b \\
        --draft-model /root/.cache/mtpcli/models/qwen2.5-coder-0.5b --out docs/perf/cpu/chat-loop.json
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from mtpcli.blas import candidates  # noqa: E402  (no MLX here)

from agent_loop import PREFIX_COMMIT, PREFIX_FILE, QUESTIONS as ALL  # noqa: E402  (the same prefix and questions)

QUESTIONS = ALL[:4]


def env_for(home: Path, extra: dict | None = None) -> dict:
    return {**os.environ, **{f"XDG_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "DATA", "CONFIG")},
            **(extra or {})}


def run(cmd: list[str], env: dict, stdin: str = "") -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"chat_loop: {cmd[:4]} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return wall, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", help="the draft model's folder (without it, the default drafts without one)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ttft-only", action="store_true", help="only the -c and cold arms (time to first token)")
    ap.add_argument("--no-cold", action="store_true", help="leave the cold arm out (-c, chat and mlx-lm: a loop that "
                    "must fit a busy machine's lock beside a --ttft-only one)")
    ap.add_argument("--out")
    args = ap.parse_args()
    try:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{PREFIX_COMMIT}:{PREFIX_FILE}"], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):  # a copy without .git (the lent GPU): today's file
        text = (ROOT / PREFIX_FILE).read_text()
    joined = " \\n ".join(text.splitlines())
    prompts = [f"Here is {PREFIX_FILE}, its lines joined by ' \\n ': {joined}  {QUESTIONS[0]}", *QUESTIONS[1:]]
    flags = ["--model", args.model, *(["--draft-model", args.draft_model] if args.draft_model else []),
             "--max-tokens", str(args.max_tokens), "--temp", "0"]
    mtpcli = [sys.executable, "-m", "mtpcli"]
    turns = []
    with tempfile.TemporaryDirectory(prefix="chat-loop-") as tmp:
        tmp = Path(tmp)
        homes = {a: tmp / a for a in ("c", "cold", "chat", "mlx")}
        (tmp / "p1.txt").write_text(prompts[0])
        for k, p in enumerate(prompts):  # -c and cold, interleaved per turn
            row = {"turn": k + 1}
            for arm, extra in (("c", []), ("cold", ["--no-prefill-cache"]))[: 1 if args.no_cold else 2]:
                go = (["--save", "--prompt-file", str(tmp / "p1.txt")] if k == 0 else
                      ["-c" if arm == "c" else "--conversation=1", "-p", p])
                stats = tmp / "stats.json"
                wall, out = run(mtpcli + ["generate", *go, *flags, *extra, "-q", "--stats-json", str(stats)],
                                env_for(homes[arm]))
                doc = json.loads(stats.read_text())
                row[arm] = {"wall_s": wall, "ttft_s": doc["ttft_s"], "prompt_tokens": doc["prompt_tokens"],
                            "cached": doc["prompt_cached_tokens"], "text": out.strip()}
                print(f"turn {k + 1} {arm}: {wall:.1f} s, ttft {doc['ttft_s']:.2f} s", file=sys.stderr, flush=True)
            turns.append(row)
        chat, mlx, lib = {}, [], next((p for _, p in candidates()), None)
        if not args.ttft_only:
            wall, out = run(mtpcli + ["chat", *flags], env_for(homes["chat"]), "/save\n" + "\n".join(prompts) + "\n")
            with sqlite3.connect(homes["chat"] / "data" / "mtpcli" / "runs.sqlite") as con:
                chat_runs = [json.loads(s) for (s,) in con.execute("SELECT stats FROM runs ORDER BY id")]
                answers = [a for (a,) in con.execute("SELECT answer FROM turns ORDER BY id")]
            chat = {"wall_s": wall, "ttft_s": [r["ttft_s"] for r in chat_runs],
                    "cached": [r["prompt_cached_tokens"] for r in chat_runs],
                    "same_text": answers == [t["c"]["text"] for t in turns]}
            print(f"chat: {wall:.1f} s", file=sys.stderr, flush=True)
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(args.model)
            mlx_env = env_for(homes["mlx"], {"LD_PRELOAD": lib} if lib else {})
            messages = []
            for k, p in enumerate(prompts):
                messages.append({"role": "user", "content": p})
                transcript = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                wall, out = run([sys.executable, "-m", "mlx_lm", "generate", "--model", args.model, "--prompt", "-",
                                 "--max-tokens", str(args.max_tokens), "--temp", "0.0", "--ignore-chat-template"],
                                mlx_env, transcript)
                answer = out.split("=" * 10)[1].strip() if out.count("=" * 10) >= 2 else ""
                mlx.append({"wall_s": wall, "text": answer})
                print(f"turn {k + 1} mlx-lm: {wall:.1f} s", file=sys.stderr, flush=True)
                messages.append({"role": "assistant", "content": turns[k]["c"]["text"]})
    doc = {"config": {"model": args.model, "draft_model": args.draft_model, "max_tokens": args.max_tokens,
                      "prefix": f"{PREFIX_COMMIT}:{PREFIX_FILE}", "blas": lib, "command": sys.argv},
           "turns": turns, "chat": chat, "mlx_lm": mlx,
           "same_text": all(t["c"]["text"] == t["cold"]["text"] for t in turns if "cold" in t)}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for t in [t for t in turns if "cold" in t]:
        print(f"turn {t['turn']} ({t['c']['prompt_tokens']} tokens, {t['c']['cached']} kept): -c {t['c']['wall_s']:.1f} s"
              f" (ttft {t['c']['ttft_s']:.2f}), cold {t['cold']['wall_s']:.1f} s (ttft {t['cold']['ttft_s']:.2f}): "
              f"ttft x{t['cold']['ttft_s'] / t['c']['ttft_s']:.1f}")
    loop = sum(m["wall_s"] for m in mlx)
    print(f"-c loop {sum(t['c']['wall_s'] for t in turns):.1f} s, cold "
          f"{sum(t.get('cold', {}).get('wall_s', 0.0) for t in turns):.1f} s; the same text -c and cold: "
          f"{doc['same_text']}")
    if chat:
        print(f"chat {chat['wall_s']:.1f} s (ttft {', '.join(f'{x:.2f}' for x in chat['ttft_s'])}); mlx-lm per turn "
              f"{loop:.1f} s: x{loop / chat['wall_s']:.2f}")


if __name__ == "__main__":
    main()
