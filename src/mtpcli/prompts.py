"""The one prompt reader (flags, stdin, files, folders, JSONL, bench sets): a prompt that cannot be used fails its own
item; non-UTF-8 bytes replaced with a warning; files read in chunks up to MAX_BYTES (a signal ends an endless one)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .config import SCHEMA
from .errors import UsageError

SHIPPED = Path(__file__).parent / "bench_prompts"  # the content classes, for `mtpcli bench` without --prompts
MAX_BYTES = 64 << 20  # a prompt file, stdin or a JSONL line: far above any model's context (~4 bytes a token)
CHUNK = 1 << 20


@dataclass
class Item:
    index: int
    source: str
    text: str | None = None
    max_tokens: int | None = None
    seed: int | None = None
    error: str | None = None
    id: Any = None  # a JSONL row's "id", passed through to its output row
    grammar: str | None = None  # a JSONL row's "schema", compiled (constrain.schema)

    @property
    def name(self) -> str:
        return Path(self.source).stem if ":" not in self.source else self.source.rsplit("/", 1)[-1]


def warn(message: str) -> None:
    rank = next((os.environ[k] for k in ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK") if k in os.environ), "0")
    if rank == "0":  # under mlx.launch every rank reads the prompts: rank 0 alone says so
        print(f"mtpcli: warning: {message}", file=sys.stderr, flush=True)


def decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")  # (a byte-order mark, as Notepad writes, is dropped)
    except UnicodeDecodeError as e:
        warn(f"{source} is not valid UTF-8 (byte {e.start}); invalid bytes replaced with U+FFFD")
        return data.decode("utf-8-sig", errors="replace")


def valid_text(text: str | None, where: str) -> str | None:
    """TEXT with its surrogates replaced, with decode's warning naming WHERE (as the same bytes in a file get): the
    command line's and the environment's bytes that are not UTF-8 (Python keeps them as surrogates), or a lone
    surrogate a JSON string escapes (\\ud800), which no tokenizer takes."""
    if text is None:
        return None
    try:
        text.encode()
    except UnicodeEncodeError:
        try:
            return decode(text.encode("utf-8", "surrogateescape"), where)
        except UnicodeEncodeError:
            return decode(text.encode("utf-8", "surrogatepass"), where)
    return text


class TooLong(ValueError):
    """A prompt past MAX_BYTES."""


def read_capped(f: BinaryIO, what: str) -> bytes:
    """F read whole in chunks, or TooLong past MAX_BYTES (/dev/zero, a runaway pipe)."""
    chunks, size = [], 0
    while chunk := f.read(CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BYTES:
            raise TooLong(f"{what} is larger than {MAX_BYTES >> 20} MiB, the most a prompt may be")
    return b"".join(chunks)


def _file(index: int, path: Path) -> Item:
    try:
        with open(path, "rb") as f:
            return Item(index, str(path), decode(read_capped(f, str(path)), str(path)))
    except TooLong as e:
        return Item(index, str(path), error=str(e))
    except OSError as e:
        return Item(index, str(path), error=f"cannot read {path}: {e.strerror or e}")


def _jsonl_row(index: int, source: str, line: str) -> Item:
    try:
        row = json.loads(line)
    except ValueError as e:
        return Item(index, source, error=f"{source}: not valid JSON ({e.msg})")
    except RecursionError:
        return Item(index, source, error=f"{source}: not valid JSON (nested too deeply)")
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        return Item(index, source, error=f"{source}: needs a JSON object with a string \"prompt\"")
    if unknown := sorted(set(row) - {"prompt", "max_tokens", "seed", "id", "schema"}):
        return Item(index, source,
                    error=f"{source}: unknown key {unknown[0]!r} (allowed: prompt, max_tokens, seed, id, schema)")
    for key in ("max_tokens", "seed"):
        if key in row and (type(row[key]) is not int or not SCHEMA[key].check(row[key])):
            return Item(index, source, error=f"{source}: {key} must be an integer ({SCHEMA[key].allowed})")
    grammar = None
    if "schema" in row:
        from .constrain import schema

        try:
            grammar = schema(row["schema"], f"{source}: schema")
        except UsageError as e:
            return Item(index, source, error=str(e))
    return Item(index, source, valid_text(row["prompt"], source), row.get("max_tokens"), row.get("seed"),
                id=row.get("id"), grammar=grammar)


def stdin(flag: str) -> BinaryIO:
    if sys.stdin is None:
        raise UsageError(f"{flag} -: stdin is closed")
    return sys.stdin.buffer


def read_files(names: list[str], flag: str = "--prompt-file") -> list[Item]:
    items: list[Item] = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            files = []
            for p in sorted(path.rglob("*.txt")):  # a FIFO or a device would block or never end: skipped
                if p.is_file():
                    files.append(p)
                else:
                    warn(f"{flag} {name}: skipped {p}: not a regular file")
            if not files:
                raise UsageError(f"{flag} {name}: no .txt files in that folder")
            items += [_file(len(items) + i, p) for i, p in enumerate(files)]
        elif path.suffix == ".jsonl" and flag == "--prompts":
            items += read_jsonl(name, flag, start=len(items))
        else:
            items.append(_file(len(items), path))
    return items


def read_jsonl(name: str, flag: str = "--prompts-jsonl", start: int = 0) -> list[Item]:
    """A row per non-blank line of NAME (- is stdin); a line past MAX_BYTES refuses the file."""
    try:
        with contextlib.nullcontext(stdin(flag)) if name == "-" else open(name, "rb") as f:
            lines = list(iter(functools.partial(f.readline, MAX_BYTES + 1), b""))
    except OSError as e:
        raise UsageError(f"{flag} {name}: {e.strerror or e}") from None
    if n := next((n for n, x in enumerate(lines, 1) if len(x) > MAX_BYTES), None):
        raise UsageError(f"{flag} {name}:{n}: the line is longer than {MAX_BYTES >> 20} MiB, the most a prompt may be")
    if lines:
        lines[0] = lines[0].removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is fine
    where = "stdin" if name == "-" else name
    items = [_jsonl_row(start + i, f"{where}:{n}", decode(line, f"{where}:{n}"))
             for i, (n, line) in enumerate((n, x) for n, x in enumerate(lines, 1) if x.strip())]
    if not items:
        raise UsageError(f"{flag} {name}: no prompts in the file")
    return items


def read(prompt: str | None, files: list[str], jsonl: list[str] | None) -> tuple[list[Item], bool]:
    """(items, single): several prompts (the files', then each JSONL file's rows), or the one prompt of --prompt, a
    file, or stdin."""
    jsonl = jsonl or []
    if jsonl or len(files) > 1 or any(Path(f).is_dir() for f in files):
        if prompt is not None:
            raise UsageError("give either --prompt or several prompts (--prompt-file, --prompts-jsonl), not both")
        if "-" in files:
            raise UsageError("--prompt-file -: stdin can be one of several prompts only through --prompts-jsonl -")
        if jsonl.count("-") > 1:
            raise UsageError("--prompts-jsonl -: stdin can be read once")
        items = read_files(files)
        for name in jsonl:
            items += read_jsonl(name, start=len(items))
        return items, False
    if prompt is not None and files:
        raise UsageError("give either --prompt or --prompt-file, not both")
    if prompt is not None:
        item = Item(0, "--prompt", prompt)
    elif not files or files[0] == "-":
        if not files and (sys.stdin is None or sys.stdin.isatty()):
            raise UsageError("no prompt: give --prompt TEXT, --prompt-file PATH, or pipe text on stdin")
        try:
            item = Item(0, "stdin", decode(read_capped(stdin("--prompt-file"), "stdin"), "stdin"))
        except TooLong as e:
            raise UsageError(str(e)) from None
    else:
        item = _file(0, Path(files[0]))
        if item.error:
            raise UsageError(f"--prompt-file {item.error.removeprefix('cannot read ')}")
    return [item], True


def bench_set(source: str | None) -> list[Item]:
    """`mtpcli bench --prompts`: comma-separated folders, .jsonl and text files; the shipped content classes."""
    names = [p for p in (source or str(SHIPPED)).split(",") if p]
    if missing := next((name for name in names if not Path(name).exists()), None):
        raise UsageError(f"--prompts {missing}: no such file or folder")
    items = read_files(names, "--prompts")
    if bad := next((it for it in items if it.error), None):
        raise UsageError(f"--prompts: {bad.error}")
    return items


def refuse_overwrite(flag: str, path: str | None, names: list[str]) -> None:
    """Before the work: a result file (FLAG PATH) that is one of the run's prompt files NAMES (a folder's: its .txt
    files) would be overwritten by it: one line naming both."""
    if not path or not os.path.isfile(path):  # (a device, /dev/stdout, is no prompt file)
        return
    for name in (n for n in names if n and n != "-"):
        for f in sorted(Path(name).rglob("*.txt")) if Path(name).is_dir() else [Path(name)]:
            if f.is_file() and os.path.samefile(f, path):
                raise UsageError(f"{flag} {path}: is this run's prompt file {f}; the result would overwrite it")
