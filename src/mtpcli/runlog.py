"""The run log: one SQLite record per generate run or bench arm (WAL mode; a record is all or nothing), and the
SQLite plumbing and once-only warning it shares with the history store."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from .errors import UsageError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, command TEXT NOT NULL, profile TEXT, model TEXT,
  draft TEXT, prompt_tokens INTEGER, prompt_hash TEXT, prompt TEXT, settings TEXT NOT NULL, stats TEXT NOT NULL,
  status INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS costs (key TEXT PRIMARY KEY, value TEXT NOT NULL, time REAL NOT NULL)"""
JSON_COLUMNS = ("command", "settings", "stats")


def data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "mtpcli"


def log_path() -> Path:
    return data_dir() / "runs.sqlite"


def disabled() -> bool:
    return os.environ.get("MTPCLI_NO_LOG", "") not in ("", "0")


def use_wal(con: sqlite3.Connection) -> None:
    """Put the database in (persistent) WAL mode, trying for a few seconds: changing the mode does not wait for
    other connections ("database is locked" at once while another process opens or writes the same new file)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                con.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "database is locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def open_db(path: Path, schema: str, table: str, create: bool, mode: int | None = None,
            pragmas: tuple[str, ...] = ()) -> sqlite3.Connection:
    """Connect (autocommit, 30 s busy timeout) and check that `table` reads; with `create`, make the folder, the
    file (with `mode`, if new), WAL mode, `pragmas` and `schema` first. sqlite3 errors pass through."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        if mode is not None and not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, mode))
    con = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    try:
        con.execute("PRAGMA busy_timeout = 30000")
        if create:
            use_wal(con)
            for pragma in pragmas:
                con.execute(pragma)
            con.executescript(schema)
        con.execute(f"SELECT count(*) FROM {table}").fetchone()
    except BaseException:
        con.close()
        raise
    return con


@contextlib.contextmanager
def writing(con: sqlite3.Connection):
    """One write transaction that waits for other writers (BEGIN IMMEDIATE), rolled back if the block raises; then
    the connection is closed."""
    with contextlib.closing(con):
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")


def _unreadable(path: Path, e: Exception) -> UsageError:
    return UsageError(f"run log {path} is unreadable ({e}); left untouched")


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    if not create and not path.is_file():
        raise UsageError(f"no run log yet at {path} (run `mtpcli generate` first)")
    try:
        return open_db(path, SCHEMA, "runs", create)
    except sqlite3.DatabaseError as e:
        raise _unreadable(path, e) from None


_warned: set[str] = set()


def warn(msg: str, key: str | None = None) -> None:
    """`mtpcli: warning: MSG` on stderr, once per message (or per `key`)."""
    if (key or msg) not in _warned:
        _warned.add(key or msg)
        print(f"mtpcli: warning: {msg}", file=sys.stderr, flush=True)


def append_safely(*, command, settings, profile, model, draft, prompt, stats, status, started,
                  prompt_text: str | None = None, log: bool = True) -> int | None:
    """Append a record (whole or not at all) and return its id; on any storage failure warn once and carry on."""
    if not log or disabled():
        return None
    digest = hashlib.sha256(json.dumps(list(prompt)).encode()).hexdigest()[:16]
    values = (started, json.dumps(list(command)), profile, model, draft, len(prompt), digest, prompt_text,
              json.dumps(settings), json.dumps(stats), status)
    try:
        with writing(_connect(log_path(), create=True)) as con:
            return con.execute("INSERT INTO runs (time, command, profile, model, draft, prompt_tokens, prompt_hash,"
                               " prompt, settings, stats, status) VALUES (?,?,?,?,?,?,?,?,?,?,?)", values).lastrowid
    except (OSError, sqlite3.Error, UsageError) as e:
        warn(f"run not logged ({log_path()}): {e}", key="run not logged")
        return None


def query(*, last: int | None = None, since: float | None = None, model: str | None = None,
          profile: str | None = None, ids: list[int] | None = None, path: Path | None = None) -> list[dict[str, Any]]:
    """Records, oldest first, after filters; `last` keeps the newest N."""
    path = path or log_path()
    con = _connect(path, create=False)
    con.row_factory = sqlite3.Row
    where, args = [], []
    for on, cond, values in ((since is not None, "time >= ?", [since]), (model, "model = ?", [model]),
                             (profile, "profile = ?", [profile]),
                             (ids, f"id IN ({','.join('?' * len(ids or ()))})", ids)):
        if on:
            where.append(cond)
            args.extend(values)
    sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
    if last:
        sql += f" LIMIT {int(last)}"
    try:
        rows = [{**dict(r), **{c: json.loads(r[c]) for c in JSON_COLUMNS}} for r in con.execute(sql, args)]
    except sqlite3.DatabaseError as e:
        raise _unreadable(path, e) from None
    finally:
        con.close()
    return rows[::-1]


def clear(path: Path | None = None) -> int:
    with writing(_connect(path or log_path(), create=False)) as con:
        return con.execute("DELETE FROM runs").rowcount


# ---- cycle costs of draft = auto, per model, draft model, machine (policy.Costs) ------------------------------

def load_costs(key: str, path: Path | None = None) -> dict[str, Any] | None:
    """The stored costs, or None (none yet, logging off, or an unreadable log: then the prior is used)."""
    if disabled():
        return None
    try:
        with contextlib.closing(_connect(path or log_path(), create=False)) as con:
            row = con.execute("SELECT value FROM costs WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None
    except (UsageError, sqlite3.Error, ValueError):
        return None  # no log, an old one without the table, or a damaged one: left untouched


def update_costs(key: str, settle, path: Path | None = None) -> None:
    """Read the kept value, settle(value or None) -> the value to keep or None (keep it), write: one transaction,
    so concurrent runs settle one after another and none loses the other's update."""
    if disabled():
        return
    try:
        with writing(_connect(path or log_path(), create=True)) as con:
            row = con.execute("SELECT value FROM costs WHERE key = ?", (key,)).fetchone()
            try:
                current = json.loads(row[0]) if row else None
            except ValueError:
                current = {}  # unreadable: settle() keeps nothing over it unless it can
            value = settle(current)
            if value is not None:
                con.execute("INSERT INTO costs (key, value, time) VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE "
                            "SET value = excluded.value, time = excluded.time", (key, json.dumps(value), time.time()))
    except (OSError, sqlite3.Error, UsageError):
        pass  # a cache of measurements: the next run measures again (the run log's own warning says the log failed)
