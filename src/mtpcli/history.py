"""The history store: what earlier runs produced, kept on disk for the history drafter (opt-in: `--history`).

One SQLite file beside the run log (`$XDG_DATA_HOME/mtpcli/history.sqlite`, WAL). A document is one completion's
output token ids, and its prompt's ids only when the run was given --log-prompts; each is keyed by a hash of the
tokenizer's vocabulary, so one tokenizer's ids never draft for another's. A run reads its tokenizer's documents
once at the start and appends its own in one transaction at the end, then drops the oldest documents (of every
tokenizer) until the store is under its cap. Concurrent runs append one after another (BEGIN IMMEDIATE): none
loses another's documents. A store that cannot be read is left untouched: the run warns once and goes on without
it; one that cannot be written loses only this run's documents, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .runlog import data_dir, use_wal, writing

SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  time REAL NOT NULL,
  tokenizer TEXT NOT NULL,
  model TEXT,
  prompt BLOB,
  output BLOB NOT NULL,
  bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS docs_tokenizer ON docs (tokenizer, id)"""

DTYPE = np.dtype("<i4")  # token ids on disk: little-endian int32


def store_path() -> Path:
    return data_dir() / "history.sqlite"


def tokenizer_key(tokenizer) -> str:
    """A hash of the vocabulary (token -> id, added tokens included): equal exactly when ids mean the same."""
    vocab = tokenizer._tokenizer.get_vocab() if hasattr(tokenizer, "_tokenizer") else tokenizer.get_vocab()
    return hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()[:16]


def pack(tokens) -> bytes:
    return np.asarray(tokens, dtype=DTYPE).tobytes()


def unpack(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=DTYPE).astype(np.int64)


@dataclass
class Doc:
    output: np.ndarray  # int64 token ids
    prompt: np.ndarray | None = None


class StoreError(Exception):
    pass


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    """Open the store; StoreError if it is not one (it is then left as it is)."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():  # generated text: readable by its owner only
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    try:
        con = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        con.execute("PRAGMA busy_timeout = 30000")
        if create:
            use_wal(con)
            con.execute("PRAGMA journal_size_limit = 4194304")
            con.executescript(SCHEMA)
        con.execute("SELECT count(*) FROM docs").fetchone()
        return con
    except sqlite3.Error as e:
        raise StoreError(f"{path} is unreadable ({e})") from None


@dataclass
class Store:
    """This run's view of the store: the documents of its tokenizer found at the start (`docs`), the ones this run
    finished since (`session`), and `version`, which changes whenever `session` does."""
    tokenizer: str
    model: str = ""
    cap_bytes: int = 16 << 20
    keep_prompts: bool = False
    path: Path = field(default_factory=store_path)
    docs: list[Doc] = field(default_factory=list)
    session: list[Doc] = field(default_factory=list)
    version: int = 0
    broken: bool = False  # unreadable: nothing read, nothing written
    loaded: bool = False

    def load(self) -> "Store":
        """Read this tokenizer's documents (the history drafter does, when it is a source of the run)."""
        if self.loaded or not self.path.exists():
            return self
        self.loaded = True
        try:
            con = _connect(self.path, create=False)
            try:
                rows = con.execute("SELECT prompt, output FROM docs WHERE tokenizer = ? ORDER BY id",
                                   (self.tokenizer,)).fetchall()
            finally:
                con.close()
            self.docs = [Doc(unpack(o), unpack(p)) for p, o in rows]
        except (StoreError, sqlite3.Error, ValueError) as e:
            self.broken = True
            warn(f"history store {self.path} is unreadable ({e}); left untouched, this run goes on without it")
        return self

    def add(self, prompt: list[int], output: list[int]) -> None:
        """A finished completion: it drafts for the rest of this run, and is kept at the end of it."""
        if output:
            self.session.append(Doc(np.asarray(output, np.int64),
                                    np.asarray(prompt, np.int64) if self.keep_prompts else None))
            self.version += 1

    def save(self) -> int:
        """Append this run's documents, then drop the oldest until the store is under its cap; documents kept."""
        if self.broken or not self.session:
            return 0
        now = time.time()
        rows = [(now, self.tokenizer, self.model, None if d.prompt is None else pack(d.prompt), pack(d.output),
                 d.output.size * DTYPE.itemsize + (0 if d.prompt is None else d.prompt.size * DTYPE.itemsize))
                for d in self.session]
        try:
            with writing(_connect(self.path, create=True)) as con:
                con.executemany("INSERT INTO docs (time, tokenizer, model, prompt, output, bytes)"
                                " VALUES (?,?,?,?,?,?)", rows)
                evict(con, self.cap_bytes)
        except (StoreError, sqlite3.Error, OSError) as e:
            warn(f"history not saved ({self.path}): {e}")
            return 0
        return len(rows)


