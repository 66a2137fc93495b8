"""The grid a kept prefill resumes on (issues 54 and 56): by default a warm turn resumes at the last 64-token boundary
its prompt shares with a kept one (it re-prefills fewer than 64 old tokens, not 128) and gives the cold run's tokens
at T = 0 and at T = 1 with a seed; and a state is never used where it is not the cold one: a state kept under another
step, or a file that is not at a boundary of its own step (the state of a prompt's exact end, which on this CPU's MKL
is not the state a cold prefill chunked on the grid leaves)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from mtpcli import config, prefix
from mtpcli import models as loading
from mtpcli.cache import LM
from mtpcli.cli import app
from tiny import make_model

GRID = 64  # the default prefill step
P1 = ("def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n" * 5)[:210] + "\nq: what does it print?\na: 5\n"
P2 = P1 + "and add(1, 1)?\na:"
KEPT = (len(P1) - 1) // GRID * GRID  # 192 (the target prefills all but the prompt's last token); 128 on a 128 grid


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("grid") / "m", max_positions=512)


def gen(tmp_path, model, prompt, *args):
    """One in-process `mtpcli generate` with the default prefill step unless args set one: (stdout, --stats-json,
    stderr)."""
    stats = tmp_path / "stats.json"
    r = CliRunner().invoke(app, ["generate", "-m", str(model), "-p", prompt, "--max-tokens", "16", "-q", "--no-log",
                                 "--no-chat", "--stats-json", str(stats), *map(str, args)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return r.stdout, json.loads(stats.read_text()), r.stderr


def test_the_default_step_is_the_grid():
    assert config.Config().prefill_step == GRID


@pytest.mark.parametrize("temp", [("--temp", "0"), ("--temp", "1", "--seed", "5")], ids=["T0", "T1"])
def test_by_default_a_warm_turn_resumes_at_the_last_64_token_boundary(model, tmp_path, temp):
    """P1 kept, then P2 (P1 and more): P2 resumes at P1's last 64-token boundary and gives the cold run's text."""
    cold, *_ = gen(tmp_path, model, P2, *temp, "--no-prefill-cache")
    gen(tmp_path, model, P1, *temp)
    warm, stats, _ = gen(tmp_path, model, P2, *temp)
    assert warm == cold and cold.strip()
    assert stats["prompt_cached_tokens"] == KEPT == 192
    assert stats["prompt_tokens"] - stats["prompt_cached_tokens"] < len(P2) - len(P1) + GRID


def test_a_resumed_prefill_on_the_default_grid_is_the_cold_one_bit_for_bit(model, tmp_path):
    loaded = loading.load(str(model))
    ids = [list(loaded.tokenizer.encode(p))[:-1] for p in (P1, P2)]
    store = prefix.Store(64, tmp_path)

    def state(tokens, shelf):
        lm = LM(loaded.model, prefill_step=config.Config().prefill_step, shelf=shelf)
        lm.add_rows(1)
        lm.set_row(0, tokens)
        return lm, [np.array(a).tobytes() for c in lm.caches for a in c.state]

    state(ids[0], store.shelf("key"))
    store.flush()
    warm, cold = state(ids[1], store.shelf("key")), state(ids[1], None)
    assert warm[0].cached == KEPT and warm[1] == cold[1]


@pytest.mark.parametrize("steps", [(128, 64), (64, 128)])
def test_a_state_kept_under_another_step_is_never_used(model, tmp_path, steps):
    """128 is on the 64 grid, but a state kept there under chunks of 128 is not what chunks of 64 leave (and a 64
    grid's 192 is not on the 128 grid): a miss, the cold run's text. (Fails when the step leaves the key.)"""
    kept, now = steps
    cold, *_ = gen(tmp_path, model, P2, "--prefill-step", now, "--no-prefill-cache")
    gen(tmp_path, model, P1, "--prefill-step", kept)
    warm, stats, _ = gen(tmp_path, model, P2, "--prefill-step", now)
    assert stats["prompt_cached_tokens"] == 0 and warm == cold


def test_a_kept_state_off_its_grid_is_never_used(model, tmp_path, monkeypatch):
    """A file holding P1's state at its exact end (under the grid's key, checksum valid) in place of the one kept at
    its grid boundary is not resumed from, not even its first 192 positions (chunked otherwise): one warning, the cold
    run's text."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    cold, *_ = gen(tmp_path, model, P2, "--no-prefill-cache")
    gen(tmp_path, model, P1)
    (path,) = prefix.folder().glob("*.safetensors")
    meta, arrays = prefix.load(path)
    path.unlink()
    loaded = loading.load(str(model))
    ids = list(loaded.tokenizer.encode(P1))
    lm = LM(loaded.model, prefill_step=len(ids))  # one chunk: the state of P1's exact end
    lm.add_rows(1)
    lm.set_row(0, ids)
    exact = {f"{i}.{x}": getattr(c, x)[..., : len(ids), :] for i, c in enumerate(lm.caches) for x in ("keys", "values")}
    assert exact.keys() == arrays.keys()
    prefix.save(path.with_name(path.stem[:17] + "exact.safetensors"), meta["key"], ids, exact)
    warm, stats, err = gen(tmp_path, model, P2)
    assert stats["prompt_cached_tokens"] == 0 and warm == cold
    assert err.count("not at a prefill boundary") == 1
