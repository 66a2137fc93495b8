"""Prefills kept on disk: the states a prompt left in a model (attention keys and values, recurrent layers' state, the
hidden states a head reads), so that a later run whose prompt starts the same way prefills only the rest.

One safetensors file per kept prompt prefix in $XDG_CACHE_HOME/mtpcli/prefill/, named by a hash of its key
(`model_key`: what makes a state valid) and of its tokens; the file holds both, compared before use. cache.LM keeps a
state only at a prefill chunk boundary (it prefills in chunks of prefill_step from position 0, and the step is in
the key), and a prefill resumed there is the cold one, bit for bit. An attention state's first n positions are its
state at n: it serves any shorter boundary; a recurrent state serves its own boundary only. Files are written whole
after the run's output (a temporary file, then os.replace), checked before use (key, tokens, layout, a CRC of key,
tokens and data; cache.LM checks shapes and dtypes against the model), and least recently used go first past the size cap.
A file that fails a check is a miss (one warning; it is left in place); a full or read-only disk only loses the
saving. `mtpcli chat` keeps each model's last kept state in memory too (MEMORY), and resumes the next turn from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten

from . import __version__, blas
from .errors import UsageError
from .runlog import warn

FORMAT = 1
CODES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}  # what a model's states are kept as
TOKENIZER_FILES = ("tokenizer*", "chat_template*", "special_tokens_map.json", "added_tokens.json", "vocab*",
                   "merges*", "*.tiktoken", "tiktoken*", "*.model", "tokenization*.py")  # (models.TOKENIZER_FILES too)
PENDING_MAX = 256 << 20  # bytes of states held for the end of the run; past it they are written at once
MEMORY: dict | None = None  # `mtpcli chat` sets a dict: per model key, [tokens, arrays] of its last kept state


def folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mtpcli" / "prefill"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def tokenizer_files(path: Path) -> list[Path]:
    """The files of a model folder that make its tokenizer and chat template."""
    return sorted({p for pattern in TOKENIZER_FILES for p in Path(path).glob(pattern) if p.is_file()})


def model_key(path: Path, model, role: str, details: str) -> str:
    """What a kept state is valid for: the format, the role, the model (its resolved folder, each weights file's
    size and time, config.json, the weights' dtypes), its tokenizer and chat template (their files), `details` (the
    prefill step, the hidden states kept) and what computes it (MLX, the device, the BLAS)."""
    path = Path(path).resolve()
    weights = [f"{p.name} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in sorted(path.glob("*.safetensors"))]
    tokenizer = hashlib.sha256()
    for p in tokenizer_files(path):
        tokenizer.update(p.name.encode() + b"\0" + p.read_bytes())
    config = path / "config.json"
    dtypes = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters())})
    library = os.path.basename(blas.loaded or "reference")  # (another BLAS sums in another order)
    return "\n".join([f"format {FORMAT}", f"role {role}", f"model {path}", *weights,
                      f"config {_digest(config.read_bytes()) if config.is_file() else '-'}", f"dtypes {dtypes}",
                      f"tokenizer {tokenizer.hexdigest()[:16]}", details,
                      f"mlx {mx.__version__} {mx.default_device()} {library}",
                      f"mlx-lm {mlx_lm.__version__} mtpcli {__version__}"])  # (their model code computes it)


class Bad(Exception):
    """A file that is not a kept prefill of the format, or is damaged."""


def _header(raw: bytes, size: int) -> dict:
    """The metadata of a safetensors file's first bytes (a kept prefill of this format's, else Bad)."""
    if len(raw) < 8:
        raise Bad("too short")
    n = int.from_bytes(raw[:8], "little")
    if n > size - 8 or n > len(raw) - 8:
        raise Bad("truncated header")
    try:
        meta = json.loads(raw[8 : 8 + n]).pop("__metadata__")
        if not isinstance(meta, dict) or meta.get("format") != str(FORMAT):
            raise Bad("not a kept prefill of this format")
    except (ValueError, KeyError, AttributeError, TypeError):
        raise Bad("not a kept prefill") from None
    return meta


def read_header(path: Path) -> tuple[dict, list[int]]:
    """The metadata and the tokens of a kept file, from its header alone."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = f.read(8)
        raw = start + f.read(max(0, min(int.from_bytes(start.ljust(8, b"\0"), "little"), size - 8)))
    meta = _header(raw, size)
    try:
        return meta, [int(t) for t in meta["tokens"].split(",")] if meta["tokens"] else []
    except (KeyError, ValueError, AttributeError):
        raise Bad("no token prefix") from None


