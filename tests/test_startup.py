"""Start-up: a fast BLAS loaded into the process itself (the wheel's, then the system's, then none), and commands that
import only what they use."""

import ctypes
import json
import os
import subprocess
import sys
import sysconfig

import pytest

from mtpcli import blas

# Runs `mtpcli ARGV` in one process that may not exec another; at exit, the libraries it mapped and the packages it
# imported, as JSON on the last line of stderr.
PROBE = """
import atexit, json, os, sys
def _no_exec(*a, **k):
    raise SystemExit("mtpcli re-executed itself")
for name in ("execv", "execve", "execvp", "execvpe"):
    setattr(os, name, _no_exec)
atexit.register(lambda: print(json.dumps({
    "maps": sorted({l.split()[-1] for l in open("/proc/self/maps") if "/" in l}),
    "modules": sorted({m.split(".")[0] for m in sys.modules})}), file=sys.stderr))
sys.argv = ["mtpcli", *sys.argv[1:]]
from mtpcli.cli import main
main()
"""


def probe(*args, env=None, cwd=None):
    """(exit code, stdout, the mapped libraries, the imported top-level packages) of `mtpcli ARGS` run by PROBE."""
    p = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, stdin=subprocess.DEVNULL,
                       env={**os.environ, **(env or {})}, cwd=cwd, timeout=120)
    seen = json.loads(p.stderr.decode().strip().splitlines()[-1])
    return p.returncode, p.stdout, seen["maps"], seen["modules"]


@pytest.fixture
def fake_libs(tmp_path, monkeypatch):
    """A wheel's libmkl_rt in this environment's data folder and a system OpenBLAS, both fake: their paths."""
    data = tmp_path / "prefix"
    (data / "lib").mkdir(parents=True)
    wheel = data / "lib" / "libmkl_rt.so.3"
    apt = tmp_path / "libopenblas.so.0"
    for f in (wheel, apt):
        f.write_bytes(b"")
    monkeypatch.setattr(sysconfig, "get_path", lambda _, scheme: str(tmp_path / "user" if "user" in scheme else data))
    monkeypatch.setattr(blas, "OPENBLAS", ("/nonexistent/libopenblas.so.0", str(apt)))
    return str(wheel), str(apt)


def test_the_wheel_then_apt_then_none(fake_libs, monkeypatch):
    wheel, apt = fake_libs
    assert blas.candidates() == [("wheel", wheel), ("apt", apt)]
    monkeypatch.setenv("MTPCLI_BLAS_SKIP", "wheel")
    assert blas.candidates() == [("apt", apt)]
    monkeypatch.setenv("MTPCLI_BLAS_SKIP", "wheel,apt")
    assert blas.candidates() == []
    monkeypatch.delenv("MTPCLI_BLAS_SKIP")
    monkeypatch.setenv("MTPCLI_BLAS", "reference")
    assert blas.candidates() == []


def test_load_takes_the_first_that_loads_in_this_process(fake_libs, monkeypatch):
    wheel, apt = fake_libs
    tried = []

    def cdll(path, mode=0):
        tried.append((path, mode))
        if path in broken:
            raise OSError(f"{path}: invalid ELF header")

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("re-executed"))
    broken = set()
    assert blas.load(["generate", "-p", "x"]) == "wheel" and tried == [(wheel, ctypes.RTLD_GLOBAL)]
    broken, tried[:] = {wheel}, []
    assert blas.load(["bench", "-m", "x"]) == "apt" and [p for p, _ in tried] == [wheel, apt]
    assert "MTPCLI_BLAS_HINT" not in os.environ
    broken, tried[:] = {wheel, apt}, []
    assert blas.load(["generate"]) is None and os.environ["MTPCLI_BLAS_HINT"] == "1"  # generate says how to get one
    monkeypatch.delenv("MTPCLI_BLAS_HINT")
    monkeypatch.setenv("MTPCLI_BLAS", "reference")
    tried[:] = []
    assert blas.load(["generate"]) is None and tried == [] and "MTPCLI_BLAS_HINT" not in os.environ
    monkeypatch.delenv("MTPCLI_BLAS")
    assert blas.load(["stats"]) is None and tried == []  # a command that multiplies no matrices loads none
    assert blas.load(["generate", "--help"]) is None and tried == []


@pytest.mark.slow
@pytest.mark.skipif(not blas.candidates(), reason="no fast BLAS on this machine (neither the mkl wheel nor OpenBLAS)")
def test_generate_maps_the_fast_blas_without_a_second_start(tiny_paths, tmp_path):
    route, path = blas.candidates()[0]
    lib = os.path.realpath(path)
    args = ["generate", "--model", tiny_paths["target"], "--no-chat", "--max-tokens", 4, "-q", "-p", "abc"]
    code, out, maps, _ = probe(*args, cwd=tmp_path)
    assert code == 0 and out and lib in maps, (route, lib)
    code, out_ref, maps, _ = probe(*args, env={"MTPCLI_BLAS": "reference"}, cwd=tmp_path)
    assert code == 0 and lib not in maps
    assert not any("libmkl_rt" in m or "libopenblas" in m for m in maps)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--help"], ["generate", "--help"], ["profile", "list"]], ids=" ".join)
def test_commands_import_only_what_they_use(args, tmp_path):
    code, out, maps, modules = probe(*args, cwd=tmp_path)
    assert code == 0 and out
    assert not {"mlx", "mlx_lm", "transformers", "numpy", "rich", "ctypes"} & set(modules)
    assert not any("libmlx" in m or "libmkl" in m or "libopenblas" in m for m in maps)
