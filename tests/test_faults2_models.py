"""Faults of models and their conversion (issue 60): convert never deletes a user's files nor crashes in MLX on a
group size, a cache that cannot be written is one line; inspect fetches nothing; an empty folder named like an alias
hides nothing; SIGTERM while the model loads exits 143; a broken model folder is one line naming the file that is
wrong, found before the weights load."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from mtpcli import config, fetch, models
from mtpcli.errors import ModelError, UsageError
from mtpcli.fetch import cache_dir
from mtpcli.gguf_convert import convert
from test_fetch import fake_index  # noqa: F401  (fixture reuse)
from test_gguf import source, write_gguf  # noqa: F401
from test_faults_store import _main


@pytest.fixture(scope="module")
def gguf(source):  # noqa: F811
    root, _, cfg, weights = source
    path = root / "tiny.gguf"
    if not path.exists():
        write_gguf(path, weights, cfg)
    return path


def _one_line(r, code, *names):
    err = r.stderr.decode()
    assert r.returncode == code and err.count("\n") == 1 and err.startswith("mtpcli: error: "), err
    assert all(str(n) in err for n in names), err
    return err


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


# ---- item 2: convert into a folder that holds a user's files ----------------------------------------------------

def test_convert_into_a_folder_of_user_files_refuses_and_keeps_them(cli, gguf, tmp_path, tiny_paths):
    mine = tmp_path / "out"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    model = shutil.copytree(tiny_paths["target"], tmp_path / "model")  # a model folder convert did not write
    for out in (mine, model):
        before = _snapshot(tmp_path)
        _one_line(cli("convert", gguf, out), 2, out, "not empty")
        assert _snapshot(tmp_path) == before  # not a byte changed, no temporary folder left


def test_convert_replaces_its_own_output_and_keeps_a_users_partial_folder(cli, gguf, tmp_path, monkeypatch):
    (tmp_path / "out.partial").mkdir()  # the fixed temporary name the old code deleted first
    (tmp_path / "out.partial" / "mine.txt").write_text("precious")
    r = cli("convert", gguf, "out")
    assert r.returncode == 0 and r.stdout.decode().strip() == "out", r.stderr
    monkeypatch.chdir(tmp_path)
    convert(gguf, "out", quiet=True)  # again: its own output, replaced
    assert sorted(os.listdir(tmp_path / "out")) == ["chat_template.jinja", "config.json", "model.safetensors",
                                                   "tokenizer.json", "tokenizer_config.json"]
    assert (tmp_path / "out.partial" / "mine.txt").read_text() == "precious"
    assert sorted(os.listdir(tmp_path)) == ["out", "out.partial"]
    assert oct((tmp_path / "out").stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # as mkdir makes a folder


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- item 3: a group size MLX does not take ----------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 7, -64, 256])
def test_a_group_size_mlx_does_not_take_is_one_line_before_mlx(cli, gguf, tmp_path, size):
    r = cli("convert", gguf, "out", "--q-bits", "4", "--q-group-size", size)
    err = _one_line(r, 2, f"--q-group-size {size}")  # (0 was a SIGFPE inside libmlx: no line at all)
    assert "32, 64" in err and not (tmp_path / "out").exists()


def test_a_group_size_wider_than_some_rows_quantizes_the_others(cli, gguf, tmp_path):
    r = cli("convert", gguf, "out", "--q-bits", "4", "--q-group-size", "128")  # the tiny model's rows are 64 wide
    assert r.returncode == 0, r.stderr
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["quantization"] == {"group_size": 128, "bits": 4}
    assert models.load(str(tmp_path / "out")).model is not None


# ---- item 4: convert onto a file, its own input; a cache that cannot be written ----------------------------------

def test_convert_onto_a_file_or_its_own_input_is_one_line_and_keeps_the_file(cli, gguf, tmp_path):
    data, beside = gguf.read_bytes(), sorted(os.listdir(gguf.parent))
    other = tmp_path / "x.txt"
    other.write_text("precious")
    for out, named in ((gguf, gguf), (other, other), (f"{gguf}/sub", gguf)):
        _one_line(cli("convert", gguf, out), 2, named, "not a folder")
    assert gguf.read_bytes() == data and sorted(os.listdir(gguf.parent)) == beside
    assert other.read_text() == "precious" and [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


def test_a_gguf_converted_into_a_read_only_cache_is_one_line(monkeypatch, capsys, gguf):
    cache = cache_dir()
    cache.mkdir(parents=True)
    real = os.mkdir

    def mkdir(path, *a, **k):  # a read-only folder (root may write anywhere: the test says what a user would see)
        if str(path).startswith(str(cache)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", mkdir)
    code, out, err = _main(monkeypatch, capsys, "models", "inspect", gguf)
    lines = err.splitlines()
    assert code == 3 and out == "" and "internal error" not in err, err
    assert lines[-1].startswith(f"mtpcli: error: cannot write {cache}/gguf-tiny-") and "Permission denied" in lines[-1]
    assert os.listdir(cache) == []


@pytest.mark.slow
def test_a_gguf_converted_into_a_full_cache_is_one_line_and_leaves_nothing(gguf, tmp_path):
    # every write past 100 kB fails, as on a full disk (EFBIG where a disk says ENOSPC), in C++ and Python alike
    small_files = ("import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                   "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)); "
                   "os.execv(sys.executable, [sys.executable, '-m', 'mtpcli', *sys.argv[1:]])")
    r = subprocess.run([sys.executable, "-c", small_files, "generate", "-m", str(gguf), "-p", "ab", "-q", "--no-log"],
                       capture_output=True, cwd=tmp_path, env=os.environ, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 3 and r.stdout == b"" and "internal error" not in err, err
    assert err.splitlines()[-1].startswith(f"mtpcli: error: cannot write {cache_dir()}/gguf-tiny-"), err
    assert "File too large" in err and os.listdir(cache_dir()) == []  # no half-written folder


# ---- item 8: inspect fetches nothing; an empty folder named like an alias; SIGTERM while loading; -m "" ---------

def test_inspect_of_an_alias_not_fetched_says_so_and_fetches_nothing(monkeypatch, capsys, fake_index):  # noqa: F811
    alias, calls = fake_index
    code, out, err = _main(monkeypatch, capsys, "models", "inspect", "fake")
    assert code == 3 and out == "" and calls == [] and not fetch.is_cached("fake"), err
    assert err.strip() == (f"mtpcli: error: 'fake' is a known alias not fetched yet (a {fetch.human_size(alias.size)} "
                           "download); `mtpcli models pull fake` fetches and converts it")
    fetch.ensure("fake", quiet=True)  # once fetched, inspect reads it
    code, out, err = _main(monkeypatch, capsys, "models", "inspect", "fake")
    assert code == 0 and "model_type: llama" in out and len(calls) == 1, err


def test_an_empty_folder_named_like_an_alias_does_not_hide_the_alias(cli, tmp_path, tiny_paths, monkeypatch):
    shutil.copytree(tiny_paths["target"], cache_dir() / "smollm2-135m")  # the default model, cached
    (tmp_path / "smollm2-135m").mkdir()  # and an empty folder of its name in the working folder
    r = cli("generate", "-p", "ab", "--max-tokens", "3", "-q", "--no-chat")
    assert r.returncode == 0 and r.stdout, r.stderr
    from mtpcli import runlog

    assert runlog.query(last=1)[-1]["model"] == "smollm2-135m"  # logged as the alias, not the folder
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m" / "notes.txt").write_text("x")  # a folder with files but no config.json: the same
    assert models.canonical("smollm2-135m") == "smollm2-135m"
    assert models.resolve("smollm2-135m") == cache_dir() / "smollm2-135m"


SLOW_LOAD = r"""
import sys, time
from mtpcli import cli, models

