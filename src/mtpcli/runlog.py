"""The run log: one SQLite record per generate run or bench arm (WAL mode; a record is all or nothing), and the
SQLite plumbing and once-only warning it shares with the history store."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .config import BOOLS
from .errors import UsageError
from .stats import REQUIRED

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, command TEXT NOT NULL, profile TEXT, model TEXT,
  draft TEXT, prompt_tokens INTEGER, prompt_hash TEXT, prompt TEXT, settings TEXT NOT NULL, stats TEXT NOT NULL,
  status INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS costs (key TEXT PRIMARY KEY, value TEXT NOT NULL, time REAL NOT NULL)"""


BUSY_S = 5.0  # a write waits for other writers while they commit, but this long at most for a lock nobody releases


def data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "mtpcli"


def log_path() -> Path:
    return data_dir() / "runs.sqlite"


def disabled() -> bool:
    """MTPCLI_NO_LOG as a boolean (unset or empty: the run log is kept); UsageError naming it where it is none."""
    raw = os.environ.get("MTPCLI_NO_LOG", "").strip().lower()
    if raw and raw not in BOOLS:
        raise UsageError(f"environment MTPCLI_NO_LOG: {raw!r} is not a valid bool (1, true, yes, on or 0, false, no, "
                         "off)")
    return BOOLS.get(raw, False)


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


class Foreign(sqlite3.DatabaseError):
    """A valid SQLite file of another schema: never written."""


@functools.cache
def _columns(schema: str) -> dict[str, set[str]]:
    with contextlib.closing(sqlite3.connect(":memory:")) as mem:
        mem.executescript(schema)
        return {t: {c[1] for c in mem.execute(f"PRAGMA table_info({t})")}
                for (t,) in mem.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _check(con: sqlite3.Connection, schema: str, table: str) -> None:
    """Foreign unless the file has no table yet, or has `table`, and each table of `schema` there has its columns."""
    tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for t, cols in _columns(schema).items():
        have = {c[1] for c in con.execute(f"PRAGMA table_info({t})")}
        if t in tables and not cols <= have:
            raise Foreign(f"table {t} has no column {min(cols - have)}")
    if tables and table not in tables:
        raise Foreign(f"no table {table}; tables {', '.join(sorted(tables))}")


def open_db(path: Path, schema: str, table: str, create: bool, mode: int | None = None,
            pragmas: tuple[str, ...] = ()) -> sqlite3.Connection:
    """Connect (autocommit; SQLite's busy timeout 1 s, as `writing` waits longer while others commit) and check the
    schema (Foreign: another's) before anything is written; with `create`, then make the folder, the file (with
    `mode`, if new), WAL mode, `pragmas` and `schema`. Without, read-only: where the -shm cannot be made (a read-only
    folder, a full disk) a WAL file opens only as immutable (unless its WAL holds data). sqlite3 errors pass through
    (the first, of the read-only tries); IsADirectoryError where PATH is a folder."""
    if path.is_dir():  # (SQLite says only "unable to open database file" or "disk I/O error")
        raise IsADirectoryError(errno.EISDIR, "a folder, not a SQLite file")
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        if mode is not None and not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, mode))
        elif mode is not None:  # a store made before it was private: its own and its journal's mode, from now on
            for f in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                with contextlib.suppress(OSError):
                    if f.stat().st_mode & 0o777 & ~mode:
                        f.chmod(mode)
    wal = Path(f"{path}-wal")
    hot = wal.is_file() and wal.stat().st_size > 0
    first = None
    for uri in ["mode=rwc"] if create else ["mode=ro"] + ([] if hot else ["immutable=1"]):
        con = None
        try:
            con = sqlite3.connect(f"file:{quote(str(path))}?{uri}", uri=True, timeout=1.0, isolation_level=None)
            _check(con, schema, table)
            if create:
                use_wal(con)
                for pragma in pragmas:
                    con.execute(pragma)
                con.executescript(schema)
            con.execute(f"SELECT count(*) FROM {table}").fetchone()
            return con
        except BaseException as e:
            if con is not None:
                con.close()
            if not isinstance(e, sqlite3.OperationalError) or not any(
                    why in str(e) for why in ("readonly", "unable to open", "disk I/O error")):
                raise  # (immutable is for a folder nobody writes, never for a busy file)
            first = first or e
    raise first


@contextlib.contextmanager
def writing(con: sqlite3.Connection, patience: float = BUSY_S):
    """One write transaction (BEGIN IMMEDIATE), rolled back if the block raises (by sqlite3's `with con`, unless
    SQLite has already: a full disk); then the connection is closed. It waits for other writers as long as they
    commit (many concurrent runs lose nothing), and `patience` seconds for a lock held without a commit (then
    "database is locked": another process holds it)."""
    with contextlib.closing(con), con:
        seen, deadline = con.execute("PRAGMA data_version").fetchone()[0], time.monotonic() + patience
        while True:
            try:
                con.execute("BEGIN IMMEDIATE")  # (each try waits up to the busy timeout, 1 s)
                break
            except sqlite3.OperationalError as e:
                version = con.execute("PRAGMA data_version").fetchone()[0]  # (it changes with another's commit)
                if "database is locked" not in str(e) or (version == seen and time.monotonic() >= deadline):
                    raise
                if version != seen:
                    seen, deadline = version, time.monotonic() + patience
        yield con


