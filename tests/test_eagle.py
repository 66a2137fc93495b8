"""EAGLE-3 draft heads (issue 35): tiny checkpoints of the published layout, loading and refusal, the first and second
token distributed as the target's at T = 1 and T = 0.7 with top-k (chains, a batch, a tree) beside a negative
control, and greedy identity with --draft none on a full-attention and a sliding-window target, one row and a
ragged batch. The heads are trained for a few seconds by tools/train_eagle3.py on the tiny target's own samples, so
their drafts pass often enough for both paths of the law to be exercised."""

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mtpcli import eagle, models
from mtpcli.controller import FixedWidth
from mtpcli.drafters.eagle import EagleDrafter
from mtpcli.errors import ModelError
from mtpcli.sampling import SamplingParams
from mtpcli.tree import Spec
from stattools import fit_two
from helpers import argmax_drafts, collect, copies, loaded, passes, plain, run, target_marginals
from tiny import make_eagle3_head, make_model, make_windowed_model

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from train_eagle3 import save, train  # noqa: E402

PROMPT = "def f(x):"
N = 1500
STEPS = 80


def trained_head(target_path: Path, out: Path, taps, draft_vocab: int = 40) -> Path:
    """A head for the tiny target, trained on 96 of its own samples (T = 1, 48 tokens) for STEPS steps."""
    target = models.load(str(target_path))
    model = target.model
    mx.random.seed(0)
    x = mx.array([list(target.tokenizer.encode(PROMPT))] * 96)
    cache, step, seqs = make_prompt_cache(model), x, [x]
    for _ in range(48):
        step = mx.random.categorical(model(step, cache=cache)[:, -1])[:, None].astype(mx.int32)
        seqs.append(step)
    data = np.array(mx.concatenate(seqs, axis=1))
    make_eagle3_head(out, target_path, taps=list(taps), draft_vocab=draft_vocab)  # the config and layout
    cfg = json.loads((out / "config.json").read_text())
    counts = np.bincount(data.ravel(), minlength=cfg["vocab_size"])
    used = np.sort(np.argsort(-counts, kind="stable")[:draft_vocab])
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(taps)
    from mlx_lm.models import llama

    head = eagle.Head(llama.ModelArgs.from_dict(cfg), 3 * cfg["hidden_size"], draft_vocab, False, False)
    train(model, head, list(taps), used, data, minutes=1.0, max_steps=STEPS, batch=8, ttt=3, lr=5e-3, log=None)
    save(head, used, cfg["vocab_size"], out)
    return out


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle")
    full = make_model(root / "full", layers=4, max_positions=512)
    window = make_windowed_model(root / "window")
    return {"full": (full, trained_head(full, root / "full-head", (1, 1, 0))),
            "window": (window, trained_head(window, root / "window-head", (0, 1, 1)))}


def test_the_published_layout_loads_and_reads_three_target_layers(heads, tmp_path):
    target, head = loaded(heads["full"])
    assert head.kind == "eagle3" and head.model.io.taps == (1, 1, 0)
    keys = set(mx.load(str(heads["full"][1] / "model.safetensors")))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight", "d2t", "t2d",
            "lm_head.weight", "norm.weight"} <= keys
    assert head.model.fc.weight.shape == (32, 96) and head.model.layers[0].self_attn.q_proj.weight.shape[1] == 64
    # the Speculators export's names (layers.0.*) and the default taps (1, L/2 - 1, L - 4) of a config without them
    other = make_eagle3_head(tmp_path / "spec", heads["full"][0], prefix="layers.0.")
    assert models.load_draft(str(other), target).model.io.taps == eagle.default_taps(4) == (1, 1, 0)
    # logits over the target's vocabulary: -inf where the reduced vocabulary has no token
    d = EagleDrafter(head.model)
    d.add_rows(1)
    ids = list(target.tokenizer.encode(PROMPT))
    eng_hidden = mx.zeros((1, len(ids) - 1, 96))
    d.start(0, ids, eng_hidden)
    d.io.hidden, d.io.fuse = mx.zeros((1, 1, 96)), True
    logits = d.lm.forward(mx.array([[ids[-1]]]), None, last=True)[0, -1]
    assert logits.shape == (models.output_size(target),) and int(mx.isinf(logits).sum()) == logits.shape[0] - 40