def load(*a, **k):
    print("loading", file=sys.stderr, flush=True)
    time.sleep(60)

models.load = load
sys.argv = ["mtpcli", *sys.argv[1:]]
cli.main()
"""


@pytest.mark.slow
def test_sigterm_while_the_model_loads_exits_143(tmp_path, tiny_paths):
    p = subprocess.Popen([sys.executable, "-c", SLOW_LOAD, "generate", "-m", str(tiny_paths["target"]), "-p", "ab",
                          "--no-log"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                         env={**os.environ, "MTPCLI_BLAS": "reference"})
    assert p.stderr.readline() == b"loading\n"
    t = time.time()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143 and out == b"" and b"Traceback" not in err, err
    assert time.time() - t < 10


def test_an_empty_model_name_is_one_line_naming_the_flag_or_file(cli, tmp_path, monkeypatch):
    _one_line(cli("generate", "-m", "", "-p", "ab"), 2, "--model: model is empty")  # (not "model folder .")
    with pytest.raises(UsageError, match="^--draft-model: draft_model is empty"):  # (not: no draft, silently)
        config.resolve(None, {"draft_model": " "}, env={})
    (tmp_path / "p.toml").write_text('model = ""\n')
    with pytest.raises(UsageError, match=f"^{tmp_path / 'p.toml'}: model is empty"):
        config.resolve(str(tmp_path / "p.toml"), {}, env={})
    with pytest.raises(ModelError, match="^the model name is empty"):  # (models inspect "")
        models.resolve("")


# ---- item 9: a broken model folder: one line naming the file, before the weights load ---------------------------

def _edit_config(folder, **changes):
    doc = json.loads((folder / "config.json").read_text())
    doc.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del doc[key]
    (folder / "config.json").write_text(json.dumps(doc))


def _other_tokenizer(folder):
    from tiny import VOCAB, write_tokenizer

    write_tokenizer(folder, vocab=VOCAB[:2] + [f"x{i}" for i in range(100)] + VOCAB[2:])


BROKEN = {  # what is done to a good folder -> (the file named, what the line says)
    "no tokenizer files": (lambda f: [p.unlink() for p in f.glob("tokenizer*")], "", "no tokenizer files"),
    "no model_type": (lambda f: _edit_config(f, model_type=None), "config.json", 'no "model_type"'),
    "weights for fewer layers": (lambda f: _edit_config(f, num_hidden_layers=4), "",
                                 "num_hidden_layers is 4, but the weights (*.safetensors) hold 2 layers"),
    "num_hidden_layers 0": (lambda f: _edit_config(f, num_hidden_layers=0), "config.json", "num_hidden_layers is 0"),
    "max_position_embeddings -5": (lambda f: _edit_config(f, max_position_embeddings=-5), "config.json",
                                   "max_position_embeddings is -5; it must be a positive integer"),
    "a tokenizer.json of another kind": (lambda f: (f / "tokenizer.json").write_text('{"version": "1.0"}'),
                                         "tokenizer.json", 'no "model" in it'),
    "a tokenizer.json that is no JSON": (lambda f: (f / "tokenizer.json").write_text('{"model": '),
                                         "tokenizer.json", "not valid JSON"),
    "the tokenizer of another model": (_other_tokenizer, "tokenizer.json",
                                       "147 tokens, more than the 47 of config.json's vocab_size"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_model_folder_names_the_file_before_the_weights_load(tmp_path, tiny_paths, monkeypatch, case):
    folder = shutil.copytree(tiny_paths["target"], tmp_path / "m")
    breaks, name, says = BROKEN[case]
    breaks(folder)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the weights were loaded"))
    with pytest.raises(ModelError) as e:
        models.load(str(folder), "target model")
    msg = str(e.value)
    assert msg.startswith(f"cannot load target model '{folder}': {folder / name}") and says in msg, msg
    assert "\n" not in msg


def test_a_broken_model_folder_is_one_line_exit_3_from_generate_and_inspect(cli, tmp_path, tiny_paths):
    folder = shutil.copytree(tiny_paths["target"], tmp_path / "m")
    _edit_config(folder, num_hidden_layers=0)
    _one_line(cli("generate", "-m", folder, "-p", "ab", "-q"), 3, folder / "config.json", "num_hidden_layers is 0")
    _one_line(cli("models", "inspect", folder), 3, folder / "config.json", "num_hidden_layers is 0")


def test_a_prompt_the_tokenizer_encodes_to_nothing_is_one_line(cli, tmp_path, tiny_paths):
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    folder = shutil.copytree(tiny_paths["target"], tmp_path / "m")
    Tokenizer(BPE()).save(str(folder / "tokenizer.json"))  # a tokenizer that knows no text
    _one_line(cli("generate", "-m", folder, "-p", "ab", "-q", "--no-chat"), 2, "encodes the prompt to no tokens")
