"""Issue 32: models and feedback. Logged model names, the Hugging Face cache without the network, the model cache's
sizes and `models rm`, status lines on a terminal only, and why a --draft-model never drafted under draft = auto."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time

import pytest


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _hub_cache(root, repo_id, model_folder):
    """A Hugging Face cache (HF_HOME=root) holding `model_folder` as the snapshot of `repo_id`."""
    repo = root / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model_folder, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    return repo / "snapshots" / "abc123"


# ---- 1. a local folder is logged as its absolute path --------------------------------------------------------
def test_relative_model_path_is_logged_as_its_absolute_path(cli, tmp_path, tiny_paths):
    _copy(tiny_paths["target"], tmp_path / "m")
    _copy(tiny_paths["draft"], tmp_path / "d")
    r = cli("generate", "-m", "./m", "--draft-model", "./d", "--draft", "model", "--history", "-p", "ab cd",
            "--max-tokens", "4", "-q")
    assert r.returncode == 0, r.stderr
    from mtpcli import history, runlog

    run = runlog.query(last=1)[-1]
    assert run["model"] == str((tmp_path / "m").resolve())
    assert run["draft"] == str((tmp_path / "d").resolve())
    assert [d["model"] for d in history.export()] == [str((tmp_path / "m").resolve())]


def test_aliases_and_hub_ids_are_logged_as_names(tmp_path, monkeypatch):
    from mtpcli import models

    monkeypatch.chdir(tmp_path)
    assert models.canonical("smollm2-135m") == "smollm2-135m"
    assert models.canonical("org/name") == "org/name"
    (tmp_path / "org" / "name").mkdir(parents=True)  # a folder of that name here: the folder wins, as resolve says
    assert models.canonical("org/name") == str((tmp_path / "org" / "name").resolve())


# ---- 2. a Hugging Face id: the local cache, and the network only where resolve may download (test_hub.py) -------
NET_PROBE = r"""
import sys, time
events = []
sys.addaudithook(lambda e, a: events.append(e) if e in ("socket.connect", "socket.getaddrinfo") else None)
from mtpcli import models, errors
import huggingface_hub
t = time.time()
try:  # what mlx-lm's loaders call with a Hub id: offline, it must not look the id up on the Hub
    huggingface_hub.snapshot_download("org/missing")
except Exception as e:
    print("raised", type(e).__name__)
try:
    models.resolve("org/missing", download=False)
except errors.ModelError as e:
    print("error:", e)