def test_a_head_made_for_another_target_is_refused_before_decoding(heads, tmp_path, cli):
    target, _ = loaded(heads["full"])
    wide = make_model(tmp_path / "wide", hidden=64, layers=4)
    cases = {  # a head of another width, another vocabulary, reading layers this target lacks
        "fc reads 192 values per position": make_eagle3_head(tmp_path / "w", wide),
        "vocabulary has 40 tokens": make_eagle3_head(tmp_path / "v", make_model(tmp_path / "small", layers=4,
                                                                               vocab=make_vocab(40))),
        "reads target layers [1, 2, 7]": make_eagle3_head(tmp_path / "l", heads["full"][0], taps=[1, 2, 7]),
    }
    for why, path in cases.items():
        with pytest.raises(ModelError, match=why.replace("[", r"\[").replace("]", r"\]")):
            models.load_draft(str(path), target)
    r = cli("generate", "-m", heads["full"][0], "--draft-model", cases["fc reads 192 values per position"],
            "--prompt", "abc", "--no-chat")
    err = r.stderr.decode().strip()
    assert r.returncode == 3 and r.stdout == b"" and len(err.splitlines()) == 1 and "made for another target" in err


def make_vocab(n):
    from tiny import VOCAB

    return VOCAB[:n]


@pytest.mark.parametrize("kind", ["full", "window"])
def test_eagle3_greedy_equals_plain_decoding_one_row_and_a_ragged_batch(heads, kind):
    target, head = loaded(heads[kind])
    prompts = [PROMPT, "def g(y, z):\n    return", "x = 1"]
    accepted = drafted = 0
    for prompt in prompts:
        spec, eng = collect(target, EagleDrafter(head.model), FixedWidth(3), (), prompt, 1, max_tokens=40)
        assert spec[0] == plain(target, prompt, 40)
        accepted, drafted = accepted + eng.stats.accepted, drafted + eng.stats.drafted
    assert 0.05 * drafted < accepted < drafted  # both paths of the comparison
    # a ragged batch: three prompts of different lengths, two rows at a time, a refill mid-run
    from mtpcli.engine import DecodeConfig, Engine, Request

    tok = target.tokenizer
    alone = [plain(target, p, 30) for p in prompts]
    eng = Engine(target.model, EagleDrafter(head.model), FixedWidth(3), (), DecodeConfig(), 2)
    outs = run(eng, [Request(i, list(tok.encode(p)), 30, 0, 0) for i, p in enumerate(prompts)])
    assert outs == alone and eng.stats.accepted > 0


def test_eagle3_greedy_trees_equal_plain_decoding(heads):
    target, head = loaded(heads["full"])
    d = EagleDrafter(head.model, trees=Spec(8, 3))
    from mtpcli.engine import DecodeConfig, Engine, Request

    eng = Engine(target.model, d, FixedWidth(4), (), DecodeConfig(), trees=True)
    out = [t for ev in eng.generate([Request(0, list(target.tokenizer.encode(PROMPT)), 40, 0)]) for t in ev.tokens]
    assert out == plain(target, PROMPT, 40) and eng.stats.trees["cycles"] > 0


def sampled(heads, sp, tree=False, batch_size=250):
    target, head = loaded(heads["full"])
    d = EagleDrafter(head.model, trees=Spec(6, 3) if tree else None)
    from mtpcli.engine import DecodeConfig, Engine

    eng = Engine(target.model, d, FixedWidth(3), (), DecodeConfig(sampling=sp), batch_size, trees=tree)
    ids = list(target.tokenizer.encode(PROMPT))
    arr = np.array([o[:2] for o in run(eng, copies(ids, N, 3, 0))])
    return target_marginals(target, ids, sp), arr, eng


@pytest.mark.slow
@pytest.mark.parametrize("sp,tree", [(SamplingParams(temp=1.0), False), (SamplingParams(temp=0.7, top_k=8), False),
                                     (SamplingParams(temp=1.0), True)], ids=str)
def test_eagle3_is_exact_at_positive_temperature(heads, sp, tree):
    (p1, p2), arr, eng = sampled(heads, sp, tree)
    assert 0.2 < eng.stats.acceptance_rate < 0.95 and eng.stats.reached[1] > N / 4  # both paths, both positions
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) == (True, True)


@pytest.mark.slow
def test_negative_control_drafts_not_drawn_from_their_q_fail(heads, monkeypatch):
    """The head's most likely tokens judged as if drawn from its q (min(1, p/q) of a token q did not draw): the
    same test must reject it."""
    argmax_drafts(monkeypatch, EagleDrafter)
    (p1, p2), arr, _ = sampled(heads, SamplingParams(temp=1.0))
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) != (True, True)


