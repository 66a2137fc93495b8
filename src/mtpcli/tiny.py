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
               chat_template: bool = False, max_positions: int = 256, vocab: list[str] = VOCAB) -> Path:
    """Write a random llama with the tiny tokenizer to `path`; returns the path."""
    from mlx_lm.models import llama

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
        "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "vocab_size": len(vocab), "tie_word_embeddings": False,
        "max_position_embeddings": max_positions, "rope_theta": 10000.0, "eos_token_id": 1,
    }
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
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
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def _save(model, config: dict, path: Path) -> None:
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config, indent=1))


def make_hybrid_model(path: str | Path, seed: int = 0, logit_scale: float = 4.0) -> Path:
    """A tiny Qwen3-Next-style hybrid: gated-delta (recurrent) layers between attention layers."""
    from mlx_lm.models import qwen3_next

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "qwen3_next", "hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "linear_num_value_heads": 2,
        "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 32, "mlp_only_layers": [0, 1, 2, 3], "moe_intermediate_size": 32,
        "rms_norm_eps": 1e-6, "vocab_size": len(VOCAB), "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "max_position_embeddings": 256, "full_attention_interval": 2, "tie_word_embeddings": False,
        "eos_token_id": 1,
    }
    mx.random.seed(seed)
    model = qwen3_next.Model(qwen3_next.ModelArgs.from_dict(config))
    model.lm_head.weight = model.lm_head.weight * logit_scale
    _save(model, config, path)
    write_tokenizer(path)
    return path
