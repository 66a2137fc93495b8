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
            if hasattr(self.controller, "reset"):
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
        drafts = proposal.tokens[None]
        law, sp = self.cfg.law, self.cfg.sampling
        if law == "greedy":
            v = verify.greedy(logits, drafts)
        elif law == "exact":
            q = None if proposal.q is None else proposal.q[None]
            v = verify.exact(probs(logits, sp), q, drafts, key)
        else:
            v = verify.typical(probs(logits, sp), drafts, key, self.cfg.typical_threshold, self.cfg.typical_eps)
        if v.entropy is None:
            mx.eval(v.n_accepted, v.token)
            return v.n_accepted.item(), v.token.item()
        k = proposal.k
        reached = mx.arange(k) <= v.n_accepted[0]  # positions the typical test looked at
        h_sum = (v.entropy[0, :k] * reached).sum()
        f_sum = (v.floor[0, :k] * reached).sum()
        mx.eval(v.n_accepted, v.token, h_sum, f_sum)
        n_acc = v.n_accepted.item()
        run.record_typical(min(n_acc + 1, k), n_acc, n_acc < k, h_sum.item(), f_sum.item())
        return n_acc, v.token.item()
