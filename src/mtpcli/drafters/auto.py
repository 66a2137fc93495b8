"""Several draft sources behind the one protocol; each cycle the engine names the source that drafts (`draft =
auto`, chosen by policy.AutoPolicy). Every source sees every row start and every commit, so the one that did not
draft this cycle stays in step: a draft model catches up on the committed tokens the next time it drafts, an MTP
head keeps collecting the target's hidden states. A source that drafts autoregressively stops the batch's draft where one
more token is worth less than it costs (`floor`, from the policy: see drafters.autoregress)."""

from __future__ import annotations

from . import Draft, empty


class AutoDrafter:
    name = "auto"
    speculates = True

    def __init__(self, sources: dict):
        if not sources:
            raise ValueError("auto needs at least one draft source")
        self.sources = dict(sources)
        self.needs_hidden = any(d.needs_hidden for d in self.sources.values())
        rows = [d.max_rows for d in self.sources.values() if d.max_rows]
        self.max_rows = min(rows) if rows else None
        self.floor = lambda source: (0.0, 0.0, None)  # the policy's (keep, go_on, shift), once there is one

    def available(self, source: str, contexts: list, k: int) -> list | None:
        """What a deterministic source has for each row before drafting: a number of tokens, or each token's
        estimated probability (None: as many as asked)."""
        look = getattr(self.sources[source], "available", None)
        return look(contexts, k) if look else None

    def add_rows(self, n: int) -> None:
        for d in self.sources.values():
            d.add_rows(n)

    def keep_rows(self, rows: list[int]) -> None:
        for d in self.sources.values():
            d.keep_rows(rows)

    def start(self, row: int, prompt: list[int], hidden=None, keep: bool = False) -> None:
        for d in self.sources.values():
            d.start(row, prompt, hidden, keep)

    def propose(self, contexts, caps, sp, keys, source: str | None = None) -> Draft:
        if source is None:
            return empty([0] * len(caps))
        d = self.sources[source]
        if hasattr(d, "floor"):
            d.floor = self.floor(source)
        return d.propose(contexts, caps, sp, keys)

    def commit(self, contexts, n_accepted, hidden=None) -> None:
        for d in self.sources.values():  # a source that did not draft this cycle only takes note of the tokens
            d.commit(contexts, n_accepted, hidden)
