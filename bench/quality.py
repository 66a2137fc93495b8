"""Quality checks on `mtpcli bench --out` results: does the generated Python parse, and are greedy outputs identical.

  python bench/quality.py docs/perf/cpu/code-t1.json [more.json ...]

Outputs are cut at max-tokens, so a block may end mid-statement; a block counts as parsing when it, or it with
its last (possibly unfinished) line dropped, compiles.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import defaultdict


def code_of(text: str) -> str:
    m = re.search(r"```(?:python|py)?\n(.*?)(?:```|$)", text, re.S)
    return m.group(1) if m else text


def parses(code: str) -> bool:
    lines = code.rstrip().splitlines()
    for cut in range(0, min(4, len(lines))):  # allow the unfinished tail of a truncated answer
        try:
            ast.parse("\n".join(lines[: len(lines) - cut]) or "pass")
            return True
        except SyntaxError:
            continue
    return False


def main(paths: list[str]) -> None:
    for path in paths:
        result = json.load(open(path))
        outputs = result["outputs"]
        print(f"== {path}")
        by_key = defaultdict(dict)
        for arm, rows in outputs.items():
            ok = sum(parses(code_of(r["text"])) for r in rows)
            print(f"{arm:<22} python parses: {ok}/{len(rows)}")
            for r in rows:
                by_key[(r["seed"], r["prompt"])][arm] = r["tokens"]
        arms = list(outputs)
        same = sum(len({tuple(v[a]) for a in arms if a in v}) == 1 for v in by_key.values())
        print(f"identical token sequences across all arms: {same}/{len(by_key)} (seed, prompt) pairs")


if __name__ == "__main__":
    main(sys.argv[1:])
