"""Faults in what a user gives (issue 31): seeds out of MLX's range, profiles and config.toml, model files, prompt
encodings. Each ends in one line naming the flag, variable, file or row; a bad JSONL row fails that row only."""

import json
import random
import re
import shutil
import sys

import pytest

from mtpcli import config, models, prompts
from mtpcli.errors import ModelError, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BIG = 2**64  # mx.random.key takes 0..2^64-1


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny import make_model

    return make_model(tmp_path_factory.mktemp("faults") / "m")


def _one_line(r, code=2):
    err = r.stderr.decode()
    assert r.returncode == code and err.count("\n") == 1 and err.startswith("mtpcli: error: "), err
    return err


def _jsonl_rows(r):
    return [json.loads(line) for line in r.stdout.decode().splitlines()]


# ---- seeds --------------------------------------------------------------------------------------

def test_a_seed_of_2_64_is_refused_naming_the_flag_or_variable(cli, model):
    err = _one_line(cli("generate", "-m", model, "-p", "ab", "--max-tokens", "2", "-q", "--seed", BIG))
    assert "--seed" in err and "internal error" not in err
    err = _one_line(cli("generate", "-m", model, "-p", "ab", "--max-tokens", "2", "-q", env={"MTPCLI_SEED": str(BIG)}))
    assert "MTPCLI_SEED" in err
    assert config.resolve(None, {"seed": BIG - 1}, env={}).seed == BIG - 1


def test_a_jsonl_rows_seed_of_2_64_fails_that_row_only(cli, model, tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"prompt": "abc", "seed": BIG}) + "\n" + json.dumps({"prompt": "abd"}) + "\n")
    r = cli("generate", "-m", model, "--prompts-jsonl", src, "--format", "jsonl", "--max-tokens", "3", "--no-chat",
            "-q", "--temp", "1")
    rows = _jsonl_rows(r)
    assert r.returncode == 1 and "internal error" not in r.stderr.decode()
    assert "seed" in rows[0]["error"] and f"{src}:1" in rows[0]["error"]
    assert "error" not in rows[1] and rows[1]["stats"]["generated_tokens"]


def test_row_seeds_near_2_64_wrap_and_existing_seeds_keep_their_output(cli, model, tmp_path):
    texts = ("abc", "the sea", "xyz")
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in texts))
    args = ["-m", model, "--format", "jsonl", "--max-tokens", "6", "--no-chat", "-q", "--temp", "1", "--batch-size", "1"]
    r = cli("generate", "--prompts-jsonl", src, "--seed", BIG - 2, *args)
    assert r.returncode == 0, r.stderr.decode()
    rows = _jsonl_rows(r)
    # row i draws with seed (s + i) mod 2^64: row 1's is 2^64 - 1, row 2's is 0
    for i, seed in ((1, BIG - 1), (2, 0)):
        one = tmp_path / f"{i}.jsonl"
        one.write_text(json.dumps({"prompt": texts[i]}) + "\n")
        alone = cli("generate", "--prompts-jsonl", one, "--seed", seed, *args)
        assert _jsonl_rows(alone)[0]["text"] == rows[i]["text"]


# ---- profiles and config.toml --------------------------------------------------------------------

def test_profile_use_writes_valid_toml_for_any_name(cli, udir):
    env = {"MTPCLI_PROFILE_DIR": str(udir)}
    (udir / 'q"x.toml').write_text("temp = 0.5\n")
    assert cli("profile", "use", 'q"x', env=env).returncode == 0
    show = cli("profile", "show", env=env)
    assert show.returncode == 0, show.stderr.decode()
    assert tomllib.loads(show.stdout.decode())["temp"] == 0.5
    err = _one_line(cli("profile", "use", 'q"y', env=env))
    assert "unknown profile 'q\"y'" in err
    assert config.default_name() == 'q"x'


def test_profile_show_prints_valid_toml(cli, udir):
    env = {"MTPCLI_PROFILE_DIR": str(udir), "MTPCLI_SYSTEM": 'say "hi"\nthen \\stop'}
    for extra in ((), ("--origin",)):
        r = cli("profile", "show", *extra, env=env)
        assert r.returncode == 0, r.stderr.decode()
        doc = tomllib.loads(r.stdout.decode())
        assert doc["model"] == config.SCHEMA["model"].default and doc["system"] == env["MTPCLI_SYSTEM"]
        assert "draft_model" not in doc and "# draft_model: unset" in r.stdout.decode()


