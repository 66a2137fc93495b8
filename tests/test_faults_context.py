"""A decode never runs past the model's context: max_tokens is capped at what the prompt leaves, said once on
stderr (per row in a batch)."""

import json

import pytest

PROMPT = "abcabcabcabcabcabcab"  # 20 tokens of the tiny tokenizer


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from tiny import make_model

    return make_model(tmp_path_factory.mktemp("ctx") / "m", max_positions=32)


@pytest.mark.parametrize("asked", ["40", "99999999999999999999999"])
def test_max_tokens_is_capped_at_the_context_and_said_once(cli, small, asked):
    r = cli("generate", "--model", small, "--no-chat", "--max-tokens", asked, "--format", "json", "--no-log",
            input=PROMPT.encode())
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["stats"]["prompt_tokens"] == 20
    assert doc["stats"]["generated_tokens"] == 12 and doc["finish_reason"] == "length"
    err = r.stderr.decode()
    assert err.count("capped at 12") == 1 and "context of 32 tokens" in err


def test_each_row_of_a_batch_is_capped_on_its_own(cli, small, tmp_path):
    rows = [{"prompt": PROMPT, "max_tokens": 5}, {"prompt": PROMPT}, {"prompt": "ab"}]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("generate", "--model", small, "--no-chat", "--prompts-jsonl", path, "--max-tokens", "30",
            "--format", "jsonl", "--no-log")
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert [o["stats"]["prompt_tokens"] + o["stats"]["generated_tokens"] for o in out][:2] == [25, 32]
    assert all(o["stats"]["prompt_tokens"] + o["stats"]["generated_tokens"] <= 32 for o in out)
    err = r.stderr.decode()
    assert err.count("capped") == 1 and "p.jsonl:2: max_tokens 30 capped at 12" in err
