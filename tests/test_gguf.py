"""GGUF conversion: a tiny GGUF written with the gguf package's writer, converted, and compared."""

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from mtpcli import gguf_convert
from mtpcli.errors import ModelError

TOKENS = ["<unk>", "<eos>"] + list("abcdefghijklmnopqrstuvwxyz.,!?") + ["Ġ", "Ċ", "ab"]
NAMES = {v: k for k, v in gguf_convert.LAYER_NAMES.items()}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (its converter's `permute`: a GGUF written as llama.cpp writes one)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, weights, cfg, arch="llama", qtype=None):
    w = GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(1)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for name, arr in weights.items():
        arr = np.array(arr.astype(mx.float32))
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, *rest = name.split(".")
            gname = f"blk.{layer}.{NAMES['.'.join(rest[:-1])]}.{rest[-1]}"
            if arch == "llama" and rest[-2] == "q_proj":
                arr = permute(arr, cfg["num_attention_heads"])
            if arch == "llama" and rest[-2] == "k_proj":
                arr = permute(arr, cfg["num_key_value_heads"])
        if qtype is not None and arr.ndim == 2:
            w.add_tensor(gname, quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    from tiny import make_model

    root = tmp_path_factory.mktemp("gguf")
    folder = make_model(root / "src", vocab=TOKENS, hidden=64)
    model, cfg = load_model(folder)
    return root, model, cfg, dict(tree_flatten(model.parameters()))


@pytest.mark.parametrize("qtype,tol", [(None, 1e-4), (GGMLQuantizationType.Q8_0, 0.15)])
def test_round_trip_logits_match_source(source, qtype, tol):
    from mlx_lm.utils import load_model

    root, model, cfg, weights = source
    path = root / f"tiny-{qtype}.gguf"
    write_gguf(path, weights, cfg, qtype=qtype)
    out = gguf_convert.convert(path, root / f"out-{qtype}", quiet=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).is_file()
    converted, ccfg = load_model(out)
    assert ccfg["model_type"] == "llama" and ccfg["vocab_size"] == len(TOKENS)
    ids = mx.array([[2, 5, 9, 14, 3, 7, 20, 11]])
    a, b = model(ids), converted(ids)
    assert float(mx.abs(a - b).max()) < tol * float(mx.abs(a).max())


def test_converted_tokenizer_loads_through_mlx_lm(source):
    from mlx_lm import load

    root, _, cfg, weights = source
    path = root / "tok.gguf"
    write_gguf(path, weights, cfg)
    _, tok = load(str(gguf_convert.convert(path, root / "tok-out", quiet=True)))
    ids = tok.encode("abc ba", add_special_tokens=False)
    assert ids == [TOKENS.index(t) for t in ("ab", "c", "Ġ", "b", "a")] and tok.decode(ids) == "abc ba"
    assert tok.eos_token_id == 1 and tok.has_chat_template


def test_unsupported_architecture_refused_by_name(tmp_path):
    w = GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="'mamba' is not supported"):
        gguf_convert.convert(tmp_path / "x.gguf", tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_unpermute_inverts_permute():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(24, 5)
    assert (gguf_convert.unpermute(permute(w, 3), 3) == w).all()
    assert not (permute(w, 3) == w).all()
