"""The writers of `mtpcli generate`: completions in input order. Text streams the first unfinished completion as it
is committed and prints the later ones whole when their turn comes (joined by --separator); jsonl prints a row per
completion as soon as every earlier row is out; json one document at the end (the front end writes it)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, TextIO

from .prompts import Item
from .stats import RunStats


class Output:
    """Writes generated text (or JSON) to stdout; detects a closed pipe."""

    def __init__(self, out: TextIO):
        self.out = out
        self.closed = False

    def write(self, text: str) -> None:
        if self.closed or not text:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            self.closed = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.out.fileno())  # so the interpreter's own flush at exit stays quiet


@dataclass
class Completion:
    index: int
    item: Item
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: RunStats | None = None
    text: str = ""

    def row(self, source: bool) -> dict[str, Any]:
        head = {"index": self.index, **({"source": self.item.source} if source else {})}
        if self.item.error:
            return {**head, "error": self.item.error}
        return {**head, "text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict() if self.stats else None}


class Writer:
    """Completions in input order: the first unfinished one streams (text), later ones wait their turn."""

    def __init__(self, fmt: str, output: Output, tokenizer, completions: list[Completion], separator: str,
                 source: bool, runs: dict):
        self.fmt, self.output, self.tok, self.rows, self.runs = fmt, output, tokenizer, completions, runs
        self.separator, self.source = separator, source
        self.detok = tokenizer.detokenizer
        self.next = 0  # the first completion not yet fully written
        self.started = False  # rows[next] has begun (text: its separator is out)
        self.streamed = 0  # tokens of rows[next] given to the detokenizer

    def event(self, index: int, tokens: list[int], finish: str | None) -> None:
        c = self.rows[index]
        c.tokens.extend(tokens)
        c.finish_reason = finish or c.finish_reason
        self.flush()

    @staticmethod
    def _done(c: Completion) -> bool:
        return c.item.error is not None or c.finish_reason is not None

    def flush(self) -> None:
        while self.next < len(self.rows) and not self.output.closed:
            c = self.rows[self.next]
            if self.fmt == "text":
                if not self.started:
                    self.output.write(self.separator if self.next else "")
                    self.started, self.streamed = True, 0
                for t in c.tokens[self.streamed:]:
                    self.detok.add_token(t)
                self.streamed = len(c.tokens)
                if self._done(c):
                    self.detok.finalize()
                self.output.write(self.detok.last_segment)
            if not self._done(c):
                return
            c.text = "" if c.item.error else self.tok.decode(c.tokens)
            c.stats = self.runs.get(c.index)
            if self.fmt == "jsonl":
                self.output.write(json.dumps(c.row(self.source)) + "\n")
            self.detok.reset()
            self.next, self.started = self.next + 1, False

    def close(self) -> None:
        """Interrupted rows end with what they committed."""
        for c in self.rows:
            if not self._done(c):
                c.finish_reason = "interrupted"
        self.flush()
        if self.fmt == "text":
            self.output.write("\n")
