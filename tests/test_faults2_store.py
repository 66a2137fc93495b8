"""Faults of what mtpcli keeps (issue 60): prompts kept out of the run log and the history unless --log-prompts,
user files and finished runs not lost, odd rows and blobs skipped by name, stores read in read-only folders and on
full disks, a locked store costing seconds, not minutes, and MTPCLI_NO_LOG read as a boolean."""

import json
import os
import stat

import numpy as np
import pytest

from mtpcli import history, runlog
from test_faults_store import _main


def _secret_free(blob: bytes, secrets, ids_of) -> bool:
    """No secret in BLOB: neither its text nor its token ids as the history keeps them (int32)."""
    return not any(s.encode() in blob or np.asarray(ids_of(s), "<i4").tobytes() in blob for s in secrets)


def test_prompts_are_kept_only_as_a_hash_unless_log_prompts(tiny_paths, tmp_path, monkeypatch, capsys):
    from tiny import VOCAB

    def ids_of(text):
        return [VOCAB.index(c) for c in text]

    chat = tiny_paths["chat"]
    secrets = {k: f"{k} qzv secret 8317" for k in ("flag", "arg", "eq", "system", "file", "sep")}
    (tmp_path / "f.txt").write_text(secrets["file"])
    monkeypatch.chdir(tmp_path)
    runs = [("-p", secrets["flag"], "--system", secrets["system"], "-n", "2", "--separator", secrets["sep"]),
            (secrets["arg"], f"--system={secrets['system']}"), (f"--prompt={secrets['eq']}",),
            ("--prompt-file", "f.txt")]
    for args in runs:
        code, _, err = _main(monkeypatch, capsys, "generate", "-m", chat, "--max-tokens", "4", "-q", "--history", *args)
        assert code == 0, err
    data = runlog.data_dir()
    stored = b"".join(p.read_bytes() for p in sorted(data.iterdir()))
    views = "".join(_main(monkeypatch, capsys, *v)[1] for v in (
        ("stats", "--export", "jsonl"), ("stats", "--json"), ("stats", "--last", "9", "--json"), ("history", "export")))
    assert _secret_free(stored + views.encode(), secrets.values(), ids_of)
    first, _, third, _ = [r["command"] for r in runlog.query()]
    assert first[first.index("-p") + 1] == runlog.REDACTED and third[-1] == f"--prompt={runlog.REDACTED}"
    for p in data.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    asked = "asked qzv secret 4411"
    code, _, err = _main(monkeypatch, capsys, "generate", "-m", chat, "--max-tokens", "4", "-q", "--history",
                         "--log-prompts", "-p", asked)
    assert code == 0, err
    last = runlog.query()[-1]
    assert last["prompt"] == asked and asked in last["command"]
    assert not _secret_free((data / "history.sqlite").read_bytes(), [asked], ids_of)  # its ids, kept as asked