def problem(what: str, path: Path, e: Exception) -> str:
    """A store's failure in words that name it: another schema, a damaged file, or the error itself (a full disk)."""
    if isinstance(e, Foreign):
        return f"{what} {path} is a SQLite file of another schema ({e}); left untouched"
    if type(e) is sqlite3.DatabaseError:  # not a database, or a damaged one (a full disk is an OperationalError)
        return f"{what} {path} is unreadable ({e}); left untouched"
    if "database is locked" in str(e):
        return f"{what} {path} is locked by another process (no commit in {BUSY_S:g} s)"
    return str(e) if isinstance(e, UsageError) else f"{what} {path}: {getattr(e, 'strerror', None) or e}"


def _connect(path: Path, create: bool, schema: str = SCHEMA) -> sqlite3.Connection:
    """The run log (`schema`: its tables, with the conversations' where they are read), its faults a UsageError."""
    if not create and not path.exists():
        raise UsageError(f"no run log yet at {path} (run `mtpcli generate` first)")
    try:  # (a new file readable by its owner only, as the history store: commands, settings, statistics)
        return open_db(path, schema, "runs", create, mode=0o600)
    except (sqlite3.DatabaseError, OSError) as e:
        raise UsageError(problem("run log", path, e)) from None


REDACTED = "<redacted>"


def redact(argv: list[str], texts) -> list[str]:
    """ARGV with each of TEXTS (what the user wrote: a prompt, a system message) replaced by <redacted>, as an
    argument of its own or as an option's value (--system=TEXT, -pTEXT). By value, not by parsing: an argument that
    happens to equal one (a prompt "5" and --max-tokens 5) goes too."""
    texts = [t for t in texts if t]
    out = []
    for a in argv:
        t = next((t for t in texts if a == t or a.startswith("-") and a.endswith(t)), None)
        out.append(a if t is None else a[: len(a) - len(t)] + REDACTED)
    return out


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
        warn(f"run not logged: {problem('run log', log_path(), e)}", key="run not logged")
        return None


def query(*, last: int | None = None, since: float | None = None, model: str | None = None,
          profile: str | None = None, path: Path | None = None) -> list[dict[str, Any]]:
    """Records, oldest first, after filters; `last` keeps the newest N."""
    path = path or log_path()
    con = _connect(path, create=False)
    con.row_factory = sqlite3.Row
    where = {cond: v for cond, v in (("time >= ?", since), ("model = ?", model), ("profile = ?", profile)) if v}
    sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
    if last:
        sql += f" LIMIT {int(last)}"
    rows = []
    try:
        for r in con.execute(sql, list(where.values())):
            try:
                rows.append(_record(r))
            except ValueError as e:  # one damaged (or hand-edited) row: the others are still good
                warn(f"run log {path}: run {r['id']} skipped ({e})")
    except sqlite3.DatabaseError as e:
        raise UsageError(problem("run log", path, e)) from None
    finally:
        con.close()
    return rows[::-1]


NUMBERS = ("prompt_tokens", "generated_tokens", "cycles", "drafted", "accepted", "acceptance_rate", "tokens_per_cycle",
           "prefill_tps", "decode_tps")  # what the views compute with


def _record(row: sqlite3.Row) -> dict[str, Any]:
    """A row as a record (its JSON columns read); ValueError, saying what is wrong, where it cannot be one."""
    rec = dict(row)
    for c in ("command", "settings", "stats"):
        try:
            rec[c] = json.loads(row[c])
        except (TypeError, ValueError):
            raise ValueError(f"its {c} is not JSON") from None
    if not isinstance(rec["time"], (int, float)):
        raise ValueError(f"its time is {rec['time']!r}, not a number")
    for c in ("settings", "stats"):
        if not isinstance(rec[c], dict):
            raise ValueError(f"its {c} is a JSON {type(rec[c]).__name__}, not an object")
    if not isinstance(rec["stats"].get("sources", {}), (dict, type(None))):
        raise ValueError(f"its stats' sources is a JSON {type(rec['stats']['sources']).__name__}, not an object")
    if bad := next((k for k in REQUIRED if k not in rec["stats"]), None):
        raise ValueError(f"its stats have no {bad}")
    if bad := next((k for k in NUMBERS if not isinstance(rec["stats"][k], (int, float))), None):
        raise ValueError(f"its stats' {bad} is {rec['stats'][bad]!r}, not a number")
    return rec


def clear() -> int:
    _connect(log_path(), create=False).close()  # there, and a run log
    with writing(_connect(log_path(), create=True)) as con:
        return con.execute("DELETE FROM runs").rowcount


# ---- cycle costs of draft = auto, per model, draft model, machine (policy.Costs) ------------------------------

def load_costs(key: str) -> dict[str, Any] | None:
    """The stored costs, or None (none yet, logging off, or an unreadable log: then the prior is used)."""
    if disabled():
        return None
    try:
        with contextlib.closing(_connect(log_path(), create=False)) as con:
            row = con.execute("SELECT value FROM costs WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None
    except (UsageError, sqlite3.Error, ValueError):
        return None  # no log, an old one without the table, or a damaged one: left untouched


def update_costs(key: str, settle) -> None:
    """Read the kept value, settle(value or None) -> the value to keep or None (keep it), write: one transaction,
    so concurrent runs settle one after another and none loses the other's update."""
    if disabled():
        return
    try:  # (a lock held for a second is a fault: the run's record, written next, waits and warns)
        with writing(_connect(log_path(), create=True), patience=1.0) as con:
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
