"""`mtpcli chat` keeps each turn's states in memory: the next turn prefills from the conversation's last chunk boundary
(only the tokens past it and its new message), and answers as a cold run of the same transcript at T = 0; /reset
drops them."""

import json
import sqlite3

from mtpcli import models
from mtpcli.generate import encode_prompt
from tiny import noisy_copy

STEP = 16


def runs(tmp_path):
    with sqlite3.connect(tmp_path / "xdg_data_home" / "mtpcli" / "runs.sqlite") as con:
        return [json.loads(s) for (s,) in con.execute("SELECT stats FROM runs ORDER BY id")]


def answers(cli, ident):
    r = cli("stats", "--conversation", str(ident), "--json")
    assert r.returncode == 0, r.stderr.decode()
    return [(t["prompt"], t["answer"]) for t in json.loads(r.stdout)["turns"]]


def test_a_chat_turn_prefills_only_past_the_kept_boundary_and_answers_as_a_cold_run(cli, tiny_paths, tmp_path):
    chat = str(tiny_paths["chat"])
    draft = str(noisy_copy(chat, tmp_path / "chat-draft"))
    flags = ["-m", chat, "--draft", "model", "--draft-model", draft, "--max-tokens", "24", "--prefill-step",
             str(STEP), "--temp", "0"]
    prompts = ["hello there, hello again", "again", "more of it", "hello"]
    r = cli("chat", *flags, input=("/save\n" + "\n".join(prompts) + f"\n/reset\n{prompts[0]}\n").encode())
    assert r.returncode == 0, r.stderr.decode()
    warm = answers(cli, 1)
    stats = runs(tmp_path)
    tok = models.load(chat).tokenizer
    for k in range(1, len(prompts)):
        earlier = [{"role": r, "content": c} for p, a in warm[:k] for r, c in (("user", p), ("assistant", a))]
        ids, other = (encode_prompt(tok, x, None, None, earlier) for x in (prompts[k], "?"))
        settled = next(i for i, (x, y) in enumerate(zip(ids, other)) if x != y)  # where the new message begins
        new, kept = len(ids) - settled, settled // STEP * STEP
        assert settled > STEP and stats[k]["prompt_tokens"] == len(ids)
        # the conversation so far came from memory up to its last boundary: prefilled, the new message and the
        # fewer than STEP tokens before it (the draft model likewise, its context one token shorter)
        assert stats[k]["prompt_cached_tokens"] == kept and len(ids) - kept < new + STEP
        assert stats[k]["draft_cached_tokens"] == kept and stats[k]["draft_prefill_tokens"] == len(ids) - 1 - kept
    assert stats[-1]["prompt_tokens"] > STEP and stats[-1]["prompt_cached_tokens"] == 0  # /reset dropped them
    assert not (tmp_path / "xdg_cache_home" / "mtpcli" / "prefill").exists()  # in memory, not on disk
    # cold: each turn its own process, nothing kept (the same transcript where the answers are the same)
    r = cli("generate", "--save", "-p", prompts[0], "--no-prefill-cache", "-q", *flags)
    assert r.returncode == 0, r.stderr.decode()
    for p in prompts[1:]:
        r = cli("generate", "--conversation", "2", "-p", p, "--no-prefill-cache", "-q", *flags)
        assert r.returncode == 0, r.stderr.decode()
    cold = answers(cli, 2)
    assert all(s["prompt_cached_tokens"] == 0 for s in runs(tmp_path)[len(prompts) + 1:])
    assert cold == warm and len({a for _, a in warm}) > 1
