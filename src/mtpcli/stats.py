"""Per-run cycle statistics: collected by the engine, merged over completions, kept as records (`to_dict`: what the
run log and --stats-json hold); tables.py renders them."""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

PLAIN = "plain"  # the name of width-0 cycles (plain decoding steps) in per-source statistics
REQUIRED = ("prompt_tokens", "generated_tokens", "cycles", "drafted", "accepted", "acceptance_rate", "tokens_per_cycle",
            "accept_by_position", "accept_length_hist", "draft_width_hist", "prefill_tps", "decode_tps",
            "peak_memory_bytes")  # what a run's record always has (summary_rows)


@dataclass
class _Drafts:
    """What a run and each source's share of it count alike: cycles, drafted and accepted tokens, by position."""

    cycles: int = 0
    drafted: int = 0
    accepted: int = 0
    reached: list[int] = field(default_factory=list)  # cycles that drafted position i
    accepted_at: list[int] = field(default_factory=list)  # cycles that accepted position i

    def _count(self, drafted: int, accepted: int) -> None:
        self.cycles += 1
        self.drafted += drafted
        self.accepted += accepted
        self.reached = _add(self.reached, [1] * drafted)
        self.accepted_at = _add(self.accepted_at, [int(i < accepted) for i in range(drafted)])

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def accept_by_position(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted_at, self.reached)]


def _add(xs: list[int], ys: list[int]) -> list[int]:
    """Per-position sums of two counts of different lengths."""
    return [a + b for a, b in zip_longest(xs, ys, fillvalue=0)]


@dataclass
class SourceStats(_Drafts):
    """One draft source's share of a run (or the plain steps')."""

    committed: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_cycle(self) -> float:
        return self.committed / self.cycles if self.cycles else 0.0

    def record(self, drafted: int, accepted: int, committed: int, seconds: float) -> None:
        self._count(drafted, accepted)
        self.committed += committed
        self.seconds += seconds

    def merge(self, other: "SourceStats") -> "SourceStats":
        return SourceStats(self.cycles + other.cycles, self.drafted + other.drafted, self.accepted + other.accepted,
                           _add(self.reached, other.reached), _add(self.accepted_at, other.accepted_at),
                           self.committed + other.committed, self.seconds + other.seconds)

    def to_dict(self, total_s: float) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("cycles", "drafted", "accepted", "committed", "seconds", "acceptance_rate",
                                           "tokens_per_cycle", "accept_by_position")}
        return d | {"reached_by_position": list(self.reached),
                    "time_share": self.seconds / total_s if total_s > 0 else 0.0}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SourceStats":
        reached = list(d.get("reached_by_position", []))
        accepted_at = [round(a * r) for a, r in zip(d.get("accept_by_position", []), reached)]  # back from the rates
        return cls(d.get("cycles", 0), d.get("drafted", 0), d.get("accepted", 0), reached, accepted_at,
                   d.get("committed", 0), d.get("seconds", 0.0))


