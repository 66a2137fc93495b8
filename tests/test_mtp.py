"""Native MTP heads: tiny random checkpoints of the DeepSeek-V3, Qwen3-Next and Qwen3.5 layouts."""

import re

import mlx.core as mx
import numpy as np
import pytest

from mtpcli import models, mtp
from mtpcli.controller import FixedWidth
from mtpcli.drafters import NoDraft
from mtpcli.drafters.mtp import MtpDrafter

from mtpcli.errors import ModelError
from mtpcli.sampling import SamplingParams
from tiny import make_mtp_model
from stattools import fit_two
from helpers import collect, target_marginals

FAMILIES = ["deepseek_v3", "qwen3_next", "qwen3_5"]

# Key names of the public checkpoints' heads (DeepSeek-V3 model.layers.61.*, Qwen3-Next-80B-A3B mtp.*, Qwen3.5 dense
# mtp.*), with the layer index written N and expert numbers e.
QWEN_MTP = [  # what Qwen3-Next's and Qwen3.5's heads share: all but the MLP
    "fc.weight", "norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight",
    "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight", "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
    "layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight"]
PUBLIC = {
    "deepseek_v3": {f"model.layers.N.{k}" for k in [
        "eh_proj.weight", "embed_tokens.weight", "enorm.weight", "hnorm.weight", "input_layernorm.weight",
        "mlp.experts.e.down_proj.weight", "mlp.experts.e.gate_proj.weight", "mlp.experts.e.up_proj.weight",
        "mlp.gate.e_score_correction_bias", "mlp.gate.weight", "mlp.shared_experts.down_proj.weight",
        "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight", "post_attention_layernorm.weight",
        "self_attn.kv_a_layernorm.weight", "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_b_proj.weight",
        "self_attn.o_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_a_proj.weight",
        "self_attn.q_b_proj.weight", "shared_head.head.weight", "shared_head.norm.weight"]},
    "qwen3_next": {f"mtp.{k}" for k in [
        *QWEN_MTP, "layers.0.mlp.gate.weight", "layers.0.mlp.experts.e.gate_proj.weight",
        "layers.0.mlp.experts.e.up_proj.weight", "layers.0.mlp.experts.e.down_proj.weight",
        "layers.0.mlp.shared_expert.gate_proj.weight", "layers.0.mlp.shared_expert.up_proj.weight",
        "layers.0.mlp.shared_expert.down_proj.weight", "layers.0.mlp.shared_expert_gate.weight"]},
    "qwen3_5": {f"mtp.{k}" for k in [
        *QWEN_MTP, "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight"]},
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    made = {}

    def get(family, **kw):
        key = (family, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = make_mtp_model(root / f"{family}-{len(made)}", family, **kw)
        return made[key]

    return get


def decode(loaded, drafter, width, prompt="abcabcab hello", n=1, **cfg):
    return collect(loaded, drafter, FixedWidth(width), (), prompt, n, **cfg)


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_found_with_the_public_key_names(ckpt, family):
    path = ckpt(family)
    spec = mtp.find(path, models.read_config(path))
    assert spec is not None and spec.layers == 1
    n = models.read_config(path)["num_hidden_layers"]
    names = {re.sub(r"experts\.\d+\.", "experts.e.", k).replace(f"layers.{n}.", "layers.N.") for k in spec.keys}
    assert names == PUBLIC[family]
    assert mtp.find(ckpt(family, heads=False), models.read_config(path)) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_target_loads_the_same_with_and_without_heads(ckpt, family):
    from mlx_lm import load as mlx_load

    with_heads = models.load(str(ckpt(family)))
    plain, _ = mlx_load(str(ckpt(family, heads=False)))  # same seed: the same main weights, no heads
    x = mx.array([[3, 4, 5, 6, 7]])
    assert mx.allclose(with_heads.model(x), plain(x), atol=1e-5).item()


@pytest.mark.parametrize("family", FAMILIES)
def test_head_weights_load_with_zero_centred_norms_shifted(ckpt, family):
    head = models.mtp_head(models.load(str(ckpt(family))))
    # the tiny heads are written with unit norms: stored as 0 in the zero-centred (Qwen) layouts, 1 in DeepSeek's
    for name in ("norm_e", "norm_h", "norm"):
        assert mx.all(mx.abs(getattr(head, name).weight - 1.0) < 1e-6).item(), name
    assert mx.all(mx.abs(head.layer.input_layernorm.weight - 1.0) < 1e-6).item()
    if family != "deepseek_v3":
        assert mx.all(mx.abs(head.layer.self_attn.q_norm.weight - 1.0) < 1e-6).item()
    hidden = head.proj.weight.shape[0]
    assert float(mx.abs(head.proj.weight[:, :hidden] - mx.eye(hidden)).max()) < 0.5  # the oracle's near-identity


@pytest.mark.parametrize("family", FAMILIES)
def test_a_perfect_head_gets_every_draft_accepted(ckpt, family):
    """A bigram target and a head that computes its logits at the next token: pairs (h_t, x_{t+1}) predict
    x_{t+2} exactly, so every draft of every depth passes. A pairing off by one would reject most."""
    loaded = models.load(str(ckpt(family, damp=0.0, noise=0.0)))
    outs, eng = decode(loaded, MtpDrafter(models.mtp_head(loaded), loaded.model), 4, max_tokens=30)
    assert eng.stats.drafted >= 20 and eng.stats.accepted == eng.stats.drafted


@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_greedy_is_lossless(ckpt, family):
    loaded = models.load(str(ckpt(family)))
    plain, _ = decode(loaded, NoDraft(), 0, max_tokens=40)
    for width in (1, 3):
        spec, eng = decode(loaded, MtpDrafter(models.mtp_head(loaded), loaded.model), width, n=2, max_tokens=40)
        assert spec[0] == plain[0] and spec[1] == plain[0]  # and -n restarts from the prompt's state
        assert 0 < eng.stats.accepted < eng.stats.drafted  # partial acceptance: both paths exercised


def test_mtp_greedy_lossless_with_a_one_token_prompt_and_a_p_min_floor(ckpt):
    loaded = models.load(str(ckpt("deepseek_v3")))
    plain, _ = decode(loaded, NoDraft(), 0, prompt="a", max_tokens=25)
    spec, eng = decode(loaded, MtpDrafter(models.mtp_head(loaded), loaded.model, p_min=0.3), 4, prompt="a",
                       max_tokens=25)
    assert spec == plain and eng.stats.cut_short > 0


@pytest.mark.parametrize("family,sp", [
    ("deepseek_v3", SamplingParams(temp=1.0)),
    ("qwen3_next", SamplingParams(temp=0.7, top_k=10)),
    ("qwen3_5", SamplingParams(temp=1.0, top_p=0.9)),
], ids=str)
@pytest.mark.slow
def test_mtp_is_exact_at_positive_temperature(ckpt, family, sp):
    loaded = models.load(str(ckpt(family)))
    ids = list(loaded.tokenizer.encode("abcabcab hello"))
    p1, p2 = target_marginals(loaded, ids, sp)
    N = 1500
    outs, eng = decode(loaded, MtpDrafter(models.mtp_head(loaded), loaded.model), 3, n=N, max_tokens=3, sampling=sp)
    arr = np.array([o[:2] for o in outs])
    assert eng.stats.accepted > 0.2 * eng.stats.drafted  # the second token is often a drafted one
    assert fit_two(arr[:, 0], arr[:, 1], p1, p2) == (True, True)


def test_a_model_without_heads_refuses_draft_mtp(ckpt, tiny):
    target, _ = tiny
    with pytest.raises(ModelError, match="carries no multi-token-prediction heads"):
        models.mtp_head(target)


def test_cli_draft_sources(ckpt, cli, tiny_paths):
    with_heads = ckpt("qwen3_5")
    r = cli("models", "inspect", str(with_heads))
    assert r.returncode == 0 and "mtp (Qwen3-Next/Qwen3.5 layout, 1 layer" in r.stdout.decode()
    assert "mtp" not in cli("models", "inspect", str(ckpt("qwen3_5", heads=False))).stdout.decode().split("sources:")[1]
    # auto drafts with the heads when the checkpoint has them, beside n-gram lookup
    import json

    r = cli("generate", "-m", str(with_heads), "--prompt", "abc", "-n", "1", "--max-tokens", "8", "--no-chat",
            "--format", "json", "-q")
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert doc["settings"]["draft"] == "auto" and doc["auto"]["sources"] == ["ngram", "mtp"]
    r = cli("generate", "-m", str(tiny_paths["target"]), "--prompt", "abc", "--max-tokens", "8", "--no-chat",
            "--format", "json", "-q")
    doc = json.loads(r.stdout)
    assert doc["settings"]["draft"] == "auto" and doc["auto"]["sources"] == ["ngram"]
    # --draft mtp on a checkpoint without heads: one line, non-zero exit
    r = cli("generate", "-m", str(tiny_paths["target"]), "--prompt", "abc", "--draft", "mtp", "--no-chat")
    err = r.stderr.decode().strip()
    assert r.returncode != 0 and r.stdout == b"" and len(err.splitlines()) == 1 and "--draft mtp" in err


def test_a_family_without_mtp_support_still_loads_a_checkpoint_that_carries_mtp_weights(tmp_path):
    """mlx-lm's llama sanitize keeps unknown weights and its load is strict: the MTP weights must be dropped."""
    import mlx.core as mx
    from tiny import make_model

    from mtpcli import models

    path = make_model(tmp_path / "llama_mtp")
    weights = dict(mx.load(str(path / "model.safetensors")))
    weights["mtp.fc.weight"] = mx.zeros((4, 4))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    loaded = models.load(str(path))
    assert loaded.mtp is not None and loaded.mtp.layout == "qwen"
    assert not models.has_mtp(loaded)  # found, but llama is not a family mtpcli drafts MTP heads for
