"""The decode engine: requests in, events out; one prompt is a batch of one row.

`Engine.cycle` is the algorithm, for the whole batch: plan ONE source and width (the policy), propose (the drafter),
one target pass over every row, the law, one host sync, commit, roll back. Rows that finish are refilled from the
queue, then leave the batch. A row draws only with its own keys, so at a fixed width it gives exactly the tokens it
gives alone. Beside the cycle: the overlap (a plain step is launched before the previous one is read back, as
mlx-lm's own loop does), the clock (the seconds each cycle is charged) and the peer (a sharded target's ranks).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Iterator

import mlx.core as mx
import numpy as np

from . import verify
from .cache import LM
from .controller import FixedWidth, Plan
from .drafters import NoDraft, empty, with_forced
from .sampling import SamplingParams
from .stats import RunStats

PLAIN = Plan(None, 0)
FORCED = "forced"  # the source of the tokens a constraint forces (constrain.Guide.forced)
FORCED_MAX = 16  # the most forced tokens a row drafts in a cycle (each is sure to pass)


@dataclass(frozen=True)
class DecodeConfig:
    sampling: SamplingParams = SamplingParams()  # (a request carries its own max_tokens and seed)
    typical_threshold: float = 0.0  # 0 = the exact law
    typical_eps: float = 1.0
    prefill_step: int = 512

    @property
    def law(self) -> str:
        return "greedy" if self.sampling.greedy else "typical" if self.typical_threshold > 0 else "exact"

    def judge(self, logits, draft, keys, full: bool = False) -> verify.Judged:
        return verify.judge(self.sampling, self.typical_threshold, self.typical_eps, logits, draft.tokens, draft.q,
                            keys, draft.lengths, full, shape=draft.tree)


@dataclass
class Request:
    index: int
    prompt: list[int]
    max_tokens: int
    seed: int
    completion: int = 0  # the c-th completion of its prompt and seed (-n): its keys are the (c+1)-th split
    grammar: str | None = None  # the constraint its output matches (constrain.py), None: none


@dataclass
class Event:
    request: int
    tokens: list[int]  # newly committed tokens (EOS excluded)
    finish_reason: str | None = None  # "stop" | "length" when the request ends
    incomplete: bool = False  # it ended before its constraint's value was complete (length reached mid-value)


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
class Flight:
    """A cycle whose pass is on the device and not read back yet."""
    rows: list[Row]
    plan: Plan
    keys: list  # the rows' keys before the cycle split them (restored if it is undone)
    t0: float
    reuse: Plan | None = None  # its plan, when made from the contexts it was launched with
    width: int = 0
    before: np.ndarray | None = None  # the target's positions before its pass
    token: mx.array | None = None  # (B,) each row's next token, on the device
    rest: Iterator | None = None  # the rest of the cycle: host sync, commit, roll back
    redone: bool = False  # judged again (a nucleus past the partial selection): its token may have changed
    launch_s: float = 0.0  # seconds its launch took (see Clock)
    lent: float = 0.0  # seconds of the next cycle's launch spent while this one was unread
    timed: bool = True  # its seconds are its own pass (not a relaunch charged the pass a redo undid)


class Clock:
    """Charges each cycle its own seconds: plain steps launched ahead overlap, so each moment is counted once and
    each launch for the cycle it launched (on a CPU a launch computes most of its pass; on a GPU it returns at once
    and nothing is lent)."""

    def __init__(self):
        self.last = time.perf_counter()  # the last read (or refill)

    def charge(self, f: Flight) -> float:
        now = time.perf_counter()
        seconds = now - max(f.t0, self.last) - f.lent + min(f.launch_s, max(self.last - f.t0, 0.0))
        self.last = now
        return max(seconds, 0.0)

    def unread(self, f: Flight) -> None:
        """A step launched ahead for rows that finished meanwhile: its launch is the run's."""
        for r in f.rows:
            r.run.decode_s += min(f.launch_s, max(self.last - f.t0, 0.0))


