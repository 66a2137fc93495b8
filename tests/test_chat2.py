"""A conversation's next turn prefills from its last chunk boundary (only the tokens past it and its new message):
`mtpcli chat` keeps each turn's states in memory, `generate -c` on disk; the answers are a cold run's of the same
transcript at T = 0; chat's /reset drops them."""

import json
import sqlite3

from mtpcli import models
from mtpcli.generate import encode_prompt
from tiny import noisy_copy

STEP = 16


def runs(tmp_path):
    with sqlite3.connect(tmp_path / "xdg_data_home" / "mtpcli" / "runs.sqlite") as con:
        return [json.loads(s) for (s,) in con.execute("SELECT stats FROM runs ORDER BY id")]


def turns(cli, ident):
    r = cli("stats", "--conversation", str(ident), "--json")
    assert r.returncode == 0, r.stderr.decode()
    return [(t["prompt"], t["answer"]) for t in json.loads(r.stdout)["turns"]]


def check_resumed(tok, said, stats):
    """Turn k > 1 of the conversation SAID took its first tokens, to the last boundary before its new message, from the
    kept states (the draft model likewise, its context one token shorter), and prefilled fewer than STEP more."""
    for k in range(1, len(said)):
        earlier = [{"role": r, "content": c} for p, a in said[:k] for r, c in (("user", p), ("assistant", a))]
        ids, other = (encode_prompt(tok, x, None, None, earlier) for x in (said[k][0], "?"))
        settled = next(i for i, (x, y) in enumerate(zip(ids, other)) if x != y)  # where the new message begins
        kept = settled // STEP * STEP
        assert settled > STEP and stats[k]["prompt_tokens"] == len(ids)
        assert stats[k]["prompt_cached_tokens"] == kept and len(ids) - kept < len(ids) - settled + STEP
        assert stats[k]["draft_cached_tokens"] == kept and stats[k]["draft_prefill_tokens"] == len(ids) - 1 - kept


def cold(cli, prompts, flags, ident):
    """Each turn its own process, nothing kept: the conversation's turns."""
    for i, p in enumerate(prompts):
        r = cli("generate", *(["--save"] if i == 0 else ["--conversation", ident]), "-p", p, "--no-prefill-cache",
                "-q", *flags)
        assert r.returncode == 0, r.stderr.decode()
    return turns(cli, ident)


PROMPTS = ["hello there, hello again", "again", "more of it", "hello"]


def setup(tiny_paths, tmp_path):
    chat = str(tiny_paths["chat"])
    draft = str(noisy_copy(chat, tmp_path / "chat-draft"))
    return chat, ["-m", chat, "--draft", "model", "--draft-model", draft, "--max-tokens", "24", "--prefill-step",
                  str(STEP), "--temp", "0"]


def test_a_chat_turn_prefills_only_past_the_kept_boundary_and_answers_as_a_cold_run(cli, tiny_paths, tmp_path):
    chat, flags = setup(tiny_paths, tmp_path)
    r = cli("chat", *flags, input=("/save\n" + "\n".join(PROMPTS) + f"\n/reset\n{PROMPTS[0]}\n").encode())
    assert r.returncode == 0, r.stderr.decode()
    warm, stats = turns(cli, 1), runs(tmp_path)
    check_resumed(models.load(chat).tokenizer, warm, stats)
    assert stats[-1]["prompt_tokens"] > STEP and stats[-1]["prompt_cached_tokens"] == 0  # /reset dropped them
    assert not (tmp_path / "xdg_cache_home" / "mtpcli" / "prefill").exists()  # in memory, not on disk
    assert cold(cli, PROMPTS, flags, "2") == warm and len({a for _, a in warm}) > 1


def test_a_continued_turn_prefills_only_past_the_kept_boundary_and_answers_as_a_cold_run(cli, tiny_paths, tmp_path):
    chat, flags = setup(tiny_paths, tmp_path)
    for i, p in enumerate(PROMPTS):
        r = cli("generate", "--save" if i == 0 else "-c", "-p", p, "-q", *flags)
        assert r.returncode == 0, r.stderr.decode()
    warm = turns(cli, 1)
    check_resumed(models.load(chat).tokenizer, warm, runs(tmp_path))
    assert cold(cli, PROMPTS, flags, "2") == warm