def test_origin_credits_inherited_keys_to_the_file_that_set_them(cli, udir):
    (udir / "base.toml").write_text("temp = 0.5\ntop_k = 3\n")
    (udir / "kid.toml").write_text('extends = "base"\ntop_k = 5\n')
    cfg = config.resolve("kid", {}, env={})
    assert cfg.origins["temp"] == str(udir / "base.toml") and cfg.origins["top_k"] == str(udir / "kid.toml")
    out = cli("profile", "show", "kid", "--origin", env={"MTPCLI_PROFILE_DIR": str(udir)}).stdout.decode()
    temp = next(line for line in out.splitlines() if line.startswith("temp ="))
    assert temp.endswith(str(udir / "base.toml"))


@pytest.mark.parametrize("text, key", [("default_profile = 7\n", "default_profile"),
                                       ('default_profile = "exact"\ndefualt_profile = "x"\n', "defualt_profile")])
def test_a_bad_config_toml_is_one_line_naming_the_file_and_key(cli, text, key):
    path = config.config_file()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    err = _one_line(cli("profile", "show"))
    assert str(path) in err and key in err


def test_unknown_profile_names_the_file_that_asked_for_it(udir):
    (udir / "kid.toml").write_text('extends = "nope"\n')
    with pytest.raises(UsageError, match=rf"{re.escape(str(udir / 'kid.toml'))}.*extends.*unknown profile 'nope'"):
        config.resolve("kid", {}, env={})
    config.config_file().parent.mkdir(parents=True)
    config.config_file().write_text('default_profile = "gone"\n')
    with pytest.raises(UsageError, match=rf"{re.escape(str(config.config_file()))}.*default_profile.*unknown profile 'gone'"):
        config.resolve(None, {}, env={})


# ---- model files ---------------------------------------------------------------------------------

def test_a_bad_config_json_names_the_file(model, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(model, bad)
    (bad / "config.json").write_text("{\n")
    with pytest.raises(ModelError, match=re.escape(str(bad / "config.json"))):
        models.load(str(bad))
    with pytest.raises(ModelError, match=re.escape(str(bad / "config.json"))):
        models.read_config(bad)


def test_garbage_weights_are_one_line_naming_the_file_exit_3(cli, model, tmp_path):
    bad = tmp_path / "garbage"
    shutil.copytree(model, bad)
    (bad / "model.safetensors").write_bytes(random.Random(0).randbytes(100_000))
    err = _one_line(cli("generate", "-m", bad, "-p", "ab", "-q"), code=3)
    assert str(bad / "model.safetensors") in err


# ---- prompt encodings ----------------------------------------------------------------------------

def test_a_folder_prompts_utf8_warning_is_printed_once_over_the_ranks(tmp_path, capsys, monkeypatch):
    d = tmp_path / "p"
    d.mkdir()
    (d / "a.txt").write_bytes(b"ab\xffc")
    prompts.read(None, [str(d)], None)
    assert capsys.readouterr().err.count("not valid UTF-8") == 1
    monkeypatch.setenv("MLX_RANK", "1")  # under mlx.launch every rank reads the prompts: rank 0 alone says so
    items, _ = prompts.read(None, [str(d)], None)
    assert "UTF-8" not in capsys.readouterr().err and items[0].text == "ab\ufffdc"


def test_invalid_utf8_in_jsonl_warns_naming_the_line(tmp_path, capsys):
    src = tmp_path / "p.jsonl"
    src.write_bytes(b'{"prompt": "ok"}\n{"prompt": "ab\xffc"}\n')
    items = prompts.read_jsonl(str(src))
    err = capsys.readouterr().err
    assert f"{src}:2 is not valid UTF-8" in err and err.count("\n") == 1
    assert items[1].text == "ab\ufffdc" and items[1].error is None


def test_a_bom_on_jsonl_line_1_is_accepted(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_bytes(b'\xef\xbb\xbf{"prompt": "abc"}\n{"prompt": "abd"}\n')
    items = prompts.read_jsonl(str(src))
    assert [(it.text, it.error) for it in items] == [("abc", None), ("abd", None)]


def test_a_byte_order_mark_on_a_prompt_file_or_stdin_is_not_part_of_the_prompt(tmp_path):
    from mtpcli.prompts import decode

    assert decode(b"\xef\xbb\xbfdef f():", "p.txt") == "def f():"  # as Notepad saves UTF-8
    assert decode("héllo".encode(), "p.txt") == "héllo"
