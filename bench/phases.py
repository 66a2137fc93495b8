#!/usr/bin/env python3
"""Run `mtpcli ARGS` in this process with a timeline of its phases on stderr at exit: each phase's start and end
(seconds from this script's start), its length, and the memory it touched for the first time (minor page faults,
MB: on a machine where fresh memory is slow to touch, as this project's CPU VM, that is time too). The phases are
the functions in PHASES, wrapped by name (nested ones indented); `first token` is when the writer got it.

    flock /tmp/cpu-bench.lock python bench/phases.py generate --model /root/.cache/mtpcli/models/qwen2.5-coder-1.5b \\
        --prompt-file turn2.txt --max-tokens 8 --temp 0 --draft none
"""

from __future__ import annotations

import atexit
import functools
import resource
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
PHASES = {  # module or module.Class -> the functions timed
    "models": ["load", "load_draft", "read_tokenizer", "check_pair"],
    "prefix": ["model_key", "load"], "prefix.Shelf": ["find", "keep"], "prefix.Store": ["flush"],
    "cache.LM": ["_prefill", "_restore", "set_row", "warm"], "cache": ["in_chunks"],
    "engine.Engine": ["_start", "_launch"], "drafters.model.ModelDrafter": ["start", "propose"],
    "generate": ["decode", "requests_for", "summarize", "report"], "assemble": ["engine", "remember_costs"],
    "runlog": ["append_safely"],
}
events: list[tuple[float, float, int, str, float]] = []
depth = [0]


def faults_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt * resource.getpagesize() / 2**20


def timed(owner, name: str, label: str) -> None:
    f = getattr(owner, name)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        t, mb = time.perf_counter(), faults_mb()
        depth[0] += 1
        try:
            return f(*args, **kwargs)
        finally:
            depth[0] -= 1
            events.append((t - T0, time.perf_counter() - T0, depth[0], label, faults_mb() - mb))

    setattr(owner, name, wrapper)


def main() -> None:
    import importlib

    from mtpcli import blas

    sys.argv = ["mtpcli", *sys.argv[1:]]
    blas.load(sys.argv[1:])  # (before MLX, as the command does)
    from mtpcli import cli, writers

    for where, names in PHASES.items():
        module, _, cls = where.rpartition(".") if where.rsplit(".", 1)[-1][0].isupper() else (where, "", "")
        owner = importlib.import_module(f"mtpcli.{module}")
        owner = getattr(owner, cls) if cls else owner
        for name in names:
            timed(owner, name, f"{where}.{name}")
    first: list[float] = []
    event = writers.Writer.event

    def seen(self, *args, **kwargs):
        if not first:
            first.append(time.perf_counter() - T0)
        return event(self, *args, **kwargs)

    writers.Writer.event = seen

    def show() -> None:
        print(f"--- phases (s from the start; first token at {first[0] if first else float('nan'):.3f})",
              file=sys.stderr)
        for a, b, d, label, mb in sorted(events):
            if b - a >= 0.005:
                print(f"{a:8.3f} {b:8.3f} {b - a:7.3f} {mb:7.0f} MB  {'  ' * d}{label}", file=sys.stderr)
        print(f"--- exit at {time.perf_counter() - T0:.3f}", file=sys.stderr)

    atexit.register(show)
    cli.main()


if __name__ == "__main__":
    main()