print("folder:", models.resolve("org/name"))
print("net:", events, round(time.time() - t, 1))
"""


@pytest.mark.slow
def test_hub_id_never_touches_the_network_without_hf_hub_offline(tmp_path, tiny_paths):
    snapshot = _hub_cache(tmp_path / "hf", "org/name", tiny_paths["target"])
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_HOME=str(tmp_path / "hf"), HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    t = time.time()
    r = subprocess.run([sys.executable, "-c", NET_PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert "net: []" in r.stdout, r.stdout
    error = next(line for line in out if line.startswith("error:"))
    assert "not in the Hugging Face cache" in error
    assert f"folder: {snapshot.resolve()}" in out
    assert time.time() - t < 60


def test_hub_id_not_cached_is_one_line_quickly(cli, tmp_path, monkeypatch):
    env = {"HF_HOME": str(tmp_path / "hf"), "HTTPS_PROXY": "http://127.0.0.1:9"}
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t = time.time()
    r = cli("models", "inspect", "org/missing", env=env)
    assert r.returncode != 0
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpcli: error: ") and "not in the Hugging Face cache" in lines[0]
    assert time.time() - t < 30


def test_hub_id_in_the_cache_is_inspected_from_its_snapshot(cli, tmp_path, tiny_paths):
    _hub_cache(tmp_path / "hf", "org/name", tiny_paths["target"])
    r = cli("models", "inspect", "org/name", env={"HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 0, r.stderr
    assert b"model_type: llama" in r.stdout


# ---- 3. models list: sizes; models rm ------------------------------------------------------------------------
@pytest.fixture
def model_cache(tiny_paths):
    from mtpcli.fetch import cache_dir

    cache_dir().mkdir(parents=True)
    _copy(tiny_paths["target"], cache_dir() / "smollm2-135m")
    _copy(tiny_paths["draft"], cache_dir() / "gguf-x-0123")
    return cache_dir()


def test_models_list_shows_each_cached_models_size(cli, model_cache):
    from mtpcli import fetch

    r = cli("models", "list")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert out.splitlines()[0].split()[:4] == ["name", "cached", "size", "what"]
    for name in ("smollm2-135m", "gguf-x-0123"):
        size = fetch.human_size(sum(p.stat().st_size for p in (model_cache / name).rglob("*") if p.is_file()))
        assert size.endswith("kB")
        assert any(line.split()[0] == name and size in line for line in out.splitlines()), out


def test_models_rm_removes_a_cached_folder_with_yes(cli, model_cache):
    r = cli("models", "rm", "gguf-x-0123", "--yes")
    assert r.returncode == 0, r.stderr
    assert not (model_cache / "gguf-x-0123").exists() and (model_cache / "smollm2-135m").is_dir()
    assert r.stdout == b"" and b"removed gguf-x-0123" in r.stderr
    assert b"gguf-x-0123" not in cli("models", "list").stdout


def test_models_rm_needs_yes_off_a_terminal(cli, model_cache):
    r = cli("models", "rm", "smollm2-135m")
    assert r.returncode == 2
    assert r.stderr.decode().strip() == "mtpcli: error: models rm needs --yes when not run from a terminal"
    assert (model_cache / "smollm2-135m" / "config.json").is_file()


def test_models_rm_refuses_a_name_not_in_the_cache(cli, model_cache):
    r = cli("models", "rm", "gguf-x-0123", "nope", "--yes")
    assert r.returncode == 2
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpcli: error: 'nope' is not in the model cache")
    assert (model_cache / "gguf-x-0123").is_dir()  # nothing removed when one name is wrong


# ---- 4. status lines on a terminal, nothing in a pipe --------------------------------------------------------
class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_status_shows_on_a_terminal_and_vanishes():
    from mtpcli.gguf_convert import status

    tty = _Tty()
    with status("loading target model X ...", file=tty):
        time.sleep(0.2)
    out = tty.getvalue()
    assert "loading target model X ..." in out
    assert out.endswith("\x1b[2K")  # and the line erased when done (transient)


def test_status_writes_nothing_with_quiet_or_off_a_terminal():
    from mtpcli.gguf_convert import status

    for file, quiet in ((io.StringIO(), False), (_Tty(), True)):
        with status("loading target model X ...", quiet, file=file):
            pass
        assert file.getvalue() == ""


@pytest.mark.slow
def test_generate_on_a_terminal_says_what_it_loads(tmp_path, tiny_paths):
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "mtpcli", "generate", "-m", str(tiny_paths["target"]),
                             "--draft-model", str(tiny_paths["draft"]), "--draft", "model", "-p", "ab",
                             "--max-tokens", "3"], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env=env, cwd=tmp_path)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    proc.wait(timeout=120)
    os.close(master)
    assert proc.returncode == 0, seen
    assert f"loading target model {tiny_paths['target']} ...".encode() in seen
    assert f"loading draft model {tiny_paths['draft']} ...".encode() in seen
    assert b"loading" not in proc.stdout.read()


def test_generate_in_a_pipe_prints_no_status(cli, tiny_paths):
    r = cli("generate", "-m", tiny_paths["target"], "--draft", "none", "-p", "ab", "--max-tokens", "3", "-q")
    assert r.returncode == 0, r.stderr
    assert b"loading" not in r.stderr and b"\x1b" not in r.stderr


# ---- 5. why a --draft-model never drafted under draft = auto ------------------------------------------------
def test_auto_says_why_the_draft_model_never_drafted(cli, tiny_paths):
    # the draft is as large as the target: a draft token costs more than a target step, so auto drafts with it only
    # when it probes it (two cycles after its 8th, then 16th: a busy machine's table cannot keep a source idle for good)
    r = cli("generate", "-m", tiny_paths["target"], "--draft-model", tiny_paths["draft"], "--draft", "auto",
            "-p", "ab cd", "--max-tokens", "200", "-q")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.decode().splitlines() if "drafted in" in line]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"mtpcli: note: draft model {tiny_paths['draft']} drafted in ")
    assert "% of a target step" in lines[0] and "accept" in lines[0]


def test_no_draft_note_when_the_draft_model_drafted_often():
    from mtpcli import config, generate

    cfg = config.Config(draft_model="d")
    record = {"cycles": 10, "sources": {"model": {"cycles": 5, "drafted": 20, "acceptance_rate": 0.5}},
              "auto": {"sources": ["model", "ngram"], "costs": {"step": 1.0, "per_token": {"model": 0.3}, "runs": 1},
                       "warm": False, "measured": None}}
    assert generate.idle_draft_model(cfg, record) is None
    record["sources"]["model"]["cycles"] = 0
    line = generate.idle_draft_model(cfg, record)
    assert "drafted in 0 of 10 cycles" in line and "30% of a target step" in line


def test_models_rm_of_a_linked_entry_removes_the_link_not_its_target(cli, model_cache, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "config.json").write_text("{}")
    (model_cache / "qwen2.5-coder-0.5b").symlink_to(precious, target_is_directory=True)
    r = cli("models", "rm", "qwen2.5-coder-0.5b", "--yes")
    assert r.returncode == 0, r.stderr
    assert (precious / "config.json").exists() and not (model_cache / "qwen2.5-coder-0.5b").exists()
    assert not any(p.name.endswith(".removing") for p in model_cache.iterdir())
