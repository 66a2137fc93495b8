"""Tiny random models in the Hugging Face folder layout, for tests and CI-free benchmarks.

A character-level tokenizer (48 tokens) and a 2-layer llama; `noisy_copy` makes a draft that is
the target plus noise, so acceptance is partial.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,:()\n=+")
SPECIAL = ["<unk>", "<eos>"]
VOCAB = SPECIAL + CHARS  # 48 tokens
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def write_tokenizer(path: Path, chat_template: bool = False, vocab: list[str] = VOCAB) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "unk_token": "<unk>",
           "model_max_length": 256}
    if chat_template:
        cfg["chat_template"] = CHAT_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


def make_model(path: str | Path, seed: int = 0, layers: int = 2, hidden: int = 32, logit_scale: float = 4.0,
               chat_template: bool = False, max_positions: int = 256, vocab: list[str] = VOCAB, **extra) -> Path:
    """Write a random llama with the tiny tokenizer to `path` (`extra`: more config keys, model_type="qwen2" for
    another family of the same shape); returns the path."""
    import importlib

    config = {
        "model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
        "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "vocab_size": len(vocab), "tie_word_embeddings": False,
        "max_position_embeddings": max_positions, "rope_theta": 10000.0, "eos_token_id": 1, **extra,
    }
    family = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    return _random(family, config, path, seed, logit_scale, chat_template, vocab)


def _random(family, config: dict, path: str | Path, seed: int, logit_scale: float, chat_template: bool = False,
            vocab: list[str] = VOCAB) -> Path:
    """A random model of FAMILY (an mlx_lm.models module) and CONFIG written to PATH with the tiny tokenizer, its
    LM head scaled by LOGIT_SCALE (sharper or flatter distributions)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    model = family.Model(family.ModelArgs.from_dict(config))
    if "lm_head" in model:  # (gemma2 ties its head to the embedding)
        model.lm_head.weight = model.lm_head.weight * logit_scale
    _save(model, config, path)
    write_tokenizer(path, chat_template, vocab)
    return path


def noisy_copy(src: str | Path, dst: str | Path, noise: float = 0.1, seed: int = 1) -> Path:
    """A draft model: the model at `src` with gaussian noise (relative scale `noise`) on every weight."""
    from mlx_lm.utils import load_model

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    model, config = load_model(src)
    mx.random.seed(seed)
    model.update(tree_map(lambda w: w + noise * w.std() * mx.random.normal(w.shape), model.parameters()))
    _save(model, config, dst)
    _copy_tokenizer(src, dst)
    return dst


def quarter_pair(root: str | Path, hidden: int = 32, layers: int = 8) -> tuple[Path, Path]:
    """A target whose layers past the first quarter add little to the residual stream, and a draft model of that
    first quarter, perturbed a little: a draft a quarter of the target's size that agrees with it most of the time."""
    root = Path(root)
    target = make_model(root / "target", hidden=hidden, layers=layers, max_positions=4096)
    config = json.loads((target / "config.json").read_text())
    weights, first = mx.load(str(target / "model.safetensors")), layers // 4
    depth = lambda k: int(k.split(".")[2]) if k.startswith("model.layers.") else -1  # noqa: E731
    weights = {k: v * 0.1 if depth(k) >= first and k.endswith(("o_proj.weight", "down_proj.weight")) else v
               for k, v in weights.items()}
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    mx.random.seed(1)
    draft = root / "draft"
    draft.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(draft / "model.safetensors"), {k: v + 0.05 * v.std() * mx.random.normal(v.shape)
                                                           for k, v in weights.items() if depth(k) < first})
    (draft / "config.json").write_text(json.dumps({**config, "num_hidden_layers": first}))
    _copy_tokenizer(target, draft)
    return target, draft


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())


def _save(model, config: dict, path: Path) -> None:
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config, indent=1))


def make_windowed_model(path: str | Path) -> Path:
    """A tiny llama whose first layer attends over a sliding window of 16 (masked, not trimmed, on rollback)."""
    return make_model(path, layers=2, sliding_window=16, layer_types=["sliding_attention", "full_attention"])


