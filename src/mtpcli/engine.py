"""The decode engine: requests in, events out; one prompt is a batch of one row.

Each cycle: plan ONE source and width for the batch (controller), propose (drafter), one target pass over every row, one
acceptance law, one host sync, commit, roll back. Rows that finish are refilled from the queue; when it is empty
they leave the batch. A row draws only with its own keys (the same schedule whatever its neighbours), so at a
fixed width a row gives exactly the tokens it gives alone. Plain steps (width 0) are launched before the previous
one is read back, so the device computes step t+1 while the host handles step t, as mlx-lm's own loop does; under a
policy too (draft = auto, one row), where it plans another plain step from the tokens committed before the one in
flight (a choice that depends on committed tokens only, as every choice).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx
import numpy as np

from . import verify
from .cache import LM
from .controller import FixedWidth, keep_members
from .drafters import NoDraft, empty
from .sampling import SamplingParams, shaped
from .stats import RunStats


@dataclass(frozen=True)
class DecodeConfig:
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 256
    seed: int = 0
    typical_threshold: float = 0.0  # 0 = the exact law
    typical_eps: float = 1.0
    prefill_step: int = 512

    @property
    def law(self) -> str:
        if self.sampling.greedy:
            return "greedy"
        return "typical" if self.typical_threshold > 0 else "exact"


def judge(cfg: DecodeConfig, logits: mx.array, drafts: mx.array, q: mx.array | None, keys: list,
          lengths: list[int], full: bool = False) -> tuple[verify.Verdict, list[mx.array], mx.array | None]:
    """The configured acceptance law on one verify pass (B rows). For the typical law also, per row, the entropy and
    the floor summed over the positions its test reached (for the statistics); [] for the other laws. Last, whether
    the target's p was found by the partial selection (sampling.shaped): where it was not, the caller judges again
    with full=True, with the same keys (so the same draws), before using the verdict."""
    sp = cfg.sampling
    if all(n == drafts.shape[1] for n in lengths):
        lengths = None  # every row drafted the full width: no padding to mask
    if cfg.law == "greedy":
        if drafts.shape[1] == 0:  # a plain step: the argmax, in as few device operations as mlx-lm's loop
            return verify.Verdict(mx.zeros(len(keys), mx.int32), mx.argmax(logits[:, -1], axis=-1)), [], None
        return verify.greedy(logits, drafts, lengths), [], None
    p, complete = shaped(logits, sp, full)
    if complete is not None and lengths is not None:  # positions past a row's draft and bonus are not used
        complete = complete | (mx.arange(drafts.shape[1] + 1)[None] > mx.array(lengths)[:, None])
    complete = None if complete is None else complete.all()
    if cfg.law == "exact":
        return verify.exact(p, q, drafts, keys, lengths), [], complete
    v = verify.typical(p, drafts, keys, cfg.typical_threshold, cfg.typical_eps, lengths)
    pos = mx.arange(drafts.shape[1])[None]
    reached = (pos <= v.n_accepted[:, None]) & (pos < (drafts.shape[1] if lengths is None else mx.array(lengths)[:, None]))
    k = drafts.shape[1]
    return v, [(v.entropy[:, :k] * reached).sum(1), (v.floor[:, :k] * reached).sum(1)], complete


@dataclass
class Request:
    index: int
    prompt: list[int]
    max_tokens: int
    seed: int
    completion: int = 0  # the c-th completion of its prompt and seed (-n): its keys are the (c+1)-th split


@dataclass
class Event:
    request: int
    tokens: list[int]  # newly committed tokens (EOS excluded)
    finish_reason: str | None = None  # "stop" | "length" when the request ends


@dataclass
class Row:
    req: Request
    context: list[int]
    key: mx.array
    run: RunStats
    started: float
    generated: int = 0
    done: bool = False


@dataclass
class Cycle:
    """A launched cycle: what the device will answer, for the rows it was launched for."""
    rows: list[Row]
    width: int
    lengths: list[int]
    requested: list[int]
    drafts: mx.array
    verdict: verify.Verdict
    sums: list[mx.array]
    before: np.ndarray
    t0: float
    source: str | None = None  # the source that drafted (None: a plain step)
    planned: str | None = None  # the source asked to draft (a confidence floor may have cut every row to 0)
    complete: mx.array | None = None  # False: judge again with the full sort (`redo`)
    redo: tuple = ()  # what judging again needs: logits, q, keys
    keys: list = field(default_factory=list)  # the rows' keys before this cycle split them
    redone: bool = False
    plan: tuple | None = None  # (source, width) planned at its launch from its contexts; None if planned before
    chances: list | None = None  # what the source estimated of each drafted token (Draft.chances)
    chained: bool = False  # launched before the previous cycle was read
    # seconds its launch waited on the device, and those the launch of the next cycle waited while this one was
    # unread: where a launch itself computes (MLX on a CPU: async_eval returns once most of the pass is done),
    # the time between two reads holds the next step's pass, not this one's; each cycle is charged its own
    # (on a GPU async_eval returns at once: nothing is lent)
    launch_s: float = 0.0
    lent: float = 0.0
    timed: bool = True  # its seconds are its own pass (not a relaunch charged the pass a redo undid): fitted
    conf: mx.array | None = None  # (B, k+1) the target's largest probability at temperature 1 (controller.observe)


class KeyChains:
    """Completion c of seed s draws with the (c+1)-th split of key(s); completions usually come in order, so each
    seed's chain is continued where it stopped instead of being walked from the start."""

    def __init__(self):
        self.chains: dict[int, tuple[mx.array, int]] = {}

    def __call__(self, req: Request) -> mx.array:
        key, done = self.chains.get(req.seed, (mx.random.key(req.seed), 0))
        if done > req.completion:
            key, done = mx.random.key(req.seed), 0
        while True:
            key, sub = mx.random.split(key)
            done += 1
            if done > req.completion:
                self.chains[req.seed] = (key, done)
                return sub


