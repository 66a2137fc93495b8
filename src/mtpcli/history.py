"""The history store the history drafter drafts from (`--history`): one SQLite file beside the run log, its
documents keyed by the tokenizer's vocabulary, capped oldest first; a store it cannot read or write costs a warning,
never the run (docs/guide.md, The history)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UsageError
from .runlog import data_dir, open_db, problem, warn, writing

SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, tokenizer TEXT NOT NULL,
  model TEXT, prompt BLOB, output BLOB NOT NULL, bytes INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS docs_tokenizer ON docs (tokenizer, id)"""

DTYPE = np.dtype("<i4")  # token ids on disk: little-endian int32


def store_path() -> Path:
    return data_dir() / "history.sqlite"


def tokenizer_key(tokenizer) -> str:
    """A hash of the vocabulary (token -> id, added tokens included): equal exactly when ids mean the same."""
    vocab = tokenizer._tokenizer.get_vocab() if hasattr(tokenizer, "_tokenizer") else tokenizer.get_vocab()
    return hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()[:16]


def unpack(blob: bytes | None) -> np.ndarray | None:
    """Token ids from a blob; ValueError where it holds none (a damaged or hand-edited row)."""
    if blob is None:
        return None
    if not isinstance(blob, bytes) or len(blob) % DTYPE.itemsize:
        what = f"{len(blob)} bytes" if isinstance(blob, bytes) else f"a {type(blob).__name__}"
        raise ValueError(f"{what}, not {DTYPE.itemsize}-byte token ids")
    return np.frombuffer(blob, dtype=DTYPE).astype(np.int64)


def readable(path: Path, rows):
    """(id, prompt ids, output ids, the rest) of each row (id, prompt, output, *rest) that holds token ids; one
    warning names those skipped."""
    skipped = []
    for i, prompt, output, *rest in rows:
        try:
            yield i, unpack(prompt), unpack(output), rest
        except ValueError as e:
            skipped.append(f"{i}: {e}")
    if skipped:
        warn(f"history store {path}: {len(skipped)} outputs skipped (id {'; id '.join(skipped)})")


@dataclass
class Doc:
    output: np.ndarray  # int64 token ids
    prompt: np.ndarray | None = None


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    """Open the store (a new file readable by its owner only: generated text); sqlite3 errors pass through."""
    return open_db(path, SCHEMA, "docs", create, mode=0o600, pragmas=("PRAGMA journal_size_limit = 4194304",))


@dataclass
class Store:
    """This run's view of the store: its tokenizer's documents found at the start (`docs`), and its own (`session`)."""
    tokenizer: str
    model: str = ""
    cap_bytes: int = 16 << 20
    keep_prompts: bool = False
    path: Path = field(default_factory=store_path)
    docs: list[Doc] = field(default_factory=list)
    session: list[Doc] = field(default_factory=list)
    broken: bool = False  # unreadable: nothing read, nothing written
    loaded: bool = False

    def load(self) -> "Store":
        """Read this tokenizer's documents (the history drafter does, when it is a source of the run)."""
        if self.loaded or not self.path.exists():
            return self
        self.loaded = True
        try:
            with contextlib.closing(_connect(self.path, create=False)) as con:
                rows = con.execute("SELECT id, prompt, output FROM docs WHERE tokenizer = ? ORDER BY id",
                                   (self.tokenizer,)).fetchall()
            self.docs = [Doc(o, p) for _, p, o, _ in readable(self.path, rows)]
        except (sqlite3.Error, OSError) as e:
            self.broken = True
            warn(f"{problem('history store', self.path, e)}; this run goes on without it")
        return self

    def add(self, prompt: list[int], output: list[int]) -> None:
        """A finished completion: it drafts for the rest of this run, and is kept at the end of it."""
        if output:
            self.session.append(Doc(np.asarray(output, np.int64),
                                    np.asarray(prompt, np.int64) if self.keep_prompts else None))

    def save(self) -> int:
        """Append this run's documents, then drop the oldest until the store is under its cap; documents kept."""
        if self.broken or not self.session:
            return 0
        now, rows = time.time(), []
        for d in self.session:
            prompt = None if d.prompt is None else np.asarray(d.prompt, DTYPE).tobytes()
            output = np.asarray(d.output, DTYPE).tobytes()
            rows.append((now, self.tokenizer, self.model, prompt, output, len(output) + len(prompt or b"")))
        try:
            with writing(_connect(self.path, create=True)) as con:
                con.executemany("INSERT INTO docs (time, tokenizer, model, prompt, output, bytes)"
                                " VALUES (?,?,?,?,?,?)", rows)
                # the oldest documents go while they and the newer ones exceed the cap
                con.execute("DELETE FROM docs WHERE id IN (SELECT id FROM (SELECT id, sum(bytes) OVER (ORDER BY id"
                            " DESC) AS kept FROM docs) WHERE kept > ?)", (self.cap_bytes,))
        except (sqlite3.Error, OSError) as e:
            warn(f"history not saved: {problem('history store', self.path, e)}")
            return 0
        return len(rows)


# ---- `mtpcli history` -------------------------------------------------------------------------------------------

def open_existing(write: bool = False) -> sqlite3.Connection | None:
    """The store for the `history` commands (read-only unless `write`): None when there is none; UsageError when it
    is unreadable or another program's."""
    path = store_path()
    if not path.exists():
        return None
    try:
        return _connect(path, create=write)
    except (sqlite3.Error, OSError) as e:
        raise UsageError(problem("history store", path, e)) from None


def summary() -> dict:
    """Per tokenizer: documents, tokens, bytes, oldest and newest; and the file's size on disk."""
    path = store_path()
    con = open_existing()
    out = {"path": str(path), "file_bytes": 0, "tokenizers": []}
    if con is None:
        return out
    with contextlib.closing(con):
        rows = con.execute("SELECT tokenizer, group_concat(DISTINCT model), count(*), sum(bytes), min(time), max(time),"
                           " sum(prompt IS NOT NULL) FROM docs GROUP BY tokenizer ORDER BY max(time) DESC").fetchall()
    out["file_bytes"] = sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())
    out["tokenizers"] = [{"tokenizer": t, "models": sorted(set((m or "").split(","))), "docs": n,
                          "tokens": b // DTYPE.itemsize, "bytes": b, "oldest": lo, "newest": hi, "with_prompts": wp}
                         for t, m, n, b, lo, hi, wp in rows]
    return out


def clear() -> int:
    con = open_existing(write=True)  # (another program's file: UsageError, before anything is written)
    if con is None:
        return 0
    try:
        n = con.execute("DELETE FROM docs").rowcount
        con.execute("VACUUM")
        return n
    except sqlite3.Error as e:
        again = "; try again" if "locked" in str(e) else ""
        raise UsageError(problem("history store", store_path(), e) + again) from None
    finally:
        con.close()


def export():
    """Every document, oldest first, as dicts (token ids; the prompt's only where it was kept)."""
    con = open_existing()
    if con is None:
        return
    with contextlib.closing(con):
        rows = con.execute("SELECT id, prompt, output, time, tokenizer, model FROM docs ORDER BY id")
        for i, prompt, output, (t, tok, model) in readable(store_path(), rows):
            doc = {"id": i, "time": t, "tokenizer": tok, "model": model, "output": output.tolist()}
            if prompt is not None:
                doc["prompt"] = prompt.tolist()
            yield doc