class Alone:
    """The peer of a target in one process: every call passes through (distributed.sharded.Peer: several ranks)."""

    lookahead = True  # a policy's plain steps may be launched ahead
    redo = True  # a verdict may be judged again after a step was launched ahead of it (and that step undone)

    def share_draft(self, draft, source):
        return draft, source

    def judged(self, judged: verify.Judged, logits) -> verify.Judged:
        return judged

    def verdict(self, judged: verify.Judged, width: int) -> tuple[list[int], list[int]]:
        tok = judged.verdict.token.tolist()
        return (judged.verdict.n_accepted.tolist() if width else [0] * len(tok)), tok

    def prefill(self) -> None:
        pass

    def end(self) -> None:
        pass


class KeyChains:
    """Completion c of seed s draws with the (c+1)-th split of key(s); each seed's chain goes on where it stopped."""

    def __init__(self):
        self.chains: dict[int, tuple[mx.array, int]] = {}

    def __call__(self, req: Request) -> mx.array:
        key, done = self.chains.get(req.seed, (mx.random.key(req.seed), 0))
        if done > req.completion:
            key, done = mx.random.key(req.seed), 0
        while done <= req.completion:
            key, sub = mx.random.split(key)
            done += 1
        self.chains[req.seed] = (key, done)
        return sub


def confidence(logits: mx.array) -> mx.array:
    """(B, k+1) the target's largest probability at temperature 1 (what a policy observes)."""
    top = logits if logits.dtype == mx.float32 else logits.astype(mx.float32)  # (no copy on a CPU)
    return mx.exp(top.max(axis=-1) - mx.logsumexp(top, axis=-1))


