"""The one prompt reader: --prompt, stdin, --prompt-file (files; folders give their *.txt files, recursively,
sorted), --prompts-jsonl, bench prompt sets. A prompt that cannot be used fails its own item (`error`; with one
prompt the caller makes that a usage error). Non-UTF-8 bytes are replaced, with a warning."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import SCHEMA
from .errors import UsageError

SHIPPED = Path(__file__).parent / "bench_prompts"  # the content classes, for `mtpcli bench` without --prompts


@dataclass
class Item:
    index: int
    source: str
    text: str | None = None
    max_tokens: int | None = None
    seed: int | None = None
    error: str | None = None

    @property
    def name(self) -> str:
        return Path(self.source).stem if ":" not in self.source else self.source.rsplit("/", 1)[-1]


def decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")  # (a byte-order mark, as Notepad writes, is dropped)
    except UnicodeDecodeError as e:
        rank = next((os.environ[k] for k in ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK") if k in os.environ), "0")
        if rank == "0":  # under mlx.launch every rank reads the prompts: rank 0 alone says so
            print(f"mtpcli: warning: {source} is not valid UTF-8 (byte {e.start}); invalid bytes replaced with U+FFFD",
                  file=sys.stderr, flush=True)
        return data.decode("utf-8-sig", errors="replace")


def _file(index: int, path: Path) -> Item:
    try:
        return Item(index, str(path), decode(path.read_bytes(), str(path)))
    except OSError as e:
        return Item(index, str(path), error=f"cannot read {path}: {e.strerror or e}")


def _jsonl_row(index: int, source: str, line: str) -> Item:
    try:
        row = json.loads(line)
    except ValueError as e:
        return Item(index, source, error=f"{source}: not valid JSON ({e.msg})")
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        return Item(index, source, error=f"{source}: needs a JSON object with a string \"prompt\"")
    if unknown := sorted(set(row) - {"prompt", "max_tokens", "seed"}):
        return Item(index, source, error=f"{source}: unknown key {unknown[0]!r} (allowed: prompt, max_tokens, seed)")
    for key in ("max_tokens", "seed"):
        if key in row and (type(row[key]) is not int or not SCHEMA[key].check(row[key])):
            return Item(index, source, error=f"{source}: {key} must be an integer ({SCHEMA[key].allowed})")
    return Item(index, source, row["prompt"], row.get("max_tokens"), row.get("seed"))


def read_files(names: list[str], flag: str = "--prompt-file") -> list[Item]:
    items: list[Item] = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            if not (files := sorted(path.rglob("*.txt"))):
                raise UsageError(f"{flag} {name}: no .txt files in that folder")
            items += [_file(len(items) + i, p) for i, p in enumerate(files)]
        elif path.suffix == ".jsonl" and flag == "--prompts":
            items += read_jsonl(name, flag, start=len(items))
        else:
            items.append(_file(len(items), path))
    return items


def read_jsonl(name: str, flag: str = "--prompts-jsonl", start: int = 0) -> list[Item]:
    try:
        lines = Path(name).read_bytes().removeprefix(b"\xef\xbb\xbf").splitlines()  # a byte-order mark is fine
    except OSError as e:
        raise UsageError(f"{flag} {name}: {e.strerror or e}") from None
    items = [_jsonl_row(start + i, f"{name}:{n}", decode(line, f"{name}:{n}"))
             for i, (n, line) in enumerate((n, x) for n, x in enumerate(lines, 1) if x.strip())]
    if not items:
        raise UsageError(f"{flag} {name}: no prompts in the file")
    return items


def read(prompt: str | None, files: list[str], jsonl: str | None) -> tuple[list[Item], bool]:
    """(items, single): several prompts, or the one prompt of --prompt, a file, or stdin."""
    if jsonl or len(files) > 1 or any(Path(f).is_dir() for f in files):
        if prompt is not None:
            raise UsageError("give either --prompt or several prompts (--prompt-file, --prompts-jsonl), not both")
        if "-" in files:
            raise UsageError("--prompt-file -: stdin can be one of several prompts only through --prompts-jsonl")
        items = read_files(files)
        return items + (read_jsonl(jsonl, start=len(items)) if jsonl else []), False
    if prompt is not None and files:
        raise UsageError("give either --prompt or --prompt-file, not both")
    if prompt is not None:
        item = Item(0, "--prompt", prompt)
    elif not files or files[0] == "-":
        if not files and (sys.stdin is None or sys.stdin.isatty()):
            raise UsageError("no prompt: give --prompt TEXT, --prompt-file PATH, or pipe text on stdin")
        item = Item(0, "stdin", decode(sys.stdin.buffer.read(), "stdin"))
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
