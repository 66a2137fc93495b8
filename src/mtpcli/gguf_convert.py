"""GGUF -> mlx-lm folder for llama, qwen2 and gemma3 (README.md, Models): every quant type through the `gguf` package,
llama.cpp's changes undone (the llama q/k row permutation, Gemma's 1+w norms), the tokenizer rebuilt without torch."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelError, UsageError
from .tables import status

MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "gemma3": "gemma3_text"}  # GGUF architecture -> model_type
TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
GEMMA_LAYER_NAMES = {**LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                     "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
OUTPUT_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
WRITER = "mtpcli convert"  # in model.safetensors' metadata: the mark of a folder that convert may replace
GROUP_SIZES = (32, 64, 128)  # what mx.quantize takes (affine)


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_name(gguf_name: str, arch: str) -> str | None:
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    parts = gguf_name.split(".")
    names = GEMMA_LAYER_NAMES if arch == "gemma3" else LAYER_NAMES
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
    return None  # e.g. rope_freqs: derived, not a weight


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (its converter's `permute`)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_config(reader) -> dict[str, Any]:
    arch = _field(reader, "general.architecture")
    if arch not in MODEL_TYPES:
        raise ModelError(f"GGUF architecture '{arch}' is not supported (supported: {', '.join(MODEL_TYPES)})")
    g = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    hidden, n_head = int(g("embedding_length")), int(g("attention.head_count"))
    config: dict[str, Any] = {
        "model_type": MODEL_TYPES[arch],
        "hidden_size": hidden,
        "num_hidden_layers": int(g("block_count")),
        "intermediate_size": int(g("feed_forward_length")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(g("attention.head_count_kv", n_head)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": int(embd.shape[1]),
        "max_position_embeddings": int(g("context_length", 4096)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
    }
    if key_len := g("attention.key_length"):
        config["head_dim"] = int(key_len)
    if arch == "gemma3":  # what the GGUF does not carry (../shared/models.md)
        config.update(sliding_window=int(g("attention.sliding_window", 512)), sliding_window_pattern=6,
                      rope_local_base_freq=10000.0, query_pre_attn_scalar=256)
    if eos := end_ids(reader):
        config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return config


# llama.cpp's end-of-generation tokens by name (llama-vocab.cpp): what an HF folder's generation_config.json lists
# beside config.json's eos (Qwen's <|endoftext|>, Llama 3's <|eot_id|>, Gemma's <end_of_turn>) and a GGUF does not
EOG_NAMES = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
             "<|end_of_text|>"}


def end_ids(reader) -> list[int]:
    """The token ids that end a generation: the GGUF's eos, eot and eom, and its control tokens llama.cpp ends on."""
    tokens, types = _field(reader, "tokenizer.ggml.tokens", []), _field(reader, "tokenizer.ggml.token_type", [])
    named = {i for i, (t, kind) in enumerate(zip(tokens, types)) if kind == 3 and t in EOG_NAMES}  # (3: control)
    ids = [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    return sorted({int(i) for i in ids if i is not None} | named)


def read_weights(reader, config: dict[str, Any], tensors) -> dict[str, np.ndarray]:
    from gguf.quants import dequantize

    arch, out = _field(reader, "general.architecture"), {}
    for t in tensors:
        name = hf_name(t.name, arch)
        if name is None:
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(x) for x in reversed(t.shape)])
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = unpermute(w, config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"])
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w - 1.0  # GGUF stores 1 + w; the MLX model adds the 1 itself
        out[name] = w
    return out


def build_tokenizer(reader):
    """A `tokenizers.Tokenizer` and the tokenizer_config entries, from GGUF metadata (no torch)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except ImportError:  # transformers < 5
        from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    meta = {k: _field(reader, k) for k in reader.fields if k.startswith("tokenizer.")}
    tdict = {name: meta[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
             if f"tokenizer.{key}" in meta}
    tok, _ = convert_gguf_tokenizer(_field(reader, "general.architecture"), tdict)
    tokens = tdict["tokens"]
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
                      ("pad_token", "padding_token_id")):
        idx = meta.get(f"tokenizer.ggml.{key}")
        if idx is not None and 0 <= int(idx) < len(tokens):
            cfg[name] = tokens[int(idx)]
    if (add_bos := meta.get("tokenizer.ggml.add_bos_token")) is not None:
        cfg["add_bos_token"] = bool(add_bos)
    if meta.get("tokenizer.chat_template"):
        cfg["chat_template"] = meta["tokenizer.chat_template"]
    return tok, cfg


def convert(src: str | Path, dst: str | Path, dtype: str = "float32", q_bits: int | None = None,
            q_group_size: int = 64, quiet: bool = False) -> Path:
    """Write an mlx-lm folder for the GGUF file `src` at `dst` (atomically: a temp folder beside it, then rename). An
    existing `dst` is replaced only when it is empty or an earlier conversion's output (never a user's files)."""
    import mlx.core as mx
    from gguf import GGUFReader

    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise UsageError(f"{src}: no such GGUF file")
    if dtype not in ("float32", "float16", "bfloat16"):
        raise UsageError(f"--dtype {dtype}: choose float32, float16 or bfloat16")
    if q_bits not in (None, 4, 8):
        raise UsageError(f"--q-bits {q_bits}: choose 4 or 8")
    if q_group_size not in GROUP_SIZES:  # (MLX's affine quantization: 0 is a SIGFPE inside libmlx)
        raise UsageError(f"--q-group-size {q_group_size}: choose {', '.join(map(str, GROUP_SIZES))}")
    check_output(dst)
    try:
        reader = GGUFReader(src)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"{src}: not a readable GGUF file ({e})") from None
    config = read_config(reader)
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex[:12]}.partial"  # (beside it: renamed into place; its own)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise ModelError(f"cannot write {dst}: {e.strerror or e}") from None
    try:
        weights = read_weights(reader, config, _progress(reader.tensors, f"converting {src.name}", quiet))
        with status("writing the MLX folder ...", quiet):  # (casting, tokenizer, safetensors: seconds)
            arrays = {k: mx.array(v).astype(getattr(mx, dtype)) for k, v in weights.items()}
            del weights
            tok, tok_cfg = build_tokenizer(reader)
            tok_cfg["model_max_length"] = config["max_position_embeddings"]
            if q_bits:
                arrays, config = _quantize(arrays, config, q_bits, q_group_size)
            # every file through Python's own writes: a full disk or a read-only folder is an OSError, nothing else
            (tmp / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
            (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
            if "chat_template" in tok_cfg:
                (tmp / "chat_template.jinja").write_text(tok_cfg["chat_template"], encoding="utf-8")
            with open(tmp / "model.safetensors", "wb") as f:
                mx.save_safetensors(f, arrays, metadata={"format": "mlx", "writer": WRITER})
            (tmp / "config.json").write_text(json.dumps(config, indent=1))
        old = tmp.with_name(tmp.name + ".old")  # (unique, as tmp is)
        if dst.exists():  # checked above: empty, or an earlier conversion
            dst.rename(old)
        tmp.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise ModelError(f"cannot write {dst}: {e.strerror or e}") from None
        raise
    return dst


def check_output(dst: Path) -> None:
    """Refuse an output that is not a new folder, an empty one or an earlier conversion's (its files only, its
    weights marked as written by convert): a conversion replaces it whole."""
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        raise UsageError(f"{dst}: exists and is not a folder (convert writes a new folder there)")
    if (above := next((p for p in dst.parents if p.exists()), None)) and not above.is_dir():
        raise UsageError(f"{dst}: {above} is a file, not a folder")
    try:
        names = {p.name for p in dst.iterdir()} if dst.exists() else set()
        ours = names <= OUTPUT_FILES and "model.safetensors" in names and \
            ((header(dst / "model.safetensors") or {}).get("__metadata__") or {}).get("writer") == WRITER
    except OSError as e:
        raise ModelError(f"cannot read {dst}: {e.strerror or e}") from None
    if names and not ours:
        extra = sorted(names - OUTPUT_FILES) or sorted(names)
        raise UsageError(f"{dst}: not empty, and not marked as an earlier `mtpcli convert` output (it holds "
                         f"{extra[0]!r}); give a new or empty folder")


def header(path: Path) -> dict | None:
    """A .safetensors file's JSON header, or None when it is not one."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        try:
            doc = json.loads(f.read(size)) if size <= path.stat().st_size - 8 else None
        except ValueError:  # (UnicodeDecodeError too)
            return None
    return doc if isinstance(doc, dict) else None


def _quantize(arrays, config, bits, group_size):
    """Quantize through the family's mlx-lm model (its module is named after the model_type)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    family = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = family.Model(family.ModelArgs.from_dict(config))
    model.load_weights(list(arrays.items()), strict=False)
    # (as mlx-lm's quantize_model: a layer whose rows do not split into groups stays as it is; its loader agrees)
    nn.quantize(model, group_size=group_size, bits=bits,
                class_predicate=lambda _, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group_size == 0)
    return dict(tree_flatten(model.parameters())), {**config, "quantization": {"group_size": group_size, "bits": bits}}


def _progress(items: list, label: str, quiet: bool):
    """`items`, with a transient progress bar on stderr as they are taken; none when quiet or stderr is no terminal."""
    if quiet or not sys.stderr.isatty():
        return items
    from rich.console import Console
    from rich.progress import track

    return track(items, label, transient=True, console=Console(file=sys.stderr))
