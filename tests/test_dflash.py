"""DFlash block drafters (issue 35): tiny random checkpoints of z-lab's layout, loading and refusal, greedy identity
with --draft none on a full-attention and a sliding-window target (one row and a ragged batch), and the first and
second token distributed as the target's at T = 1 and T = 0.7 with top-k beside a negative control. The slots of a
block are drawn independently, each from its own q: a flat target (logit scale 1) makes them pass often enough."""

import json

import numpy as np
import pytest

from mtpcli import dflash, models
from mtpcli.controller import FixedWidth
from mtpcli.drafters.dflash import DFlashDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.errors import ModelError
from mtpcli.sampling import SamplingParams
from stattools import fit_two
from helpers import argmax_drafts, collect, loaded, passes, plain, run, target_marginals
from tiny import make_dflash_drafter, make_model, make_windowed_model

PROMPT = "def f(x):"
N = 1500


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash")
    flat = make_model(root / "flat", layers=4, logit_scale=1.0)
    window = make_windowed_model(root / "window")
    return {"flat": (flat, make_dflash_drafter(root / "flat-d", flat)),
            "window": (window, make_dflash_drafter(root / "window-d", window, taps=[0, 1]))}


def test_the_published_layout_loads_over_the_targets_embedding_and_head(pairs, cli):
    target, d = loaded(pairs["flat"])
    assert d.kind == "dflash" and d.model.io.taps == (0, 3) and d.model.io.block == 4
    assert "embed_tokens" not in d.model and "lm_head" not in d.model  # the target's own
    assert dflash.default_taps(36, 5) == (1, 9, 17, 25, 33)  # z-lab's build_target_layer_ids
    out = cli("models", "inspect", pairs["flat"][1]).stdout.decode()
    assert "DFlash block-diffusion drafter" in out and "[0, 3]" in out


def test_block_size_mask_id_and_layers_are_read_from_dflash_config_or_the_top_level(pairs, tmp_path):
    """Exports differ in where they put these three fields: each is read from either place (a null is no value)."""
    target, d = loaded(pairs["flat"])
    moved = tmp_path / "moved"
    moved.mkdir()
    config = json.loads((pairs["flat"][1] / "config.json").read_text())
    extra = config.pop("dflash_config")
    config |= {"mask_token_id": extra["mask_token_id"], "target_layer_ids": extra["target_layer_ids"],
               "dflash_config": {"block_size": config.pop("block_size"), "mask_token_id": None}}
    (moved / "config.json").write_text(json.dumps(config))
    (moved / "model.safetensors").symlink_to(pairs["flat"][1] / "model.safetensors")
    io = models.load_draft(str(moved), target).model.io
    assert (io.taps, io.block, io.mask_id) == (d.model.io.taps, d.model.io.block, d.model.io.mask_id) == ((0, 3), 4, 2)


def test_a_drafter_made_for_another_target_is_refused_before_decoding(pairs, tmp_path, cli):
    target, _ = loaded(pairs["flat"])
    cases = {"it reads 128 values per position": make_dflash_drafter(tmp_path / "w", make_model(tmp_path / "wide",
                                                                                              hidden=64, layers=4)),
             r"reads target layers \[0, 9\]": make_dflash_drafter(tmp_path / "l", pairs["flat"][0], taps=[0, 9]),
             "mask_token_id below": make_dflash_drafter(tmp_path / "m", pairs["flat"][0], mask_id=999)}
    for why, path in cases.items():
        with pytest.raises(ModelError, match=why):
            models.load_draft(str(path), target)
    r = cli("generate", "-m", pairs["flat"][0], "--draft-model", cases["mask_token_id below"], "--prompt", "abc",
            "--no-chat")
    err = r.stderr.decode().strip()
    assert r.returncode == 3 and r.stdout == b"" and len(err.splitlines()) == 1 and "DFlash drafter" in err


@pytest.mark.parametrize("kind", ["flat", "window"])
def test_dflash_greedy_equals_plain_decoding_one_row_and_a_ragged_batch(pairs, kind):
    target, d = loaded(pairs[kind])
    prompts = [PROMPT, "def g(y, z):\n    return", "x = 1"]
    for prompt in prompts:
        spec, eng = collect(target, DFlashDrafter(d.model), FixedWidth(3), (), prompt, 1, max_tokens=30)
        assert spec[0] == plain(target, prompt, 30) and eng.stats.drafted > 0
    tok = target.tokenizer
    alone = [plain(target, p, 24) for p in prompts]
    eng = Engine(target.model, DFlashDrafter(d.model), FixedWidth(3), (), DecodeConfig(), 2)
    assert run(eng, [Request(i, list(tok.encode(p)), 24, 0, 0) for i, p in enumerate(prompts)]) == alone


