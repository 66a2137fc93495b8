"""The decode loop: prefill, then cycles of draft -> verify (one target pass) -> commit -> roll back."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx

from . import verify
from .controller import FixedWidth
from .drafters import NoDraft, Proposal
from .lm import CachedLM
from .sampling import SamplingParams, probs
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


def judge(cfg: DecodeConfig, logits: mx.array, drafts: mx.array, q: mx.array | None, key,
          lengths: list[int] | None = None) -> tuple[verify.Verdict, list[mx.array]]:
    """The configured acceptance law on one verify pass (B rows). For the typical law also, per row, the entropy and
    the floor summed over the positions its test reached (for the statistics); [] for the other laws."""
    sp = cfg.sampling
    if cfg.law == "greedy":
        return verify.greedy(logits, drafts, lengths), []
    if cfg.law == "exact":
        return verify.exact(probs(logits, sp), q, drafts, key, lengths), []
    v = verify.typical(probs(logits, sp), drafts, key, cfg.typical_threshold, cfg.typical_eps, lengths)
    k = drafts.shape[1]
    pos = mx.arange(k)[None]
    reached = pos <= v.n_accepted[:, None]
    if lengths is not None:
        reached = reached & (pos < mx.array(lengths)[:, None])
    return v, [(v.entropy[:, :k] * reached).sum(1), (v.floor[:, :k] * reached).sum(1)]


def new_run(cfg: DecodeConfig, prompt_tokens: int) -> RunStats:
    run = RunStats(prompt_tokens=prompt_tokens)
    if cfg.law == "typical":
        run.typical = {"enabled": True, "threshold": cfg.typical_threshold, "eps": cfg.typical_eps,
                       "distribution_exact": False}
    return run


@dataclass
class Event:
    completion: int
    tokens: list[int]  # newly committed tokens (EOS excluded)
    finish_reason: str | None = None  # "stop" | "length" when the completion ends


class Engine:
    def __init__(self, model, drafter=None, controller=None, eos_token_ids=(), config=DecodeConfig()):
        self.drafter = drafter or NoDraft()
        self.target = CachedLM(model, role="target model", prefill_step=config.prefill_step,
                               hidden=self.drafter.needs_hidden)
        self.controller = controller or FixedWidth(0)
        self.eos = set(eos_token_ids)
        self.cfg = config
        if not isinstance(self.drafter, NoDraft):
            self.target.require_rollback()  # refuse before any decoding, not at the first rejection
        self.runs: list[RunStats] = []  # one per completion; the first also carries the prefill

    @property
    def stats(self) -> RunStats:
        """The aggregate over all completions so far."""
        total = self.runs[0] if self.runs else RunStats()
        for run in self.runs[1:]:
            total = total.merge(run)
        return total

    def _new_run(self, prompt_tokens: int) -> RunStats:
        run = new_run(self.cfg, prompt_tokens)
        self.runs.append(run)
        return run

    def generate(self, prompt: list[int], n: int = 1) -> Iterator[Event]:
        """Decode `n` independent completions of `prompt`, which is prefilled once."""
        t0 = time.perf_counter()
        hidden = self.target.prefill(prompt[:-1])
        self.drafter.begin(prompt, hidden)
        prefill_s = time.perf_counter() - t0
        prompt_offset = self.target.offset
        self.target.mark(base=True)  # recurrent targets: the state to come back to for each completion
        key = mx.random.key(self.cfg.seed)
        for c in range(n):
            run = self._new_run(len(prompt))
            if c == 0:
                run.prefill_tokens, run.prefill_s = len(prompt), prefill_s
            self.target.rollback(prompt_offset)
            self.drafter.restart()
            self.controller.reset()
            key, sub = mx.random.split(key)
            try:
                yield from self._complete(c, list(prompt), sub, t0 if c == 0 else time.perf_counter(), run)
            finally:
                run.peak_memory_bytes = mx.get_peak_memory()
                run.controller_estimate = self.controller.estimate()

    def _complete(self, c: int, context: list[int], key: mx.array, t0: float, run: RunStats) -> Iterator[Event]:
        generated = 0
        while True:
            remaining = self.cfg.max_tokens - generated
            if remaining <= 0:
                yield Event(c, [], "length")
                return
            t_cycle = time.perf_counter()
            key, k_draft, k_verify = mx.random.split(key, 3)
            width = min(self.controller.width(), remaining - 1)
            proposal = self.drafter.propose(context, width, self.cfg.sampling, k_draft)
            n_acc, token = self._verify(context[-1], proposal, k_verify, run)
            new = proposal.tokens[:n_acc].tolist() + [token] if n_acc else [token]
            self.target.rollback(self.target.offset - proposal.k + n_acc)
            context.extend(new)
            self.drafter.commit(context, proposal, n_acc, self.target.hidden)
            self.controller.update([proposal.k], [n_acc], seconds=time.perf_counter() - t_cycle)
            run.floor_cut += proposal.k < proposal.requested
            run.record_cycle(proposal.k, n_acc, len(new))
            run.decode_s += time.perf_counter() - t_cycle
            if run.ttft_s is None:
                run.ttft_s = time.perf_counter() - t0
            generated += len(new)
            stop = next((i for i, t in enumerate(new) if t in self.eos), None)
            if stop is not None:
                yield Event(c, new[:stop], "stop")
                return
            yield Event(c, new)

    def _verify(self, last: int, proposal: Proposal, key: mx.array, run: RunStats) -> tuple[int, int]:
        """One target pass over [last, drafts...]; the acceptance law; ONE host synchronisation."""
        inputs = mx.concatenate([mx.array([last], mx.int32), proposal.tokens])
        if proposal.k:
            self.target.mark()  # recurrent targets: snapshot before verify (no-op otherwise)
        logits = self.target.forward(inputs)  # (1, k+1, V)
        q = None if proposal.q is None else proposal.q[None]
        v, sums = judge(self.cfg, logits, proposal.tokens[None], q, key)
        mx.eval(v.n_accepted, v.token, *sums)
        n_acc, k = v.n_accepted.item(), proposal.k
        if sums:
            run.record_typical(min(n_acc + 1, k), n_acc, n_acc < k, sums[0].item(), sums[1].item())
        return n_acc, v.token.item()