@dataclass
class RunStats(_Drafts):
    """One request's decoding (or several merged): counts, histograms, traces, timings, per-source shares."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    accept_lengths: Counter = field(default_factory=Counter)
    draft_widths: Counter = field(default_factory=Counter)
    width_trace: list[int] = field(default_factory=list)
    tpc_trace: list[int] = field(default_factory=list)
    cut_short: int = 0  # drafts a stop cut short (p_min's confidence cut, or auto's stop: policy.stop)
    prefill_s: float = 0.0  # the target's prompt prefill
    prefill_tokens: int = 0
    draft_prefill_s: float = 0.0  # the draft model's: its prompt at the start, and a backlog it caught up on later
    draft_prefill_tokens: int = 0  # (seconds of a catch-up in a cycle are not decode_s)
    decode_s: float = 0.0
    load_s: float | None = None  # loading the models (the run's, not a completion's)
    ttft_s: float | None = None
    peak_memory_bytes: int = 0
    width_estimate: float | None = None  # the width policy's
    typical: dict[str, Any] | None = None
    shared_prompt: bool = False  # the prompt's cache came from an earlier request's prefill (-n)
    prompt_cached_tokens: int = 0  # prompt tokens the target took from kept prefills (prefix.py)
    draft_cached_tokens: int = 0  # ... the draft model
    sources: dict[str, SourceStats] = field(default_factory=dict)  # per draft source, and "plain" (width 0)
    source_trace: list[str] = field(default_factory=list)
    _typical_sums: dict[str, float] = field(default_factory=Counter)
    trees: Counter = field(default_factory=Counter)  # tree cycles: cycles, nodes verified, accepted depth, side paths
    forced_tokens: int = 0  # tokens a constraint forced, drafted without a model (engine.FORCED)

    def record_cycle(self, drafted: int, accepted: int, committed: int, source: str | None = None,
                     seconds: float = 0.0) -> None:
        self._count(drafted, accepted)
        self.generated_tokens += committed
        self.decode_s += seconds
        name = source if drafted and source else PLAIN
        self.sources.setdefault(name, SourceStats()).record(drafted, accepted, committed, seconds)
        self.source_trace.append(name)
        self.accept_lengths[accepted] += 1
        self.draft_widths[drafted] += 1
        self.width_trace.append(drafted)
        self.tpc_trace.append(committed)

    def record_typical(self, positions: int, accepted: int, resampled: bool, entropy_sum: float, floor_sum: float):
        self._typical_sums.update(positions=positions, accepted=accepted, resamples=int(resampled),
                                  entropy=entropy_sum, floor=floor_sum)

    def record_tree(self, nodes: int, depth: int, side: bool) -> None:
        self.trees.update(cycles=1, nodes=nodes, depth=depth, side=int(side))

    def merge(self, other: "RunStats") -> "RunStats":
        """Two runs of the same settings together (a batch's rows, -n's completions: a shared prompt counts once)."""
        out = RunStats()
        for name in ("generated_tokens", "cycles", "drafted", "accepted", "cut_short", "prefill_s", "prefill_tokens",
                     "draft_prefill_s", "draft_prefill_tokens", "prompt_cached_tokens", "draft_cached_tokens",
                     "decode_s", "accept_lengths", "draft_widths", "_typical_sums", "width_trace", "tpc_trace",
                     "source_trace", "trees", "forced_tokens"):
            setattr(out, name, getattr(self, name) + getattr(other, name))  # numbers, Counters and traces
        out.prompt_tokens = sum(r.prompt_tokens for r in (self, other) if not r.shared_prompt)
        out.shared_prompt = self.shared_prompt and other.shared_prompt
        out.reached, out.accepted_at = _add(self.reached, other.reached), _add(self.accepted_at, other.accepted_at)
        out.sources = {name: self.sources.get(name, SourceStats()).merge(other.sources.get(name, SourceStats()))
                       for name in {**self.sources, **other.sources}}  # new objects, not aliases
        out.ttft_s = min((t for t in (self.ttft_s, other.ttft_s) if t is not None), default=None)
        out.peak_memory_bytes = max(self.peak_memory_bytes, other.peak_memory_bytes)
        out.load_s = self.load_s if self.load_s is not None else other.load_s
        out.width_estimate = other.width_estimate
        out.typical = self.typical or other.typical
        return out

    @staticmethod
    def total(runs: list["RunStats"]) -> "RunStats":
        return functools.reduce(RunStats.merge, runs) if runs else RunStats()

    # ---- derived figures (acceptance_rate and accept_by_position come from _Drafts) ------------------------------
    @property
    def tokens_per_cycle(self) -> float:
        return self.generated_tokens / self.cycles if self.cycles else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def typical_summary(self) -> dict[str, Any] | None:
        if self.typical is None:
            return None
        s = self._typical_sums
        pos = s["positions"]
        mean = lambda key: s[key] / pos if pos else 0.0  # noqa: E731
        return {**self.typical, "positions": int(pos), "accepted": int(s["accepted"]), "resamples": int(s["resamples"]),
                "accept_rate": mean("accepted"), "mean_entropy": mean("entropy"), "mean_floor": mean("floor")}

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("prompt_tokens", "prompt_cached_tokens", "draft_cached_tokens",
                                           "generated_tokens", "cycles", "drafted", "accepted", "acceptance_rate",
                                           "tokens_per_cycle", "accept_by_position")}
        d |= {"accept_length_hist": {str(k): v for k, v in sorted(self.accept_lengths.items())},
              "draft_width_hist": {str(k): v for k, v in sorted(self.draft_widths.items())},
              "prefill_tps": self.prefill_tps, "decode_tps": self.decode_tps, "ttft_s": self.ttft_s,
              "load_s": self.load_s, "prefill_s": self.prefill_s, "draft_prefill_s": self.draft_prefill_s,
              "draft_prefill_tokens": self.draft_prefill_tokens, "decode_s": self.decode_s,
              "peak_memory_bytes": self.peak_memory_bytes, "floor_cut_drafts": self.cut_short,
              "width_estimate": self.width_estimate, "width_trace": self.width_trace,
              "tokens_per_cycle_trace": self.tpc_trace,
              "sources": {name: st.to_dict(self.decode_s) for name, st in sorted(self.sources.items())},
              "plain_steps": self.sources[PLAIN].cycles if PLAIN in self.sources else 0,
              "source_trace": self.source_trace, "forced_tokens": self.forced_tokens}
        if self.typical is not None:
            d["typical_acceptance"] = self.typical_summary()
        if self.trees:
            n = self.trees["cycles"]
            d["trees"] = {"cycles": n, "chain_cycles": sum(v for k, v in self.draft_widths.items() if k) - n, "nodes_per_cycle": self.trees["nodes"] / n,
                          "accepted_depth": self.trees["depth"] / n, "side_paths": self.trees["side"]}
        return d
