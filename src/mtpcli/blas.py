"""A fast BLAS loaded into this process before MLX on Linux, RTLD_GLOBAL (MKL's wheel, else Debian's OpenBLAS;
MTPCLI_BLAS, MTPCLI_BLAS_SKIP): README.md, CPU speed on Linux."""

from __future__ import annotations

import os
import sys
import sysconfig

OPENBLAS = ("/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
            "/usr/lib64/libopenblas.so.0", "/usr/lib/libopenblas.so.0")
COMMANDS = {"generate", "bench", "chat"}  # the commands that multiply matrices
loaded: str | None = None  # the library `load` loaded (None: MLX's own), which the kept prefills' key names


def wheel_libs() -> list[str]:
    """The mkl wheel's libmkl_rt, where pip puts a wheel's data files: this environment's prefix, then the user's."""
    dirs = [os.path.join(sysconfig.get_path("data", scheme), "lib")
            for scheme in (sysconfig.get_default_scheme(), f"{os.name}_user")]
    return [os.path.join(d, f) for d in dirs if os.path.isdir(d)
            for f in sorted(os.listdir(d), reverse=True) if f.startswith("libmkl_rt.so")]


def candidates() -> list[tuple[str, str]]:
    """(route, library) to try in order: the wheel's, then the system's OpenBLAS; none on other systems or with
    MTPCLI_BLAS=reference."""
    if not sys.platform.startswith("linux") or os.environ.get("MTPCLI_BLAS") == "reference":
        return []
    skip = os.environ.get("MTPCLI_BLAS_SKIP", "").split(",")
    routes = {"wheel": wheel_libs, "apt": lambda: [p for p in OPENBLAS if os.path.exists(p)]}
    return [(route, path) for route, found in routes.items() if route not in skip for path in found()]


def load(argv: list[str]) -> str | None:
    """For a command in COMMANDS (not its help), load the first fast BLAS that loads, before MLX is imported
    (Python loads libmlx with RTLD_NOW: its symbols are bound then).

    Returns its route ("wheel", "apt"), or None: the reference BLAS, and then (unless MTPCLI_BLAS=reference chose it)
    MTPCLI_BLAS_HINT=1, for generate's hint on how to get a fast one."""
    if not COMMANDS & set(argv) or {"-h", "--help"} & set(argv):
        return None
    import ctypes  # (not for the commands that need no BLAS)

    global loaded
    for route, path in candidates():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            loaded = path
            return route
        except OSError:  # a broken or foreign library: the next route
            continue
    if sys.platform.startswith("linux") and os.environ.get("MTPCLI_BLAS") != "reference":
        os.environ["MTPCLI_BLAS_HINT"] = "1"
    return None
