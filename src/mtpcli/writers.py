"""The writers of `mtpcli generate`: completions in input order (text streamed, jsonl a row as its turn comes, json
at the end), and every command's result files, checked before the work and written whole."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, TextIO

from .errors import EXIT_RUNTIME, MtpError, UsageError
from .prompts import Item
from .stats import RunStats


def _in_place(path: str) -> bool:
    """Written in place (appended to): a device, a FIFO, /dev/stdout or a process substitution, even where it is a
    file (`--stats-json /dev/stdout > out.txt` keeps the text already in out.txt)."""
    return os.path.exists(path) and (not os.path.isfile(path) or path.startswith(("/dev/", "/proc/")))


def check_writable(flag: str, path: str) -> None:
    """Before the work: PATH can be written, else one line naming FLAG (exit 2)."""
    real = os.path.realpath(path)
    try:
        if os.path.isdir(real):
            raise IsADirectoryError(21, "is a folder")
        if os.path.exists(real) and not os.access(real, os.W_OK):
            raise PermissionError(13, "permission denied")
        if not _in_place(path) and not os.path.exists(real):
            os.close(os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.unlink(real)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot be written ({e.strerror or e})") from None


def write_file(flag: str, path: str, data: str | bytes) -> None:
    """Write PATH whole or not at all: a temporary file in its folder (its mode the old file's), then os.replace, so
    a failed write (a full disk) leaves the earlier file intact. Devices and pipes, and a file whose folder takes
    no new file, are written in place. A failure is one line naming FLAG (exit 1)."""
    real, in_place = os.path.realpath(path), _in_place(path)
    folder = os.path.dirname(real)
    data = data.encode() if isinstance(data, str) else data
    tmp = None
    try:
        if in_place or (os.path.exists(real) and not os.access(folder, os.W_OK)):
            with open(path if in_place else real, "ab" if in_place else "wb") as f:
                f.write(data)
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(real)}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if os.path.exists(real):
            shutil.copymode(real, tmp)
        else:  # a new file's mode, as open() would give it (the umask is read by setting it)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, real)
        tmp = None
    except OSError as e:
        raise MtpError(f"{flag} {path}: not written ({e.strerror or e})", EXIT_RUNTIME) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


@dataclass
class Completion:
    index: int
    item: Item
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: RunStats | None = None
    text: str = ""

    @property
    def done(self) -> bool:
        return self.item.error is not None or self.finish_reason is not None

    def row(self, source: bool) -> dict[str, Any]:
        head = {"index": self.index, **({"id": self.item.id} if self.item.id is not None else {}),
                **({"source": self.item.source} if source else {})}
        if self.item.error:
            return {**head, "error": self.item.error}
        stats = self.stats.to_dict() if self.stats else None
        if stats and self.stats.shared_prompt:  # -n: an earlier completion prefilled the prompt, this one nothing
            del stats["prefill_tps"]
        return {**head, "text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason, "stats": stats}


class Writer:
    """Completions on stdout in input order, as above; once the pipe is closed or a write fails (`closed`; `failed`
    says why when it was not a reader that left), nothing more is written."""

    def __init__(self, fmt: str, out: TextIO, tokenizer, completions: list[Completion], separator: str,
                 source: bool, runs: dict):
        self.fmt, self.out, self.tok, self.rows, self.runs = fmt, out, tokenizer, completions, runs
        self.separator, self.source, self.detok = separator, source, tokenizer.detokenizer
        self.closed, self.failed = out is None, None  # (None: stdout was closed before the run)
        self.next = 0  # the first completion not yet fully written
        self.streamed: int | None = None  # tokens of rows[next] given to the detokenizer (None: not begun)

    def write(self, text: str) -> None:
        if self.closed or not text:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except OSError as e:  # a reader that left, or a full disk
            self.closed, self.failed = True, None if isinstance(e, BrokenPipeError) else e.strerror or str(e)
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.out.fileno())  # so the exit's own flush stays quiet

    def event(self, index: int, tokens: list[int], finish: str | None) -> None:
        c = self.rows[index]
        c.tokens.extend(tokens)
        c.finish_reason = finish or c.finish_reason
        self.flush()

    def flush(self) -> None:
        while self.next < len(self.rows) and not self.closed:
            c = self.rows[self.next]
            if self.fmt == "text":
                if self.streamed is None:  # its separator first
                    self.write(self.separator if self.next else "")
                    self.streamed = 0
                for t in c.tokens[self.streamed:]:
                    self.detok.add_token(t)
                self.streamed = len(c.tokens)
                if c.done:
                    self.detok.finalize()
                self.write(self.detok.last_segment)
            if not c.done:
                return
            c.text = "" if c.item.error else self.tok.decode(c.tokens)
            c.stats = self.runs.get(c.index)
            if self.fmt == "jsonl":
                self.write(json.dumps(c.row(self.source)) + "\n")
            self.detok.reset()
            self.next, self.streamed = self.next + 1, None

    def close(self) -> None:
        """Interrupted rows end with what they committed; every row gets its statistics, written or not."""
        for c in self.rows:
            c.stats = self.runs.get(c.index)
            if not c.done:
                c.finish_reason = "interrupted"
        self.flush()
        if self.fmt == "text":
            self.write("\n")
