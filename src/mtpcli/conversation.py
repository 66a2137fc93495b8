"""Conversations (`generate --save / -c / --conversation`, chat's /save): their turns beside the runs in the run
log, one transaction a turn (README.md, Conversations)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass, field, replace

from . import runlog
from .errors import UsageError

SCHEMA = """;
CREATE TABLE IF NOT EXISTS conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, model TEXT NOT NULL,
  system TEXT);
CREATE TABLE IF NOT EXISTS turns (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation INTEGER NOT NULL,
  time REAL NOT NULL, prompt TEXT NOT NULL, answer TEXT NOT NULL, run INTEGER)"""
START = "start one with `mtpcli generate --save` or `mtpcli chat` (/save)"


@dataclass
class Conversation:
    id: int | None  # None: not in the run log (yet)
    model: str  # as models.canonical names it
    system: str | None
    turns: list[tuple[str, str]] = field(default_factory=list)  # (prompt, answer)
    kept: bool = True  # each new turn is written to the run log (chat: from /save on)

    def messages(self) -> list[dict[str, str]]:
        """The earlier turns as chat messages (the system message is the run's own, cfg.system)."""
        return [{"role": r, "content": c} for p, a in self.turns for r, c in (("user", p), ("assistant", a))]

    def add(self, prompt: str, answer: str, run: int | None) -> None:
        """A finished turn: in memory, and in the run log where kept (a failure there is a warning)."""
        self.turns.append((prompt, answer))
        if self.kept:
            try:
                self.id = _write(self, self.turns[-1:], run)
            except UsageError as e:
                runlog.warn(f"conversation turn not kept: {e}", key="turn not kept")

    def save(self) -> int:
        """Keep the whole conversation (chat's /save), and every later turn; its id."""
        self.id, self.kept = _write(self, self.turns, None), True
        return self.id


def _open(create: bool) -> sqlite3.Connection:
    path = runlog.log_path()
    if not create and not path.is_file():
        raise UsageError(f"no run log at {path} (nothing logged yet, or deleted), so no conversations; {START}")
    return runlog._connect(path, create, runlog.SCHEMA + SCHEMA)  # the run log's own check and mode, these tables too


def _write(conv: Conversation, turns: list[tuple[str, str]], run: int | None) -> int:
    """Append TURNS (and the conversation, if new) in one transaction; the conversation's id."""
    path = runlog.log_path()
    try:
        with runlog.writing(_open(create=True)) as con:
            ident = conv.id or con.execute("INSERT INTO conversations (time, model, system) VALUES (?, ?, ?)",
                                           (time.time(), conv.model, conv.system)).lastrowid
            con.executemany("INSERT INTO turns (conversation, time, prompt, answer, run) VALUES (?, ?, ?, ?, ?)",
                            [(ident, time.time(), p, a, run) for p, a in turns])
            return ident
    except (OSError, sqlite3.Error) as e:
        raise UsageError(runlog.problem("run log", path, e)) from None


def _read(sql: str, args: tuple = ()) -> list[sqlite3.Row]:
    """Rows of a read; none where the log has no conversations yet (a log older than them)."""
    path = runlog.log_path()
    with contextlib.closing(_open(create=False)) as con:
        con.row_factory = sqlite3.Row
        try:
            return con.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and "no such table" in str(e):
                return []
            raise UsageError(runlog.problem("run log", path, e)) from None


def find(ident: int | None) -> Conversation:
    """Conversation IDENT, or the last one a turn was added to (None)."""
    where = f"--conversation {ident}" if ident else "-c"
    if ident is None:
        last = _read("SELECT conversation FROM turns ORDER BY id DESC LIMIT 1")
        if not last:
            raise UsageError(f"-c: no conversation to continue in the run log {runlog.log_path()}; {START}")
        ident = last[0][0]
    head = _read("SELECT model, system FROM conversations WHERE id = ?", (ident,))
    if not head:
        raise UsageError(f"{where}: no such conversation in the run log {runlog.log_path()} "
                         "(`mtpcli stats --conversations` lists them)")
    turns = _read("SELECT prompt, answer FROM turns WHERE conversation = ? ORDER BY id", (ident,))
    return Conversation(ident, head[0]["model"], head[0]["system"], [(t["prompt"], t["answer"]) for t in turns])


def begin(cfg, go_on: bool, ident: int | None, save: bool, log: bool):
    """(cfg, the conversation) for -c / --conversation ID / --save, or (cfg, None) without them. Going on, the model
    is the conversation's (another named is refused), and so is its system message (another is refused)."""
    from .models import canonical

    flag = f"--conversation {ident}" if ident else "-c" if go_on else "--save"
    if go_on and ident:
        raise UsageError("give -c (the last conversation) or --conversation ID, not both")
    if not (go_on or ident or save):
        return cfg, None
    if not log or runlog.disabled():
        why = "--no-log" if not log else "MTPCLI_NO_LOG"
        raise UsageError(f"{flag}: a conversation is kept in the run log, which {why} turns off")
    if not (go_on or ident):
        return cfg, Conversation(None, canonical(cfg.model), cfg.system)
    conv = find(ident)
    if cfg.where("model") != "default" and canonical(cfg.model) != conv.model:
        raise UsageError(f"{flag}: conversation {conv.id} is with model {conv.model}, not {cfg.model} "
                         f"({cfg.where('model')}); drop the model to go on with it, or start a new conversation")
    if cfg.system is not None and cfg.system != conv.system:
        raise UsageError(f"{flag}: {cfg.where('system')} differs from conversation {conv.id}'s system message, set "
                         "when it began; start a new conversation to change it")
    return replace(cfg, model=conv.model, system=conv.system), conv


def show(ident: int | None, as_json: bool) -> None:
    """`mtpcli stats --conversations`: one row per conversation; with --conversation ID its turns."""
    from .tables import table

    if ident is not None:
        conv = find(ident)
        if as_json:
            print(json.dumps({"id": conv.id, "model": conv.model, "system": conv.system,
                              "turns": [{"prompt": p, "answer": a} for p, a in conv.turns]}))
            return
        title = f"conversation {conv.id} · {conv.model}" + (f" · system: {_short(conv.system)}" if conv.system else "")
        table(["turn", "prompt", "answer"], [[i, _short(p), _short(a)] for i, (p, a) in enumerate(conv.turns, 1)],
              title=title)
        return
    rows = _read("SELECT c.id, c.model, count(t.id) AS turns, max(t.time) AS last, "
                 "(SELECT prompt FROM turns WHERE conversation = c.id ORDER BY id LIMIT 1) AS first "
                 "FROM conversations c LEFT JOIN turns t ON t.conversation = c.id GROUP BY c.id ORDER BY c.id")
    if as_json:
        print(json.dumps([dict(r) for r in rows]))
        return
    when = lambda t: time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"  # noqa: E731
    table(["id", "model", "turns", "last turn", "first prompt"],
          [[r["id"], r["model"], r["turns"], when(r["last"]), _short(r["first"] or "")] for r in rows])


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
