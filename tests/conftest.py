import os

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # several workers (pytest-xdist): share the cores, not each take all
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)


def pytest_collection_modifyitems(items):
    """A test that runs mtpcli as a process (the `cli` fixture) is slow, as are those marked so (other processes,
    chi-square draws): `-m "not slow"` leaves the quick loop."""
    for item in items:
        if "cli" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch):
    """Every test gets its own config, data and cache homes: no test touches the user's files."""
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    for var in list(os.environ):
        if var.startswith("MTPCLI_"):
            monkeypatch.delenv(var)


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory):
    from tiny import make_model, noisy_copy

    root = tmp_path_factory.mktemp("tiny")
    target = make_model(root / "target")
    draft = noisy_copy(target, root / "draft")
    chat = make_model(root / "chat", chat_template=True)
    return {"target": target, "draft": draft, "chat": chat, "root": root}


@pytest.fixture(scope="session")
def tiny(tiny_paths):
    from mtpcli import models

    return models.load(str(tiny_paths["target"])), models.load(str(tiny_paths["draft"]))


@pytest.fixture
def cli(tmp_path):
    """Run `python -m mtpcli ARGS` as a user would; returns the CompletedProcess (bytes)."""
    import subprocess
    import sys

    def run(*args, input=b"", env=None, timeout=120):
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, "-m", "mtpcli", *map(str, args)], input=input,
                              capture_output=True, env=full_env, timeout=timeout, cwd=tmp_path)
    return run


@pytest.fixture
def udir(tmp_path, monkeypatch):
    """A user profile folder of the test's own (MTPCLI_PROFILE_DIR)."""
    d = tmp_path / "profiles"
    d.mkdir()
    monkeypatch.setenv("MTPCLI_PROFILE_DIR", str(d))
    return d