def evict(con: sqlite3.Connection, cap_bytes: int) -> int:
    """Delete the oldest documents until the kept token bytes are within the cap; how many went."""
    total = con.execute("SELECT coalesce(sum(bytes), 0) FROM docs").fetchone()[0]
    if total <= cap_bytes:
        return 0
    cut, gone = None, 0
    for doc_id, size in con.execute("SELECT id, bytes FROM docs ORDER BY id"):
        if total <= cap_bytes:
            break
        total -= size
        cut, gone = doc_id, gone + 1
    con.execute("DELETE FROM docs WHERE id <= ?", (cut,))
    return gone


_warned: set[str] = set()


def warn(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        print(f"mtpcli: warning: {msg}", file=sys.stderr, flush=True)


# ---- `mtpcli history` -------------------------------------------------------------------------------------------

def open_existing(path: Path | None = None) -> sqlite3.Connection | None:
    """The store for the `history` commands: None when there is none; UsageError when it is unreadable."""
    from .errors import UsageError

    path = path or store_path()
    if not path.is_file():
        return None
    try:
        return _connect(path, create=False)
    except StoreError as e:
        raise UsageError(f"history store {e}; left untouched") from None


def summary(path: Path | None = None) -> dict:
    """Per tokenizer: documents, tokens, bytes, oldest and newest; and the file's size on disk."""
    path = path or store_path()
    con = open_existing(path)
    out = {"path": str(path), "file_bytes": 0, "tokenizers": []}
    if con is None:
        return out
    try:
        rows = con.execute("SELECT tokenizer, group_concat(DISTINCT model), count(*), sum(bytes), min(time), max(time),"
                           " sum(prompt IS NOT NULL) FROM docs GROUP BY tokenizer ORDER BY max(time) DESC").fetchall()
    finally:
        con.close()
    out["file_bytes"] = sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())
    out["tokenizers"] = [{"tokenizer": t, "models": sorted(set((m or "").split(","))), "docs": n,
                          "tokens": b // DTYPE.itemsize, "bytes": b, "oldest": lo, "newest": hi, "with_prompts": wp}
                         for t, m, n, b, lo, hi, wp in rows]
    return out


def clear(path: Path | None = None) -> int:
    con = open_existing(path)
    if con is None:
        return 0
    try:
        n = con.execute("DELETE FROM docs").rowcount
        con.execute("VACUUM")
        return n
    except sqlite3.Error as e:
        from .errors import UsageError

        raise UsageError(f"history store {path or store_path()}: {e} (another run may be writing it); try again") from None
    finally:
        con.close()


def export(path: Path | None = None):
    """Every document, oldest first, as dicts (token ids; the prompt's only where it was kept)."""
    con = open_existing(path)
    if con is None:
        return
    try:
        for i, t, tok, model, prompt, output in con.execute(
                "SELECT id, time, tokenizer, model, prompt, output FROM docs ORDER BY id"):
            doc = {"id": i, "time": t, "tokenizer": tok, "model": model, "output": unpack(output).tolist()}
            if prompt is not None:
                doc["prompt"] = unpack(prompt).tolist()
            yield doc
    finally:
        con.close()