def sampled(pairs, sp):
    target, d = loaded(pairs["flat"])
    ids = list(target.tokenizer.encode(PROMPT))
    outs, eng = collect(target, DFlashDrafter(d.model), FixedWidth(3), (), PROMPT, N, 250, max_tokens=3, sampling=sp)
    return target_marginals(target, ids, sp), np.array([o[:2] for o in outs]), eng


@pytest.mark.slow
@pytest.mark.parametrize("sp", [SamplingParams(temp=1.0), SamplingParams(temp=0.7, top_k=20)], ids=str)
def test_dflash_is_exact_at_positive_temperature(pairs, sp):
    (p1, p2), arr, eng = sampled(pairs, sp)
    assert 0.1 < eng.stats.acceptance_rate < 0.95 and eng.stats.accepted_at[1] > N / 50  # both positions pass
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) == (True, True)


@pytest.mark.slow
def test_negative_control_drafts_not_drawn_from_their_q_fail(pairs, monkeypatch):
    argmax_drafts(monkeypatch, DFlashDrafter)
    (p1, p2), arr, _ = sampled(pairs, SamplingParams(temp=1.0))
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) != (True, True)


def test_one_target_pass_per_cycle_and_a_context_of_committed_tokens_only(pairs, monkeypatch):
    target, d = loaded(pairs["flat"])
    calls = passes(monkeypatch)
    seen = []
    propose = DFlashDrafter.propose

    def checked(self, contexts, *a, **kw):
        self._write()
        seen.append((int(self.lm.pos[0]), len(contexts[0])))
        return propose(self, contexts, *a, **kw)

    monkeypatch.setattr(DFlashDrafter, "propose", checked)
    _, eng = collect(target, DFlashDrafter(d.model), FixedWidth(3), (), PROMPT, 1, max_tokens=20)
    assert calls.count("target model") == eng.stats.cycles
    assert seen and all(pos == n - 1 for pos, n in seen)  # every committed token but the newest, nothing drafted


def test_cli_dflash_and_auto(pairs, cli):
    t, d = pairs["flat"]
    for draft, sources in (("dflash", None), ("auto", ["ngram", "dflash"])):
        r = cli("generate", "-m", t, "--draft-model", d, "--draft", draft, "--prompt", PROMPT, "--max-tokens", "10",
                "--no-chat", "--format", "json", "-q")
        assert r.returncode == 0, r.stderr.decode()
        doc = json.loads(r.stdout)
        assert doc["settings"]["draft"] == draft and doc.get("auto", {}).get("sources") == sources
    r = cli("generate", "-m", t, "--draft-model", d, "--draft", "eagle3", "--prompt", "abc", "--no-chat")
    assert r.returncode == 2 and "is a DFlash drafter" in r.stderr.decode()


def test_dflash_on_a_hybrid_target_is_greedy_identical_and_a_batch_row_samples_as_alone(pairs, tmp_path):
    from tiny import make_hybrid_model

    h = make_hybrid_model(tmp_path / "hybrid", seed=3)
    target, d = loaded((h, make_dflash_drafter(tmp_path / "hd", h, taps=[0, 2])))
    spec, eng = collect(target, DFlashDrafter(d.model), FixedWidth(3), (), PROMPT, 1, max_tokens=24)
    assert spec[0] == plain(target, PROMPT, 24) and eng.stats.drafted > 0
    # T > 0: a row of a batch draws what it draws alone (its own keys, whatever its neighbours' budgets)
    target, d = loaded(pairs["flat"])
    sp, tok = SamplingParams(temp=1.0), target.tokenizer
    reqs = [Request(0, list(tok.encode(PROMPT)), 6, 5), Request(1, list(tok.encode("x = 1")), 30, 7)]
    alone = [[t for ev in Engine(target.model, DFlashDrafter(d.model), FixedWidth(3), (),
                                 DecodeConfig(sampling=sp)).generate([r]) for t in ev.tokens]
             for r in reqs]
    eng = Engine(target.model, DFlashDrafter(d.model), FixedWidth(3), (), DecodeConfig(sampling=sp), 2)
    assert run(eng, reqs) == alone
