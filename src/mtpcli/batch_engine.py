"""The batched decode loop: many prompts, up to `batch_size` rows at a time, refilled as rows finish.

Each cycle ONE width comes from the controller for the whole batch; each row drafts up to it (fewer near
its own max_tokens, or when its drafter finds fewer), one target pass verifies every row, each row's law
draws with its own keys, and each row keeps its own accepted prefix (batch.py turns rejections into holes).
A row's key schedule is the single engine's, so with a fixed width a row gives the tokens it gives alone.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx
import numpy as np

from .batch import BatchLM
from .controller import keep_members
from .engine import DecodeConfig, Event, judge, new_run
from .stats import RunStats


@dataclass
class Request:
    index: int
    prompt: list[int]
    max_tokens: int
    seed: int


@dataclass
class Row:
    req: Request
    context: list[int]
    key: mx.array
    run: RunStats
    started: float
    generated: int = 0
    done: bool = False
    pending: list[Event] = field(default_factory=list)


class BatchEngine:
    def __init__(self, model, drafter, controller, eos_token_ids=(), config=DecodeConfig(), batch_size: int = 8):
        self.target = BatchLM(model, role="target model", prefill_step=config.prefill_step)
        self.drafter, self.controller = drafter, controller  # drafter None: plain decoding
        self.eos, self.cfg, self.batch_size = set(eos_token_ids), config, batch_size
        self.runs: dict[int, RunStats] = {}  # request index -> its row's statistics
        self.cycles = 0
        self.wall_s = 0.0

    def _start(self, b: int, req: Request) -> Row:
        t0 = time.perf_counter()
        self.target.set_row(b, req.prompt[:-1])
        if self.drafter is not None:
            self.drafter.set_row(b, req.prompt)
        self.controller.reset(b)
        run = new_run(self.cfg, len(req.prompt))
        run.prefill_tokens, run.prefill_s = len(req.prompt), time.perf_counter() - t0
        self.runs[req.index] = run
        _, key = mx.random.split(mx.random.key(req.seed))  # the single engine's key for completion 0
        return Row(req, list(req.prompt), key, run, t0)

    def generate(self, requests: list[Request]) -> Iterator[Event]:
        """Events of every request (Event.completion = request index), in the order they happen."""
        t_start = time.perf_counter()
        queue = deque(requests)
        n = min(self.batch_size, len(queue))
        self.target.add_rows(n)
        if self.drafter is not None:
            self.drafter.add_rows(n)
        self.controller.batch = n
        self.controller.reset()
        rows = [self._start(b, queue.popleft()) for b in range(n)]
        try:
            while rows:
                self._cycle(rows)
                for b, row in enumerate(rows):
                    yield from row.pending
                    row.pending = []
                    if row.done:
                        row.run.peak_memory_bytes = mx.get_peak_memory()
                        row.run.controller_estimate = self.controller.estimate(b)
                        if queue:
                            rows[b] = self._start(b, queue.popleft())
                live = [b for b, r in enumerate(rows) if not r.done]
                if len(live) < len(rows):  # nothing left to refill these rows with
                    rows = [rows[b] for b in live]
                    for part in (self.target, self.drafter):
                        if part is not None:
                            part.keep_rows(live)
                    keep_members(self.controller, live)
        finally:
            self.wall_s = time.perf_counter() - t_start

    def _cycle(self, rows: list[Row]) -> None:
        t0 = time.perf_counter()
        cfg, B = self.cfg, len(rows)
        splits = [mx.random.split(r.key, 3) for r in rows]
        for r, s in zip(rows, splits):
            r.key = s[0]
        width = self.controller.width() if self.drafter is not None else 0
        caps = [max(0, min(width, r.req.max_tokens - r.generated - 1)) for r in rows]
        contexts = [r.context for r in rows]
        if self.drafter is not None and max(caps) > 0:
            drafts, q, lengths, requested = self.drafter.propose(contexts, caps, cfg.sampling, [s[1] for s in splits])
        else:
            drafts, q, lengths, requested = mx.zeros((B, 0), mx.int32), None, [0] * B, caps
        before = self.target.layout.pos.copy()
        inputs = mx.concatenate([mx.array([[c[-1]] for c in contexts], dtype=mx.int32), drafts], axis=1)
        logits = self.target.forward(inputs)  # (B, k+1, V): one target pass for the whole batch
        v, sums = judge(cfg, logits, drafts, q, [s[2] for s in splits], lengths)
        mx.eval(v.n_accepted, v.token, drafts, *sums)  # ONE host synchronisation per cycle
        n_acc, tok, d = v.n_accepted.tolist(), v.token.tolist(), drafts.tolist()
        sums = [x.tolist() for x in sums]
        self.target.truncate(before + np.array(n_acc) + 1)
        news = [d[b][: n_acc[b]] + [tok[b]] for b in range(B)]
        for r, new in zip(rows, news):
            r.context.extend(new)
        if self.drafter is not None:
            self.drafter.commit(contexts, n_acc)
        seconds = time.perf_counter() - t0
        self.controller.update(lengths, n_acc, seconds=seconds)
        self.cycles += 1
        for b, r in enumerate(rows):
            self._record(r, lengths[b], requested[b], n_acc[b], news[b], seconds, [x[b] for x in sums])

    def _record(self, r: Row, k: int, requested: int, n: int, new: list[int], seconds: float, typical: list) -> None:
        run = r.run
        run.floor_cut += k < requested
        run.record_cycle(k, n, len(new))
        run.decode_s += seconds
        if typical:
            run.record_typical(min(n + 1, k), n, n < k, *typical)
        if run.ttft_s is None:
            run.ttft_s = time.perf_counter() - r.started
        r.generated += len(new)
        stop = next((i for i, t in enumerate(new) if t in self.eos), None)
        if stop is not None:
            r.pending.append(Event(r.req.index, new[:stop], "stop"))
            r.done = True
        elif r.generated >= r.req.max_tokens:
            r.pending.append(Event(r.req.index, new, "length"))
            r.done = True
        else:
            r.pending.append(Event(r.req.index, new))