def test_the_heads_states_come_from_the_verify_pass(heads, monkeypatch):
    """One target pass per cycle: the tapped states are taken in the pass that verifies, never a second one."""
    target, head = loaded(heads["full"])
    calls = passes(monkeypatch)
    _, eng = collect(target, EagleDrafter(head.model), FixedWidth(3), (), PROMPT, 1, max_tokens=30)
    assert calls.count("target model") == eng.stats.cycles and eng.stats.accepted > 0


def test_cli_eagle3_and_auto_with_a_head(heads, cli):
    t, h = heads["full"]
    for draft, sources in (("eagle3", ["eagle3"]), ("auto", ["ngram", "eagle3"])):
        r = cli("generate", "-m", t, "--draft-model", h, "--draft", draft, "--prompt", PROMPT, "--max-tokens", "12",
                "--no-chat", "--format", "json", "-q", "--temp", "0")
        assert r.returncode == 0, r.stderr.decode()
        doc = json.loads(r.stdout)
        assert doc["settings"]["draft"] == draft and (doc.get("auto", {}).get("sources") or ["eagle3"]) == sources
    r = cli("generate", "-m", t, "--draft-model", h, "--draft", "model", "--prompt", "abc", "--no-chat")
    assert r.returncode == 2 and "is an EAGLE-3 head" in r.stderr.decode()
    out = cli("models", "inspect", h).stdout.decode()
    assert "EAGLE-3 draft head" in out and "[1, 1, 0]" in out


def test_taps_leave_the_targets_logits_as_they_are_and_follow_the_lm_that_runs(tmp_path):
    """A family whose LM head does more than the split one (gemma2 soft-caps its logits): tapped, the target still
    gives its own logits; two LMs tapping one model each get their own pass's states."""
    from mtpcli.cache import LM

    path = make_model(tmp_path / "g2", layers=4, model_type="gemma2", head_dim=8, query_pre_attn_scalar=8,
                      final_logit_softcapping=5.0, attn_logit_softcapping=50.0, sliding_window=16)
    target = models.load(str(path))
    x = mx.array([[3, 4, 5, 6, 7]])
    untapped, a, b = LM(target.model), LM(target.model, taps=(1, 2, 0)), LM(target.model, taps=(1, 2, 0))
    for lm in (untapped, a, b):
        lm.add_rows(1)
    want = untapped.forward(x)
    assert mx.allclose(a.forward(x), want, atol=1e-5).item()
    b.forward(x[:, :2])
    a.forward(x[:, :1])
    assert a.hidden.shape == (1, 1, 3 * 32) and b.hidden.shape == (1, 2, 3 * 32)


def test_the_speculators_export_loads_with_its_nested_layer_config(heads, tmp_path, cli):
    target, _ = loaded(heads["full"])
    path = make_eagle3_head(tmp_path / "spec", heads["full"][0], prefix="layers.0.")
    cfg = json.loads((path / "config.json").read_text())
    layer = {k: cfg.pop(k) for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                     "rms_norm_eps", "max_position_embeddings", "rope_theta")}
    cfg.update(transformer_layer_config={**layer, "model_type": "llama"}, eagle_aux_hidden_state_layer_ids=[1, 2, 3])
    (path / "config.json").write_text(json.dumps(cfg))
    assert models.load_draft(str(path), target).model.io.taps == (0, 1, 2)  # (its ids: the layers whose input it reads)
    assert "hidden: 32  target layers read: [0, 1, 2]" in cli("models", "inspect", path).stdout.decode()


def test_settle_with_a_head_names_it_and_refuses_sharded_targets():
    from mtpcli import config
    from mtpcli.errors import UsageError

    cfg = config.resolve("exact", {"model": "m", "draft_model": "h"})
    assert config.settle(cfg, has_mtp=True, head="eagle3").sources == ("ngram", "eagle3")  # (not the MTP heads too)
    assert config.settle(cfg, has_mtp=False).sources == ("ngram", "model")
    with pytest.raises(UsageError, match="trained head"):
        config.settle(cfg, has_mtp=False, sharded=True, head="eagle3")


def test_eagle3_on_a_hybrid_target_is_greedy_identical(tmp_path):
    from tiny import make_hybrid_model

    h = make_hybrid_model(tmp_path / "hybrid", seed=3)
    target, head = loaded((h, make_eagle3_head(tmp_path / "hh", h, taps=[0, 1, 3], scale=3.0)))
    spec, eng = collect(target, EagleDrafter(head.model), FixedWidth(3), (), PROMPT, 1, max_tokens=24)
    assert spec[0] == plain(target, PROMPT, 24) and eng.stats.drafted > 0
