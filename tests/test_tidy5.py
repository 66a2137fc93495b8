"""Issue 55's last faults (tidy5): the width policy's estimate by its name, Qwen's <|endoftext|> ends a converted
model's generation, and only a failed write to stdout is exit 74."""

import errno
import fcntl
import os
import subprocess
import sys

import pytest

from mtpcli import cli, config, tables
from mtpcli.errors import EXIT_IO
from mtpcli.stats import RunStats


def test_a_runs_table_names_the_width_policys_estimate_width_estimate():
    run = RunStats(generated_tokens=4, cycles=2)
    run.width_estimate = 3.25
    rows = dict(tables.summary_rows(run.to_dict()))
    assert rows["width_estimate"] == "3.25" and not any("controller" in k for k in rows)
    old = {**run.to_dict(), "controller_estimate": 2.5}  # a run logged before the key's rename
    del old["width_estimate"]
    assert dict(tables.summary_rows(old))["width_estimate"] == "2.50"


def test_a_converted_gguf_ends_at_its_control_end_tokens_as_the_hf_folder_does(tmp_path, monkeypatch):
    """Qwen's GGUF names <|im_end|> its eos; its HF folder's generation_config.json lists <|endoftext|> too, and
    mlx-lm stops at both: the converted folder's tokenizer does."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    import test_gguf
    from mtpcli import gguf_convert, models
    from tiny import make_model

    tokens = ["<|endoftext|>", "<|im_end|>"] + test_gguf.TOKENS[2:]
    monkeypatch.setattr(test_gguf, "TOKENS", tokens)
    model, cfg = load_model(make_model(tmp_path / "src", vocab=tokens, hidden=64))
    test_gguf.write_gguf(tmp_path / "m.gguf", dict(tree_flatten(model.parameters())), cfg)  # (eos: id 1)
    out = gguf_convert.convert(tmp_path / "m.gguf", tmp_path / "out", quiet=True)
    assert models.read_tokenizer(out, models.read_config(out)).eos_token_ids == {0, 1}


def _main(argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mtpcli", *argv])
    with pytest.raises(SystemExit) as e:
        cli.main()
    return e.value.code


def test_an_oserror_naming_no_file_is_not_called_a_stdout_failure(monkeypatch, capsys):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")  # (from anything but stdout, no file named)
    monkeypatch.setattr(config, "available", full)
    code = _main(["profile", "list"], monkeypatch)
    err = capsys.readouterr().err
    assert code != EXIT_IO and "stdout" not in err and "No space left on device" in err, (code, err)


def test_a_full_nonblocking_stdout_is_a_stdout_failure_exit_74():
    # a pipe nobody reads, made non-blocking: the raw write returns None and the buffer raises a BlockingIOError
    child = ("import sys\nfrom mtpcli import cli\n@cli.app.command('spam')\ndef spam():\n"
             "    for _ in range(10000):\n        print('y' * 100)\nsys.argv = ['mtpcli', 'spam']\ncli.main()\n")
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        p = subprocess.run([sys.executable, "-c", child], stdout=w, stderr=subprocess.PIPE, env=env, timeout=120)
    finally:
        os.close(w), os.close(r)
    err = p.stderr.decode()
    assert p.returncode == EXIT_IO and "mtpcli: error: stdout:" in err and "internal error" not in err, (p.returncode, err)