def _crc(meta: dict) -> int:
    """The start of a kept file's checksum: its key and tokens (then its data)."""
    return zlib.crc32(f"{meta.get('key')}\n{meta.get('tokens')}".encode())


def load(path: Path) -> tuple[dict, dict[str, mx.array]]:
    """The metadata and the arrays of a kept file, checked: its header (`read_header`), then the arrays as MLX reads
    them, straight into their own memory (no copy of the file on the way: where fresh memory is slow to touch, as on
    this project's CPU machine, each copy of a 1.5B model's 95 MB state cost a warm run ~0.3 s before its first
    token), against the CRC of its key, tokens and data."""
    meta, _ = read_header(path)
    try:
        arrays, theirs = mx.load(str(path), return_metadata=True)
        mx.eval(list(arrays.values()))
    except Exception as e:  # noqa: BLE001 - MLX's own checks (offsets past the end, a dtype it does not know, ...)
        if not path.exists():  # (evicted by another run since its header was read: a miss, as before the header)
            raise FileNotFoundError(path) from None
        raise Bad(f"truncated or damaged ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if theirs != meta:
        raise Bad("changed while it was read")
    crc = _crc(meta)
    for name in sorted(arrays):
        a = arrays[name]
        if a.dtype not in CODES:
            raise Bad(f"tensor {name!r}: not a kept state")
        crc = zlib.crc32(memoryview(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a), crc)
    if str(crc) != meta.get("crc"):
        raise Bad("truncated or damaged (it does not match its checksum)")
    return meta, arrays


def save(path: Path, key: str, tokens: list[int], arrays: dict[str, mx.array]) -> None:
    """Write a kept state whole (a temporary file, then os.replace); OSError passes through (the temporary removed)."""
    meta = {"format": str(FORMAT), "key": key, "tokens": ",".join(map(str, tokens))}
    bufs, entries, at, crc = [], {}, 0, _crc(meta)
    for name in sorted(arrays):
        a = arrays[name]
        buf = np.ascontiguousarray(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)
        entries[name] = {"dtype": CODES[a.dtype], "shape": list(a.shape), "data_offsets": [at, at + buf.nbytes]}
        bufs.append(buf)
        crc, at = zlib.crc32(buf, crc), at + buf.nbytes
    entries["__metadata__"] = {**meta, "crc": str(crc)}
    head = json.dumps(entries).encode()
    head += b" " * (-len(head) % 8)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # (a prompt's states hold the prompt: its owner's)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(len(head).to_bytes(8, "little") + head)
            for buf in bufs:
                f.write(memoryview(buf).cast("B"))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def size(arrays: dict[str, mx.array]) -> int:
    return sum(a.nbytes for a in arrays.values())


def _files() -> list[Path]:
    try:
        return [p for p in folder().iterdir() if p.name.endswith((".safetensors", ".tmp"))]
    except FileNotFoundError:
        return []


def listing() -> list[tuple[Path, dict | None, int, int, str]]:
    """(file, its key's fields or None where unreadable, tokens, bytes, last use), most recently used first."""
    rows = []
    for p in _files():
        if p.name.endswith(".tmp"):
            continue
        try:
            st = p.stat()
        except OSError:  # (removed meanwhile)
            continue
        try:
            meta, tokens = read_header(p)
            fields = dict(line.split(" ", 1) for line in meta.get("key", "").splitlines() if " " in line)
        except (Bad, OSError):
            fields, tokens = None, []
        rows.append((st.st_mtime, p, fields, len(tokens), st.st_size))
    return [(p, f, n, s, time.strftime("%Y-%m-%d %H:%M", time.localtime(t))) for t, p, f, n, s in sorted(
        rows, key=lambda r: r[0], reverse=True)]


def clear() -> int:
    """Delete every kept file (and temporary ones); the count of kept files deleted."""
    n = 0
    for p in _files():
        try:
            p.unlink(missing_ok=True)
        except OSError as e:
            raise UsageError(f"{p}: cannot delete it: {e.strerror} ({n} deleted before it)") from None
        n += p.name.endswith(".safetensors")
    return n


class Store:
    """This run's kept prefills: a `Shelf` per model, one size cap; what the run keeps is written at `flush`."""

    def __init__(self, cap_mb: float, root: Path | None = None, disk: bool = True):
        self.root, self.cap, self.disk = root or folder(), int(cap_mb * (1 << 20)), disk  # disk: files read, written
        self.pending: list[tuple[Path, str, list[int], dict, list[Path]]] = []

    def shelf(self, key: str) -> "Shelf":
        return Shelf(self, key)

    def flush(self) -> None:
        """Write what the run keeps, drop the files it makes redundant, then the least recently used past the cap."""
        pending, self.pending = self.pending, []
        for path, key, tokens, arrays, redundant in pending:
            try:
                save(path, key, tokens, arrays)
            except OSError as e:
                warn(f"prefill cache: this run's prefill is not kept ({self.root}: {e.strerror or e})",
                     key="prefill not kept")
                continue
            for old in redundant:
                old.unlink(missing_ok=True)
        if pending:
            self.evict()

    def evict(self) -> None:
        """Least recently used first (a file's time is its last use), until the kept files fit the cap; temporary
        files a killed run left behind go after an hour."""
        files = []
        try:
            paths = list(self.root.iterdir())
        except OSError:  # (a folder that cannot be read)
            paths = []
        for p in paths:
            try:
                st = p.stat()
                if p.name.endswith(".safetensors"):
                    files.append((st.st_mtime, st.st_size, p))
                elif p.name.endswith(".tmp") and st.st_mtime < time.time() - 3600:
                    p.unlink()
            except OSError:  # (removed by another run meanwhile)
                continue
        total = sum(s for _, s, _ in files)
        for _, s, p in sorted(files):
            if total <= self.cap:
                break
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                warn(f"prefill cache: cannot remove {p}: {e.strerror}", key="prefill not evicted")
                break
            total -= s


def _serves(kept: list[int], tokens: list[int], step: int, trims: bool) -> int:
    """How many of `tokens` a state kept for `kept` (at a boundary) serves: the longest shared boundary (`trims`), else
    all of it where it is a prefix of `tokens`; 0: none."""
    if len(kept) > len(tokens) and not trims:
        return 0
    m = min(len(kept), len(tokens))
    diff = np.nonzero(np.asarray(kept[:m]) != np.asarray(tokens[:m]))[0]
    same = int(diff[0]) if len(diff) else m
    return same // step * step if trims else len(kept) * (same == len(kept))


class Shelf:
    """One model's kept states (cache.LM asks it): the longest kept prefix of a prompt (`find`), and the state at a
    prompt's last boundary (`keep`). Under `mtpcli chat` the last kept state stays in memory (MEMORY), and a prefix it
    serves is not looked up on disk: the next turn resumes from the conversation's last boundary."""

    def __init__(self, store: Store, key: str):
        self.store, self.key, self.id = store, key, _digest(key.encode())
        self._found: Path | None = None  # the file the last `find` used, where all it holds is the prompt's
        self.memory = MEMORY.setdefault(key, [[], {}]) if MEMORY is not None else None

    def _path(self, tokens: list[int]) -> Path:
        return self.store.root / f"{self.id}-{_digest(np.asarray(tokens, '<i4').tobytes())}.safetensors"

    def candidates(self, tokens: list[int], step: int, trims: bool) -> list[tuple[int, bool, float, Path]]:
        """From the files' headers alone: (n, whether the file holds just that prefix, its time, the file) for each
        kept prefix of `tokens` usable at n tokens, n a multiple of `step` (`trims`: a longer kept state serves it;
        else only one kept at exactly n), the longest first."""
        if len(tokens) < step:
            return []
        if self.memory and (n := _serves(self.memory[0], tokens, step, trims)):
            return [(n, False, time.time(), None)]  # (None: the state in memory)
        found = [(n, False, time.time(), arrays) for _, key, kept, arrays, _ in self.store.pending  # (this run's,
                 if key == self.key and (n := _serves(kept, tokens, step, trims))]  # not written yet: in memory)
        try:
            paths = list(self.store.root.glob(f"{self.id}-*.safetensors")) if self.store.disk else []
        except OSError:
            paths = []
        for path in paths:
            try:
                meta, kept = read_header(path)
                if meta.get("key") != self.key:
                    raise Bad("another model's state (its key differs)")
                if not kept or len(kept) % step:
                    raise Bad("not at a prefill boundary")
                if n := _serves(kept, tokens, step, trims):
                    found.append((n, n == len(kept), path.stat().st_mtime, path))
            except FileNotFoundError:  # removed by another run meanwhile
                continue
            except (Bad, OSError) as e:
                warn(f"prefill cache: {path}: {e}; not used (left in place)")
        return sorted(found, key=lambda f: f[:3], reverse=True)

    def find(self, tokens: list[int], step: int, trims: bool, fits) -> tuple[int, dict[str, mx.array]] | None:
        """(n, the kept arrays) for the longest usable kept prefix of `tokens` (`candidates`) whose arrays pass
        fits(n, arrays) (the model's shapes and dtypes); None if there is none."""
        self._found = None
        for n, whole, _, path in self.candidates(tokens, step, trims):
            if not isinstance(path, Path):  # (in memory: chat's, or this run's pending)
                arrays = self.memory[1] if path is None else path
                if fits(n, arrays):
                    return n, arrays
                continue
            try:
                meta, arrays = load(path)
                if meta.get("key") != self.key or meta.get("tokens", "").split(",")[:n] != \
                        [str(t) for t in tokens[:n]]:
                    raise Bad("changed while it was read")
                if not fits(n, arrays):
                    raise Bad("its shapes or dtypes are not this model's")
            except FileNotFoundError:
                continue
            except (Bad, OSError) as e:
                warn(f"prefill cache: {path}: {e}; not used (left in place)")
                continue
            try:
                os.utime(path)  # its last use, for the least-recently-used order
            except OSError:
                pass
            self._found = path if whole else None
            return n, arrays
        return None

    def keep(self, tokens: list[int], arrays: dict[str, mx.array], trims: bool) -> None:
        """Keep the state of `tokens` (a prompt's prefix at a chunk boundary) at the end of the run; with `trims`, the
        kept prefix of it that the last `find` used is redundant then (its state is the first part of this one)."""
        if any(a.dtype not in CODES for a in arrays.values()) or size(arrays) > self.store.cap:
            return
        if self.memory is not None:  # (chat: the next turn's, in memory; not written)
            self.memory[:] = [list(tokens), arrays]
            return
        redundant = [self._found] if trims and self._found not in (None, self._path(tokens)) else []
        if trims:  # (a state pending for a prefix of these tokens is the first part of this one)
            self.store.pending = [p for p in self.store.pending if p[1] != self.key or tokens[: len(p[2])] != p[2]]
        self.store.pending.append((self._path(tokens), self.key, list(tokens), arrays, redundant))
        if sum(size(a) for *_, a, _ in self.store.pending) > PENDING_MAX:
            self.store.flush()