class Engine:
    link = None  # distributed.Link: a target sharded over several processes (rank 0 drafts and judges)

    def __init__(self, model, drafter=None, controller=None, eos_token_ids=(), config=DecodeConfig(),
                 batch_size: int = 1):
        self.drafter = drafter or NoDraft()
        self.target = LM(model, "target model", config.prefill_step, hidden=self.drafter.needs_hidden)
        if self.drafter.speculates:
            self.target.require_rollback()  # refused before any decoding, not at the first rejection
        self.controller = controller or FixedWidth(0)
        self.eos, self.cfg = set(eos_token_ids), config
        limits = [batch_size] + [m for m in (self.drafter.max_rows, 1 if self.target.one_row else None) if m]
        self.batch_size = max(1, min(limits))
        self.runs: dict[int, RunStats] = {}  # request index -> its statistics
        self.cycles, self.wall_s = 0, 0.0
        self.rows: list[Row] = []
        self._t_last = 0.0
        self._key = KeyChains()

    @property
    def stats(self) -> RunStats:
        """The aggregate over every request so far."""
        return RunStats.total(list(self.runs.values()))

    def generate(self, requests: list[Request]) -> Iterator[Event]:
        """Events of every request, in the order they happen."""
        t_start = time.perf_counter()
        queue = deque(requests)
        n = min(self.batch_size, len(queue))
        for part in (self.target, self.drafter):
            part.keep_rows([])
            part.add_rows(n)
        self.controller.batch = n
        if hasattr(self.controller, "watching"):  # a plain step's token is no test of a draft's under typical
            self.controller.watching = self.cfg.law != "typical"
        self.controller.reset()
        self.rows = [self._start(b, queue) for b in range(n)]
        pending = None
        try:
            while self.rows or pending:
                going = any(r.generated + 1 < r.req.max_tokens for r in self.rows)  # past the step in flight
                plan = self._chain(pending) if going else None
                chain = plan is not None
                nxt = self._launch(pending, plan) if chain else None
                if nxt is not None:
                    pending.lent += nxt.launch_s
                if pending is not None:
                    yield from self._complete(pending)
                    if nxt is not None and pending.redone:  # nxt started from a token the redo replaced
                        self._discard(nxt)
                        lost, nxt = nxt.launch_s, self._launch(None, plan)
                        nxt.lent -= lost  # the pass undone was lent by `pending`: this one is charged it
                        nxt.timed = False  # (so its seconds are two passes: not a plain step's cost)
                    self._refill(queue)
                    self._t_last = time.perf_counter()  # a refill's prefill is its own row's, not decode time
                pending = nxt if chain else (self._launch(None) if self.rows else None)
            if self.link:
                self.link.flush()
        finally:
            self.wall_s = time.perf_counter() - t_start

    def _start(self, b: int, queue: deque) -> Row:
        t0 = time.perf_counter()
        if self.link:  # every rank prefills the same rows: rank 0's verdict first
            self.link.flush()
        req = queue.popleft()
        again = bool(queue) and queue[0].prompt == req.prompt  # -n: the next request prefills nothing
        hidden = self.target.set_row(b, req.prompt[:-1], keep=again)
        self.drafter.start(b, req.prompt, hidden, keep=again)
        self.controller.reset(b)
        shared = self.target.reused
        run = RunStats(prompt_tokens=len(req.prompt), prefill_tokens=0 if shared else len(req.prompt),
                       shared_prompt=shared)
        if self.cfg.law == "typical":
            run.typical = {"enabled": True, "threshold": self.cfg.typical_threshold, "eps": self.cfg.typical_eps,
                           "distribution_exact": False}
        run.prefill_s = time.perf_counter() - t0
        self.runs[req.index] = run
        return Row(req, list(req.prompt), self._key(req), run, t0)

    def _refill(self, queue: deque) -> None:
        for b, row in enumerate(self.rows):
            if row.done and queue:
                self.rows[b] = self._start(b, queue)
        live = [b for b, r in enumerate(self.rows) if not r.done]
        if len(live) < len(self.rows):  # nothing left to refill these rows with
            for b, row in enumerate(self.rows):
                if row.done:  # (a policy learns what the row's pending drafts came to, as at a refill)
                    self.controller.reset(b)
            self.rows = [self.rows[b] for b in live]
            for part in (self.target, self.drafter):
                part.keep_rows(live)
            keep_members(self.controller, live)

    def _chain(self, c: "Cycle | None") -> tuple[str | None, int] | None:
        """The plan of a plain step to launch while plain step `c` is in flight, or None: always without a drafter;
        under a policy, when it plans one from the committed tokens (one row in one process, no hidden states to
        hand a drafter, a target that can undo a step)."""
        if c is None or c.width:
            return None
        if not self.drafter.speculates:
            return None, 0
        if self.link or len(self.rows) != 1 or self.drafter.needs_hidden or self.target.one_row:
            return None
        # a step launched unchained was planned from these very contexts and counts: its plan holds
        plan = c.plan or self._plan([r.context for r in self.rows])
        return plan if plan[1] == 0 else None

    def _plan(self, contexts: list[list[int]]) -> tuple[str | None, int]:
        """(source, width): the source is the drafter's own unless the controller chooses among several."""
        if not self.drafter.speculates:
            return None, 0
        source, width = self.controller.plan(contexts)
        return (source or self.drafter.name) if width else None, width

    def _launch(self, prev: Cycle | None, plan: tuple[str | None, int] | None = None) -> Cycle:
        """Plan, propose and launch one target pass. With `prev` (a plain step still on the device), rows it
        holds start from its tokens on the device, without waiting for them."""
        t0 = time.perf_counter()
        cfg, rows = self.cfg, self.rows
        keys_before = [r.key for r in rows]
        splits = [(None,) * 3 if cfg.sampling.greedy else mx.random.split(r.key, 3) for r in rows]
        for r, s in zip(rows, splits):
            r.key = s[0]  # (greedy decoding draws nothing: no keys)
        contexts = [r.context for r in rows]
        given = plan is not None  # (planned before, from older contexts)
        source, width = plan or self._plan(contexts)
        caps = [max(0, min(width, r.req.max_tokens - r.generated - 1)) for r in rows]
        draft = empty(caps)
        if max(caps) > 0:
            draft = self.drafter.propose(contexts, caps, cfg.sampling, [s[1] for s in splits], source=source)
        if self.link:  # rank 0's drafts on every rank
            draft, source = self.link.share_draft(draft, source)
        at = {} if prev is None else {id(r): i for i, r in enumerate(prev.rows)}
        idx = [at.get(id(r), -1) for r in rows]
        if prev is not None and idx == list(range(len(prev.rows))):  # the same rows: their tokens as they are
            last = prev.verdict.token.astype(mx.int32)
        else:
            last = mx.array([c[-1] for c in contexts], dtype=mx.int32)
            if at:  # rows still in flight start from their device tokens, new rows from their prompts
                token = prev.verdict.token[mx.array([max(i, 0) for i in idx], dtype=mx.int32)]
                last = mx.where(mx.array([i >= 0 for i in idx]), token, last).astype(mx.int32)
        if draft.k:
            self.target.checkpoint()  # recurrent targets: snapshot before the speculative tokens
        before = self.target.pos.copy()
        block = mx.concatenate([last[:, None], draft.tokens], axis=1) if draft.k else last[:, None]
        logits = self.target.forward(block)  # (B, k+1, V)
        keys = [s[2] for s in splits]
        # a chained plain step that a redo replaces is undone (`_discard`); a recurrent target cannot undo one
        full = self.target.one_row and not self.drafter.speculates
        v, sums, complete = (self.link.judge if self.link else judge)(cfg, logits, draft.tokens, draft.q, keys,
                                                                      draft.lengths, full)
        conf = None
        if self.drafter.speculates and hasattr(self.controller, "observe") and not self.link:  # a policy's evidence
            top = logits if logits.dtype == mx.float32 else logits.astype(mx.float32)  # (no copy on a CPU)
            conf = mx.exp(top.max(axis=-1) - mx.logsumexp(top, axis=-1))
        t_eval = time.perf_counter()
        mx.async_eval(v.n_accepted, v.token, draft.tokens, *sums, *([] if complete is None else [complete]),
                      *([] if conf is None else [conf]))
        t_eval = time.perf_counter() - t_eval
        return Cycle(list(rows), draft.k, draft.lengths, draft.requested, draft.tokens, v, sums, before, t0,
                     source=source if draft.k else None, planned=source if max(caps) > 0 else None, complete=complete,
                     redo=(logits, draft.q, keys) if complete is not None else (), keys=keys_before,
                     plan=None if given else (source, width), chances=draft.chances, chained=prev is not None,
                     launch_s=t_eval, conf=conf)

    def _discard(self, c: Cycle) -> None:
        """Undo a launched plain step that was not read: its cache entries and its keys."""
        self.target.truncate(c.before)
        for r, key in zip(c.rows, c.keys):
            r.key = key

    def _complete(self, c: Cycle) -> Iterator[Event]:
        """ONE host sync, then commit and roll back what the law rejected, and record."""
        if all(r.done for r in c.rows):  # a plain step launched for rows that finished meanwhile: not awaited
            for r in c.rows:  # (its pass, where the launch ran it, was lent by the step before: the run paid it)
                r.run.decode_s += min(c.launch_s, max(self._t_last - c.t0, 0.0))
            return
        if c.complete is not None and not c.complete.item():  # rare: a nucleus past the partial selection
            logits, q, keys = c.redo
            c.verdict, c.sums, _ = judge(self.cfg, logits, c.drafts, q, keys, c.lengths, full=True)
            c.redone = True
        if self.link:  # rank 0's verdict on every rank
            self.link.share_verdict(c)
        tok = c.verdict.token.tolist()
        n_acc, d = (c.verdict.n_accepted.tolist(), c.drafts.tolist()) if c.width else ([0] * len(tok), [[]] * len(tok))
        sums = [x.tolist() for x in c.sums]
        if c.width:
            self.target.truncate(c.before + np.array(n_acc) + 1)
        news = [d[b][: n_acc[b]] + [tok[b]] for b in range(len(c.rows))]
        contexts = [r.context for r in c.rows]
        for ctx, new in zip(contexts, news):
            ctx.extend(new)
        now = time.perf_counter()
        # chained plain steps overlap: count each moment once, and each launch for the cycle it launched
        seconds = max(now - max(c.t0, self._t_last) - c.lent + min(c.launch_s, max(self._t_last - c.t0, 0.0)), 0.0)
        self._t_last = now
        if self.drafter.speculates:  # (c.rows are the batch's rows: cycles are chained for one row only)
            self.drafter.commit(contexts, n_acc, self.target.hidden)
            self.controller.update(c.lengths, n_acc, seconds=seconds if c.timed else None, source=c.planned,
                                   requested=c.requested, chances=c.chances, chained=c.chained)
            if c.conf is not None:  # at the committed tokens only (after `update`, which learns at what it planned on)
                self.controller.observe([cs[: n + 1] for cs, n in zip(c.conf.tolist(), n_acc)])
        self.cycles += any(not r.done for r in c.rows)
        for b, r in enumerate(c.rows):
            if not r.done:  # a row that finished while this plain step was in flight: its step is dropped
                yield from self._record(b, r, c.source, c.lengths[b], c.requested[b], n_acc[b], news[b], seconds,
                                        [x[b] for x in sums], now)

    def _record(self, b: int, r: Row, source: str | None, k: int, requested: int, n: int, new: list[int],
                seconds: float, typical: list, now: float) -> Iterator[Event]:
        stop = next((i for i, t in enumerate(new) if t in self.eos), None)
        counted = new if stop is None else new[: stop + 1]  # nothing after an EOS counts
        run = r.run
        run.floor_cut += k < requested
        run.record_cycle(k, min(n, len(counted)), len(counted), source, seconds)
        if typical:
            run.record_typical(min(n + 1, k), n, n < k, *typical)
        if run.ttft_s is None:
            run.ttft_s = now - r.started
        r.generated += len(counted)
        r.done = stop is not None or r.generated >= r.req.max_tokens
        if r.done:
            run.peak_memory_bytes = mx.get_peak_memory()
            # (b indexes the controller's members only when cycles are not chained, i.e. when drafting)
            run.controller_estimate = self.controller.estimate(b) if self.drafter.speculates else None
        if stop is not None:
            yield Event(r.req.index, new[:stop], "stop")
        elif r.done:
            yield Event(r.req.index, new, "length")
        else:
            yield Event(r.req.index, new)