class Engine:
    def __init__(self, model, drafter=None, policy=None, eos_token_ids=(), config=DecodeConfig(),
                 batch_size: int = 1, peer=None, guide=None, trees: bool = False, shelf=None):
        """`trees`: the target verifies draft trees; `shelf`: its prefills kept across runs (cache.LM)."""
        self.drafter = drafter or NoDraft()
        self.guide = guide  # constrain.Guide: the rows' constraints (None: no row has one; the drafter's, made with it)
        self.target = LM(model, "target model", config.prefill_step, hidden=self.drafter.needs_hidden,
                         taps=self.drafter.taps, trees=trees, shelf=shelf)
        if self.drafter.speculates:
            self.target.require_rollback()  # refused before any decoding, not at the first rejection
        self.policy = policy or FixedWidth(0)
        self.peer = peer or Alone()
        self.eos, self.cfg = set(eos_token_ids), config
        limits = [batch_size] + [m for m in (self.drafter.max_rows, 1 if self.target.one_row else None) if m]
        self.batch_size = max(1, min(limits))
        self.runs: dict[int, RunStats] = {}  # request index -> its statistics
        self.cycles, self.wall_s = 0, 0.0
        self.incomplete = 0  # requests that ended before their constraint's value was complete
        self.rows: list[Row] = []
        self.clock = Clock()
        self._key = KeyChains()

    @property
    def stats(self) -> RunStats:
        return RunStats.total(list(self.runs.values()))

    def generate(self, requests: list[Request]) -> Iterator[Event]:
        """Events of every request, in the order they happen."""
        t_start = time.perf_counter()
        queue = deque(requests)
        n = min(self.batch_size, len(queue))
        for part in (self.target, self.drafter, self.guide):
            if part is not None:
                part.keep_rows([])
                part.add_rows(n)
        self.policy.start(n, self.cfg.law)
        self.rows = [self._start(b, queue) for b in range(n)]
        flight = None
        try:
            while self.rows or flight:
                ahead = self._ahead(flight)  # the overlap: a plain step to launch while `flight` is on the device
                nxt = self._launch(ahead, after=flight) if ahead else None
                if flight is not None:
                    flight.lent += nxt.launch_s if nxt else 0.0
                    yield from flight.rest
                    if nxt is not None and flight.redone:  # nxt started from a token the redo replaced
                        nxt = self._relaunch(nxt)
                    self._refill(queue)
                    self.clock.last = time.perf_counter()  # a refill's prefill is its own row's, not decode time
                flight = nxt or (self._launch(self._plan(), fresh=True) if self.rows else None)
            self.peer.end()
        finally:
            self.wall_s = time.perf_counter() - t_start

    def cycle(self, plan: Plan, after: Flight | None = None) -> Iterator:
        """ONE cycle of the batch: it yields its Flight once the pass is launched (a plain step may be launched after
        it before it is read: `after`, whose tokens are still on the device), then the events of what it committed."""
        rows, cfg = list(self.rows), self.cfg
        f = Flight(rows, plan, [r.key for r in rows], time.perf_counter())
        keys = [(None, None) if cfg.sampling.greedy else self._split(r) for r in rows]  # the draft's, the law's
        contexts = [r.context for r in rows]
        draft, source, forced, caps = self._propose(rows, plan, [k[0] for k in keys])
        masks = self.guide.masks(draft) if self.guide is not None else None
        if masks is not None and draft.tree is None and draft.q is None:  # a forbidden deterministic draft: p = 0
            draft.lengths = [min(n, a) for n, a in zip(draft.lengths, masks[1])]  # (rejected surely: cut before)
        if draft.k:
            self.target.checkpoint()  # recurrent layers: the state to roll back to
        f.before, f.width = self.target.pos.copy(), draft.k
        last = self._last(rows, after)[:, None]
        logits = self.target.forward(mx.concatenate([last, draft.tokens], axis=1) if draft.k else last,
                                     tree=draft.tree)
        if masks is not None:  # the law samples the restricted p: masked before the sampler's filters
            logits = mx.where(masks[0], logits, -mx.inf)
        # plain decoding launches every step ahead: judged in full where such a step could not be undone
        full = not self.drafter.speculates and (self.target.one_row or not self.peer.redo)
        law_keys = [k[1] for k in keys]
        judged = self.peer.judged(cfg.judge(logits, draft, law_keys, full), logits)
        conf = confidence(logits) if self.drafter.speculates and self.policy.observes else None
        launched = time.perf_counter()
        mx.async_eval(judged.verdict.n_accepted, judged.verdict.token, draft.tokens, *judged.sums,
                      *[x for x in (judged.complete, conf, judged.verdict.node) if x is not None])
        f.launch_s = time.perf_counter() - launched
        f.token = judged.verdict.token
        yield f
        if all(r.done for r in rows):  # launched ahead for rows that finished meanwhile: not read
            return self.clock.unread(f)
        if judged.complete is not None and not judged.complete.item():  # rare: a nucleus past the partial selection
            judged, f.redone = cfg.judge(logits, draft, law_keys, True), True
        n_acc, tok = self.peer.verdict(judged, draft.k)  # THE host sync (rank 0's verdict on every rank)
        news, chain, kept, at = self._keep(rows, draft, judged, n_acc, tok, f.before)  # roll back the rejected
        for b, (ctx, new) in enumerate(zip(contexts, news)):
            ctx.extend(new)
            if self.guide is not None:
                self.guide.commit(b, new)
        seconds = self.clock.charge(f)
        if self.drafter.speculates:  # (rows launched ahead are the batch's rows: only one row is)
            self._learn(contexts, plan, draft, forced, caps, chain, kept, at, seconds if f.timed else None, conf)
        self.cycles += 1
        sums = [x.tolist() for x in judged.sums]
        for b, r in enumerate(rows):
            if not r.done:  # a row that finished while this step was in flight: its step is dropped
                caught = draft.caught_up[b] if draft.caught_up else 0  # a draft model's catch-up: its prefill
                r.run.draft_prefill_tokens += caught
                r.run.draft_cached_tokens += draft.kept_up[b] if draft.kept_up else 0
                r.run.draft_prefill_s += draft.catch_up_s if caught else 0.0
                spent = max(seconds - (draft.catch_up_s if caught else 0.0), 0.0)
                yield from self._record(r, FORCED if forced[b] else source if draft.k else None, draft.lengths[b],
                                        draft.requested[b], n_acc[b], news[b], spent, [x[b] for x in sums], b)

    # ---- the parts around the cycle --------------------------------------------------------------------------
    def _propose(self, rows: list[Row], plan: Plan, keys: list) -> tuple:
        """The batch's draft, its source, each row's forced tokens (free drafts, taken before and whatever the width
        of the plan's) and what the plan's source was asked for."""
        caps = [max(0, min(plan.width, r.req.max_tokens - r.generated - 1)) for r in rows]
        forced = self.guide.forced([max(0, min(FORCED_MAX, r.req.max_tokens - r.generated - 1)) for r in rows]) \
            if self.guide is not None and self.guide.active and self.drafter.speculates else [[] for _ in rows]
        caps = [0 if x else c for x, c in zip(forced, caps)]
        draft = self.drafter.propose([r.context for r in rows], caps, self.cfg.sampling, keys, plan) if max(caps) \
            else empty(caps)
        draft = with_forced(draft, forced) if any(forced) else draft
        return (*self.peer.share_draft(draft, plan.source), forced, caps)  # rank 0's drafts on every rank

    def _learn(self, contexts, plan: Plan, draft, forced, caps, chain, kept, at, seconds, conf) -> None:
        """The drafter and the policy learn what a cycle committed (forced drafts tell a policy nothing)."""
        if any(forced) and max(caps):  # a source drafted for the other rows: the forced rows drafted nothing of its
            chain, kept = [0 if x else n for x, n in zip(forced, chain)], [0 if x else n for x, n in zip(forced, kept)]
        self.drafter.commit(contexts, kept, self.target.hidden)
        if max(caps) or not any(forced):
            self.policy.update(chain, kept, seconds=seconds, source=plan.source if max(caps) else None,
                               requested=[0 if x else n for x, n in zip(forced, draft.requested)],
                               chances=draft.chances and [[] if x else c for x, c in zip(forced, draft.chances)],
                               tree=draft.tree is not None)
            if conf is not None:  # at the committed tokens only (after `update`, which learns at what it planned on)
                self.policy.observe([[cs[j] for j in js] for cs, js in zip(conf.tolist(), at)])

    def _keep(self, rows: list[Row], draft, judged: verify.Judged, n_acc: list[int], tok: list[int],
              before: np.ndarray) -> tuple[list[list[int]], list[int], list[int], list]:
        """The target keeps each row's accepted drafts: the committed tokens, what a drafter and a policy learn from
        (for a tree: its first-child chain, and how much of the path followed it; its seconds are not a chain's),
        and the positions of the pass the committed tokens came from."""
        drafted = draft.tokens.tolist() if draft.k else [[]] * len(rows)
        if draft.tree is None:
            if draft.k:
                self.target.truncate(before + np.array(n_acc) + 1)
            return ([d[:n] + [t] for d, n, t in zip(drafted, n_acc, tok)], draft.lengths, n_acc,
                    [range(n + 1) for n in n_acc])
        paths = [draft.tree.path(b, v) for b, v in enumerate(judged.verdict.node.tolist())]
        self.target.keep_path(before, paths)
        chain, kept = [draft.tree.chain(b) for b in range(len(rows))], [draft.tree.followed(p) for p in paths]
        for r, n, p, c in zip(rows, draft.lengths, paths, kept):
            if n:
                r.run.record_tree(n, len(p), c < len(p))
        news = [[d[j - 1] for j in p] + [t] for d, p, t in zip(drafted, paths, tok)]
        return news, chain, kept, [[0] + p for p in paths]

    def _launch(self, plan: Plan, after: Flight | None = None, fresh: bool = False) -> Flight:
        rest = self.cycle(plan, after)
        f = next(rest)
        f.rest, f.reuse = rest, plan if fresh else None
        return f

    def _plan(self) -> Plan:
        """The source is the drafter's own unless the policy chooses among several; width 0 is a plain step."""
        plan = self.policy.plan([r.context for r in self.rows], [r.req.max_tokens - r.generated for r in self.rows]) \
            if self.drafter.speculates else PLAIN
        return replace(plan, source=plan.source or self.drafter.name) if plan.width else PLAIN

    def _ahead(self, f: Flight | None) -> Plan | None:
        """The plan of a plain step to launch while plain step `f` is in flight, or None: always without a drafter;
        under a policy when it plans one (one row, no hidden states to hand a drafter, a target that can undo). Never
        while a row of `f` waits for its first token: on a CPU a launch computes its pass, so that token would wait
        for the next one's pass too."""
        if f is None or f.width or not any(r.generated + 1 < r.req.max_tokens for r in self.rows):
            return None
        if any(r.generated == 0 for r in f.rows):
            return None
        if self.guide is not None and self.guide.active:  # the next step's mask needs this step's token
            return None
        if not self.drafter.speculates:
            return PLAIN
        if not self.peer.lookahead or len(self.rows) != 1 or self.drafter.needs_hidden or self.target.one_row:
            return None
        plan = f.reuse or self._plan()  # a step launched on its own was planned from these very contexts
        return plan if plan.width == 0 else None

    def _relaunch(self, f: Flight) -> Flight:
        """Undo a plain step launched ahead (cache entries, keys) and launch it from the redone token; charged the
        pass it undid, its seconds are not a plain step's cost."""
        self.target.truncate(f.before)
        for r, key in zip(f.rows, f.keys):
            r.key = key
        again = self._launch(f.plan)
        again.lent -= f.launch_s
        again.timed = False
        return again

    def _split(self, r: Row) -> tuple:
        r.key, draft_key, law_key = mx.random.split(r.key, 3)
        return draft_key, law_key

    def _last(self, rows: list[Row], after: Flight | None) -> mx.array:
        """Each row's last token: on the device for rows of a step still in flight, else its context's."""
        at = {} if after is None else {id(r): i for i, r in enumerate(after.rows)}
        idx = [at.get(id(r), -1) for r in rows]
        if after is not None and idx == list(range(len(after.rows))):  # the same rows: their tokens as they are
            return after.token.astype(mx.int32)
        last = mx.array([r.context[-1] for r in rows], dtype=mx.int32)
        if not at:
            return last
        token = after.token[mx.array([max(i, 0) for i in idx], dtype=mx.int32)]  # new rows: their prompts'
        return mx.where(mx.array([i >= 0 for i in idx]), token, last).astype(mx.int32)

    def _start(self, b: int, queue: deque) -> Row:
        t0 = time.perf_counter()
        self.peer.prefill()  # every rank prefills the same rows: rank 0's verdict first
        req = queue.popleft()
        again = bool(queue) and queue[0].prompt == req.prompt  # -n: the next request prefills nothing
        hidden = self.target.set_row(b, req.prompt[:-1], keep=again)
        t1 = time.perf_counter()
        self.drafter.start(b, req.prompt, hidden, keep=again)
        t2 = time.perf_counter()
        if self.guide is not None:
            self.guide.start(b, req.grammar)
        self.policy.reset(b)
        shared, cached = self.target.reused, self.target.cached
        run = RunStats(prompt_tokens=len(req.prompt), prefill_tokens=0 if shared else len(req.prompt) - cached,
                       shared_prompt=shared, prompt_cached_tokens=cached, draft_cached_tokens=self.drafter.cached)
        run.draft_prefill_tokens = 0 if shared else self.drafter.prefilled  # (a deferred draft model: when it joins)
        if self.cfg.law == "typical":
            run.typical = {"enabled": True, "threshold": self.cfg.typical_threshold, "eps": self.cfg.typical_eps,
                           "distribution_exact": False}
        run.prefill_s, run.draft_prefill_s = t1 - t0, t2 - t1
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
                    self.policy.reset(b)
            self.rows = [self.rows[b] for b in live]
            for part in (self.target, self.drafter, self.guide):
                if part is not None:
                    part.keep_rows(live)
            self.policy.keep(live)

    def _record(self, r: Row, source: str | None, k: int, requested: int, n: int, new: list[int], seconds: float,
                typical: list, b: int) -> Iterator[Event]:
        stop = next((i for i, t in enumerate(new) if t in self.eos), None)
        counted = new if stop is None else new[: stop + 1]  # nothing after an EOS counts
        run = r.run
        run.cut_short += k < requested
        run.record_cycle(k, min(n, len(counted)), len(counted), source, seconds)
        run.forced_tokens += min(n, len(counted)) if source == FORCED else 0
        if typical:
            run.record_typical(min(n + 1, k), n, n < k, *typical)
        if run.ttft_s is None:
            run.ttft_s = self.clock.last - r.started
        r.generated += len(counted)
        r.done = stop is not None or r.generated >= r.req.max_tokens
        if r.done:
            run.peak_memory_bytes = mx.get_peak_memory()
            # (b indexes the policy's members only when cycles are not launched ahead, i.e. when drafting)
            run.width_estimate = self.policy.estimate(b) if self.drafter.speculates else None
        incomplete = r.done and self.guide is not None and not self.guide.complete(b)
        self.incomplete += incomplete
        yield Event(r.req.index, new[:stop], "stop" if stop is not None else "length" if r.done else None, incomplete)
