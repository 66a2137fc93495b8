"""The mlx-lm internals mtpcli builds on (pyproject pins mlx-lm below its next minor version): each test names the
module of src/mtpcli that relies on what it checks, and fails when a newer mlx-lm moves it."""

import dataclasses
import importlib
import inspect

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import base, cache, llama, qwen3

import tiny


def params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_cache_classes():  # cache.py (layer_kind, snapshot and replay), layout.py (RowKV), drafters/mtp.py
    kv = cache.KVCache()
    k = mx.zeros((1, 2, 3, 4))
    kv.update_and_fetch(k, k)
    assert kv.offset == 3 and kv.keys.shape[2] >= 3 and kv.values.shape[:3] == kv.keys.shape[:3]  # (preallocated)
    assert kv.trim(1) == 1 and kv.offset == 2 and kv.is_trimmable()
    rot = cache.RotatingKVCache(max_size=8, keep=0)
    assert (rot.max_size, rot.keep) == (8, 0) and not isinstance(rot, cache.KVCache)
    arrays = cache.ArraysCache(size=2)
    assert isinstance(arrays.cache, list) and len(arrays.cache) == 2
    assert "model" in params(cache.make_prompt_cache)


def test_attention_mask():  # mtp.py, eagle.py
    assert {"h", "cache", "return_array"} <= params(base.create_attention_mask)


def test_llama_parts():  # eagle.py (Attention, MLP, ModelArgs); cache.py (split_model, tap, TreeRope)
    args = llama.ModelArgs.from_dict({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                                      "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                                      "rms_norm_eps": 1e-5, "vocab_size": 48})
    assert (args.hidden_size, args.rms_norm_eps, args.vocab_size) == (32, 1e-5, 48)
    attn = llama.Attention(args)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "rope"):
        assert isinstance(getattr(attn, name), nn.Module), name
    assert {"x", "mask", "cache"} <= params(attn.__call__) and "offset" in params(attn.rope.__call__)
    llama.MLP(args)
    assert callable(llama.Model(args).model.embed_tokens.as_linear)  # (a tied head)
    model = llama.Model(llama.ModelArgs.from_dict({**vars(args), "tie_word_embeddings": False}))
    assert isinstance(model.lm_head, nn.Linear) and len(model.layers) == 1
    layer = model.layers[0]
    assert {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"} <= set(layer)
    assert isinstance(layer.self_attn.get("rope"), nn.Module)  # (a child module, which cache.py swaps for TreeRope)
    caches = cache.make_prompt_cache(model)
    assert [type(c) for c in caches] == [cache.KVCache]
    assert model(mx.array([[1, 2, 3]]), cache=caches).shape == (1, 3, 48) and caches[0].offset == 3


def test_qwen3_block():  # dflash.py (the drafter's layers: their attention's parts, called one by one)
    args = qwen3.ModelArgs.from_dict({"model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 1,
                                      "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                                      "rms_norm_eps": 1e-5, "vocab_size": 48, "head_dim": 8, "rope_theta": 1e4,
                                      "tie_word_embeddings": True, "max_position_embeddings": 64})
    block = qwen3.TransformerBlock(args)
    at = block.self_attn
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "rope"):
        assert name in at, name
    assert (at.n_heads, at.n_kv_heads) == (4, 2) and at.scale == pytest.approx(8 ** -0.5)
    assert {"mlp", "input_layernorm", "post_attention_layernorm"} <= set(block)


@pytest.mark.parametrize("module, layer, args, fields", [
    ("deepseek_v3", "DeepseekV3DecoderLayer", "ModelArgs", {"first_k_dense_replace", "moe_layer_freq"}),
    ("qwen3_next", "Qwen3NextDecoderLayer", "ModelArgs", {"mlp_only_layers", "decoder_sparse_step",
                                                          "full_attention_interval"}),
    ("qwen3_5", "DecoderLayer", "TextModelArgs", {"num_experts", "full_attention_interval"})])
def test_mtp_layers(module, layer, args, fields):  # mtp.py (_layer_module: a layer from (args, index), args replaced)
    family = importlib.import_module(f"mlx_lm.models.{module}")
    assert len(params(getattr(family, layer).__init__)) == 3  # self, args, layer index
    assert fields <= {f.name for f in dataclasses.fields(getattr(family, args))}


def test_loaders_and_generation(tmp_path):  # models.py, distributed/sharded.py, report.py, bench.py
    from mlx_lm.generate import speculative_generate_step, stream_generate
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import MODEL_REMAPPING, load_model, load_tokenizer, sharded_load

    assert isinstance(MODEL_REMAPPING, dict)
    assert {"get_model_classes", "lazy", "strict"} <= params(load_model)
    assert "eos_token_ids" in params(load_tokenizer) and "return_config" in params(sharded_load)
    assert {"temp", "top_p", "min_p", "top_k"} <= params(make_sampler)
    assert {"draft_model", "max_tokens"} <= params(stream_generate)
    assert {"num_draft_tokens", "sampler"} <= params(speculative_generate_step)
    path = tiny.make_model(tmp_path / "m")
    model, config = load_model(path)
    tok = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    r = next(stream_generate(model, tok, mx.array([2, 3, 4]), max_tokens=1, sampler=make_sampler(temp=0.0)))
    assert {"token", "from_draft", "finish_reason", "prompt_tokens", "prompt_tps"} <= set(vars(r))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_conversion_families(family):  # gguf_convert.py (a family's Model and ModelArgs.from_dict by its name)
    module = importlib.import_module(f"mlx_lm.models.{family}")
    assert hasattr(module.ModelArgs, "from_dict") and inspect.isclass(module.Model)