def make_target(kind: str, root: Path) -> Path:
    """A tiny target of a cache kind that rolls back unlike plain attention: "sliding-window" or "hybrid"."""
    return make_windowed_model(root / "m") if kind == "sliding-window" else make_hybrid_model(root / "h", seed=3)


QWEN3_NEXT = {  # a tiny Qwen3-Next: the hybrid target's, and the MTP checkpoint's below
    "model_type": "qwen3_next", "hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "linear_num_value_heads": 2,
    "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "shared_expert_intermediate_size": 32,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "full_attention_interval": 2,
}


def make_hybrid_model(path: str | Path, seed: int = 0, logit_scale: float = 4.0) -> Path:
    """A tiny Qwen3-Next-style hybrid: gated-delta (recurrent) layers between attention layers."""
    from mlx_lm.models import qwen3_next

    config = {**QWEN3_NEXT, "mlp_only_layers": [0, 1, 2, 3], "moe_intermediate_size": 32, "vocab_size": len(VOCAB),
              "max_position_embeddings": 256, "tie_word_embeddings": False, "eos_token_id": 1}
    return _random(qwen3_next, config, path, seed, logit_scale)


# --- checkpoints with native MTP heads, in the Hugging Face layout of each family ---------------------------

MTP_CONFIGS = {
    "deepseek_v3": {
        "model_type": "deepseek_v3", "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 8, "qk_nope_head_dim": 8, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    },
    "qwen3_next": {**QWEN3_NEXT, "mlp_only_layers": [], "moe_intermediate_size": 16, "num_nextn_predict_layers": 1},
    "qwen3_5": {
        "model_type": "qwen3_5", "hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "linear_num_value_heads": 2,
        "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "full_attention_interval": 2,
        "mtp_num_hidden_layers": 1, "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                                         "type": "default"},
    },
}
ZERO_CENTRED = ("qwen3_next", "qwen3_5")
OUTPUT_PROJ = ("o_proj.weight", "down_proj.weight", "out_proj.weight")


def _hf_layer(family: str, params: dict, config: dict) -> dict:
    """One decoder layer's mlx-lm parameters under their Hugging Face checkpoint names (mlx-lm's sanitize undone)."""
    out = {}
    for k, v in params.items():
        if ".switch_mlp." in k:
            for e in range(v.shape[0]):
                out[k.replace(".switch_mlp.", f".experts.{e}.")] = v[e]
        elif k.endswith("self_attn.embed_q.weight"):
            wv = params[k.replace("embed_q", "unembed_out")]
            kv_b = mx.concatenate([v.swapaxes(-1, -2), wv], axis=1)
            out[k.replace("embed_q", "kv_b_proj")] = kv_b.reshape(-1, kv_b.shape[-1])
        elif k.endswith("self_attn.unembed_out.weight"):
            continue
        elif "conv1d.weight" in k:
            out[k] = v.moveaxis(2, 1)
        elif family in ZERO_CENTRED and v.ndim == 1 and any(("." + k).endswith(s) for s in
                                                            (".input_layernorm.weight", ".post_attention_layernorm.weight",
                                                             ".q_norm.weight", ".k_norm.weight")):
            out[k] = v - 1.0
        else:
            out[k] = v
    return out


def make_mtp_model(path: str | Path, family: str, heads: bool = True, seed: int = 0, damp: float = 0.3,
                   noise: float = 0.1, logit_scale: float = 4.0) -> Path:
    """A tiny random `family` checkpoint in the Hugging Face layout, with (or without) an MTP head.

    The target's output projections are damped so it behaves nearly like a bigram model, and the head is
    an "oracle with noise": it projects only the next token's embedding through its (near-identity) layer
    and the shared LM head, so it predicts the token after next well and drafts get partly accepted."""
    import importlib

    from mlx.utils import tree_flatten

    from mtpcli import mtp

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {**MTP_CONFIGS[family], "vocab_size": len(VOCAB), "max_position_embeddings": 256,
              "tie_word_embeddings": False, "eos_token_id": 1}
    mx.random.seed(seed)
    mod = importlib.import_module(f"mlx_lm.models.{family}")
    model = mod.Model(mod.ModelArgs.from_dict(config))
    flat = dict(tree_flatten(model.parameters()))
    for k, v in flat.items():
        if k.endswith("lm_head.weight"):
            flat[k] = v * logit_scale
        elif k.endswith(OUTPUT_PROJ):
            flat[k] = v * damp
    model.load_weights(list(flat.items()))
    if family == "qwen3_5":  # mlx names -> the checkpoint's (model.language_model.*, lm_head.weight)
        flat = {k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head", "lm_head"): v
                for k, v in flat.items()}
    weights = _hf_layer(family, flat, config)
    if family in ZERO_CENTRED:
        norm = "model.language_model.norm.weight" if family == "qwen3_5" else "model.norm.weight"
        weights[norm] = weights[norm] - 1.0
    if heads:
        layer, _ = mtp._layer_module(model, moe=family != "qwen3_5")
        hidden = config["hidden_size"]
        head = mtp.MtpHead("deepseek" if family == "deepseek_v3" else "qwen", hidden, 1e-6, layer, None)
        hp = dict(tree_flatten(head.parameters()))
        eye = mx.concatenate([mx.eye(hidden), mx.zeros((hidden, hidden))], axis=1)
        hp["proj.weight"] = eye + noise * mx.random.normal(eye.shape) / hidden**0.5
        hp = {k: v * noise if k.endswith(OUTPUT_PROJ) else v for k, v in hp.items()}
        layer_hf = _hf_layer(family, {k[len("layer."):]: v for k, v in hp.items() if k.startswith("layer.")}, config)
        names = {v: k for k, v in mtp.NAMES["deepseek" if family == "deepseek_v3" else "qwen"].items()}
        own = {names[k]: (v - 1.0 if family in ZERO_CENTRED and k.startswith("norm") else v)
               for k, v in hp.items() if k in names}
        if family == "deepseek_v3":
            n = config["num_hidden_layers"]
            lm = flat["lm_head.weight"]
            own.update({"shared_head.head.weight": lm, "embed_tokens.weight": flat["model.embed_tokens.weight"]})
            weights.update({f"model.layers.{n}.{k}": v for k, v in {**own, **layer_hf}.items()})
        else:
            weights.update({f"mtp.{k}": v for k, v in own.items()})
            weights.update({f"mtp.layers.0.{k}": v for k, v in layer_hf.items()})
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    write_tokenizer(path)
    return path


def make_eagle3_head(path: str | Path, target: str | Path, seed: int = 0, draft_vocab: int | None = None,
                     taps: list[int] | None = None, scale: float = 1.0, prefix: str = "midlayer.",
                     own_embed: bool = False) -> Path:
    """A random EAGLE-3 head for the tiny target at `target`, in the published layout (SafeAILab/EAGLE, SpecForge:
    fc, midlayer.* with 2H-wide q/k/v, norm, lm_head over `draft_vocab` tokens with d2t; `prefix` "layers.0." for
    the Speculators export); `taps`: eagle_config's layer ids (None: the default). `scale` sharpens its logits."""
    path, tc = Path(path), json.loads((Path(target) / "config.json").read_text())
    path.mkdir(parents=True, exist_ok=True)
    H, V = tc["hidden_size"], tc["vocab_size"]
    Vd = draft_vocab or V
    heads, kv, inter = tc["num_attention_heads"], tc["num_key_value_heads"], tc["intermediate_size"]
    hd = H // heads
    mx.random.seed(seed)
    r = lambda *s: mx.random.normal(s) * (1.0 / s[-1] ** 0.5)  # noqa: E731
    m = prefix
    w = {"fc.weight": r(H, 3 * H), f"{m}input_layernorm.weight": mx.ones(H), f"{m}hidden_norm.weight": mx.ones(H),
         f"{m}post_attention_layernorm.weight": mx.ones(H), f"{m}self_attn.q_proj.weight": r(heads * hd, 2 * H),
         f"{m}self_attn.k_proj.weight": r(kv * hd, 2 * H), f"{m}self_attn.v_proj.weight": r(kv * hd, 2 * H),
         f"{m}self_attn.o_proj.weight": r(H, heads * hd), f"{m}mlp.gate_proj.weight": r(inter, H),
         f"{m}mlp.up_proj.weight": r(inter, H), f"{m}mlp.down_proj.weight": r(H, inter), "norm.weight": mx.ones(H),
         "lm_head.weight": r(Vd, H) * scale}
    if Vd != V:  # the most "frequent" tokens: here every other id from 2 on, then the rest in order
        used = sorted(list(range(2, V, 2)) + list(range(3, V, 2)))[:Vd]
        w["d2t"] = mx.array([u - i for i, u in enumerate(sorted(used))], dtype=mx.int64)
        w["t2d"] = mx.array([i in used for i in range(V)])
    if own_embed:
        w["embed_tokens.weight"] = r(V, H)
    mx.save_safetensors(str(path / "model.safetensors"), w)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
              "num_hidden_layers": 1, "intermediate_size": inter, "num_attention_heads": heads,
              "num_key_value_heads": kv, "rms_norm_eps": 1e-5, "vocab_size": V, "draft_vocab_size": Vd,
              "max_position_embeddings": tc["max_position_embeddings"], "rope_theta": 10000.0,
              "tie_word_embeddings": False}
    if taps is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": taps, "use_aux_hidden_state": True}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def make_dflash_drafter(path: str | Path, target: str | Path, seed: int = 0, block: int = 4, layers: int = 2,
                        taps: list[int] | None = None, mask_id: int = 2, damp: float = 0.1) -> Path:
    """A random DFlash drafter for the tiny target at `target`, in z-lab's layout (config block_size and
    dflash_config; weights fc, hidden_norm, norm, layers.N.* of a Qwen3 layer, no embedding or LM head: the
    target's). `damp` scales the layers' output projections: small, the block's slots stay near their embeddings."""
    path, tc = Path(path), json.loads((Path(target) / "config.json").read_text())
    path.mkdir(parents=True, exist_ok=True)
    H, heads, kv, inter = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"], tc["intermediate_size"]
    hd = H // heads
    taps = taps if taps is not None else [0, tc["num_hidden_layers"] - 1]
    mx.random.seed(seed)
    r = lambda *s: mx.random.normal(s) * (1.0 / s[-1] ** 0.5)  # noqa: E731
    w = {"fc.weight": r(H, len(taps) * H), "hidden_norm.weight": mx.ones(H), "norm.weight": mx.ones(H)}
    for i in range(layers):
        p = f"layers.{i}."
        w |= {p + "input_layernorm.weight": mx.ones(H), p + "post_attention_layernorm.weight": mx.ones(H),
              p + "self_attn.q_proj.weight": r(heads * hd, H), p + "self_attn.k_proj.weight": r(kv * hd, H),
              p + "self_attn.v_proj.weight": r(kv * hd, H), p + "self_attn.o_proj.weight": damp * r(H, heads * hd),
              p + "self_attn.q_norm.weight": mx.ones(hd), p + "self_attn.k_norm.weight": mx.ones(hd),
              p + "mlp.gate_proj.weight": r(inter, H), p + "mlp.up_proj.weight": r(inter, H),
              p + "mlp.down_proj.weight": damp * r(H, inter)}
    mx.save_safetensors(str(path / "model.safetensors"), w)
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block,
              "hidden_size": H, "num_hidden_layers": layers, "intermediate_size": inter, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": hd, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": tc["max_position_embeddings"], "vocab_size": tc["vocab_size"],
              "num_target_layers": tc["num_hidden_layers"], "tie_word_embeddings": False,
              "layer_types": ["full_attention"] * layers,
              "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": taps}}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path
