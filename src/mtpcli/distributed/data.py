"""Data mode: every rank decodes (batched) a share of the requests, balanced by prompt plus output length; rank 0
gathers every completion and statistics and yields them in input order. Also a sharded target's watched events."""

from __future__ import annotations

import pickle
import sys
import time
from typing import Iterator

from ..engine import Event
from ..errors import EXIT_RUNTIME, MtpError


def shares(requests: list, size: int) -> list[list]:
    """Longest first to the least loaded rank (load: prompt plus output tokens); each share in input order."""
    load, out = [0] * size, [[] for _ in range(size)]
    for r in sorted(requests, key=lambda r: (-(len(r.prompt) + r.max_tokens), r.index)):
        k = min(range(size), key=lambda i: (load[i], i))
        out[k].append(r)
        load[k] += len(r.prompt) + r.max_tokens
    return [sorted(x, key=lambda r: r.index) for x in out]


def lost(e: Exception) -> Exception:
    """A backend error that says a peer went away, as one line; any other error as it is (this rank's own)."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if not any(w in msg.lower() for w in ("connection", "lost", "closed", "reset", "broken pipe", "nccl")):
        return e
    return MtpError(f"lost the other ranks ({msg}): another rank failed or was stopped", EXIT_RUNTIME)


def watched(group, engine, requests: list) -> Iterator:
    """A sharded target's events: the engine's own, every wait watched."""
    group.watchdog.arm("the first verify pass")
    try:
        yield from engine.generate(requests)
    except RuntimeError as e:  # the backend's own word for a peer that went away ("[ring] connection ... lost")
        raise lost(e) from None
    finally:
        group.watchdog.disarm()


def events(group, engine, requests: list) -> Iterator:
    """This rank's share decoded, then on rank 0 every completion in input order (every rank's stats: engine.runs)."""
    parts_of = shares(requests, group.size)
    done, error, t0 = {}, None, time.perf_counter()  # done: request -> [tokens, finish reason]
    try:
        for ev in engine.generate(parts_of[group.rank]):
            row = done.setdefault(ev.request, [[], None])
            row[0].extend(ev.tokens)
            row[1] = ev.finish_reason or row[1]
    except Exception as e:  # noqa: BLE001 - reported by rank 0 as this rank's failure
        error = str(e) if isinstance(e, MtpError) else f"{type(e).__name__}: {e}"
    if error and not group.root:  # said at once too: the gather may wait long for the other ranks
        print(f"mtpcli: error: rank {group.rank}: {error}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    payload = pickle.dumps({"rank": group.rank, "done": done, "runs": {i: engine.runs.get(i) for i in done},
                            "cycles": engine.cycles, "error": error, "prompts": len(parts_of[group.rank]),
                            "wall_s": elapsed})
    try:
        parts = [pickle.loads(p) for p in group.gather(payload, "gathering the completions", group.timeout + elapsed)]
    except RuntimeError as e:
        raise lost(e) from None
    group.extra.update(prompts_per_rank=[p["prompts"] for p in parts], wall_s_per_rank=[p["wall_s"] for p in parts],
                       failed_ranks={p["rank"]: p["error"] for p in parts if p["error"]})
    if not group.root:
        return
    engine.cycles = sum(p["cycles"] for p in parts)
    failed = set()  # the requests of the ranks that failed
    for p in parts:
        engine.runs.update({i: r for i, r in p["runs"].items() if r is not None})
        if p["error"]:
            print(f"mtpcli: error: rank {p['rank']} failed: {p['error']}", file=sys.stderr, flush=True)
            failed |= {r.index for r in parts_of[p["rank"]]}
    rows = {i: row for p in parts for i, row in p["done"].items()}
    for r in requests:
        if r.index in failed and r.index not in rows:
            group.extra.setdefault("failed_requests", []).append(r.index)
        tokens, finish = rows.get(r.index, ([], "error"))
        yield Event(r.index, tokens, finish or "length")
