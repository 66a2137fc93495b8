"""`draft = auto`'s sources behind the one protocol; each cycle the plan (policy.AutoPolicy) names the one that drafts.
Every source sees every row start and every commit, so one that did not draft stays in step: a draft model catches
up on the committed tokens the next time it drafts, an MTP head keeps collecting the target's hidden states."""

from __future__ import annotations

from . import Draft, Drafter, Source, empty


class AutoDrafter(Drafter):
    name = "auto"

    def __init__(self, sources: dict[str, Source]):
        self.sources = dict(sources)
        self.needs_hidden = any(d.needs_hidden for d in self.sources.values())
        self.taps = next((d.taps for d in self.sources.values() if d.taps), ())  # (one source reads hidden states)
        self.max_rows = min((d.max_rows for d in self.sources.values() if d.max_rows), default=None)

    def available_of(self, source: str, contexts: list, k: int) -> list | None:
        """What `source` has for each row before drafting (its `available`; the policy asks, per source)."""
        return self.sources[source].available(contexts, k)

    def backlogs(self, source: str, contexts: list) -> list[int] | None:
        """What `source` would prefill for each row before drafting now (the policy asks, per source)."""
        got = [self.sources[source].backlog(b, c) for b, c in enumerate(contexts)]
        return None if None in got else got

    @property
    def cached(self) -> int:
        return sum(d.cached for d in self.sources.values())

    @property
    def prefilled(self) -> int:
        return sum(d.prefilled for d in self.sources.values())

    def add_rows(self, n: int) -> None:
        for d in self.sources.values():
            d.add_rows(n)

    def keep_rows(self, rows: list[int]) -> None:
        for d in self.sources.values():
            d.keep_rows(rows)

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        for d in self.sources.values():
            d.start(row, prompt, hidden, keep)

    def propose(self, contexts, caps, sp, keys, plan=None) -> Draft:
        if plan is None or plan.source is None:
            return empty([0] * len(caps))
        return self.sources[plan.source].propose(contexts, caps, sp, keys, plan)

    def commit(self, contexts, n_accepted, hidden=None) -> None:
        for d in self.sources.values():  # a source that did not draft this cycle only takes note of the tokens
            d.commit(contexts, n_accepted, hidden)
