"""EAGLE-3 draft heads (Li et al., 2025): one decoder layer over the target's own hidden states, built beside it.
The published layout this reads: docs/heads.md."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask

from .cache import split_model
from .errors import ModelError


def kind(folder: Path | str) -> str | None:
    """'eagle3' or 'dflash' for a folder holding such a draft head (from its config.json), else None."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    names = " ".join(map(str, config.get("architectures") or [])).lower() if isinstance(config, dict) else ""
    if "dflash" in names or (isinstance(config, dict) and "dflash_config" in config):
        return "dflash"
    if "eagle3" in names or (isinstance(config, dict) and ("draft_vocab_size" in config or "eagle_config" in config)):
        return "eagle3"
    return None


def default_taps(layers: int) -> tuple[int, ...]:
    """The target layers whose outputs an EAGLE-3 head reads when its config does not say (EAGLE's and SpecForge's)."""
    return (1, layers // 2 - 1, layers - 4)


class Layer(nn.Module):
    """The head's decoder layer: attention over [embedding, hidden] (2H) with its own KV cache, then an MLP."""

    def __init__(self, args: llama.ModelArgs, norm_before_residual: bool):
        super().__init__()
        H, eps = args.hidden_size, args.rms_norm_eps
        self.input_layernorm, self.hidden_norm = nn.RMSNorm(H, eps=eps), nn.RMSNorm(H, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(H, eps=eps)
        self.self_attn = attn = llama.Attention(args)
        for name in ("q_proj", "k_proj", "v_proj"):  # (their input is the 2H concatenation)
            setattr(attn, name, nn.Linear(2 * H, getattr(attn, name).weight.shape[0], bias=False))
        self.mlp = llama.MLP(args)
        self.norm_before_residual = norm_before_residual

    def __call__(self, embedded: mx.array, hidden: mx.array, cache) -> mx.array:
        normed = self.hidden_norm(hidden)
        x = mx.concatenate([self.input_layernorm(embedded), normed], axis=-1)
        h = (normed if self.norm_before_residual else hidden) + self.self_attn(
            x, create_attention_mask(x, cache, return_array=True), cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Head(nn.Module):
    """An EAGLE-3 head as a one-layer model that cache.LM drives: `feed` names what goes with the next tokens (the
    target's tapped states, fused by fc, or the head's own last output) and `out` keeps the layer's output; it
    returns the last position's logits over the TARGET's vocabulary (-inf where the reduced vocabulary has none)."""

    def __init__(self, args: llama.ModelArgs, fc_in: int, draft_vocab: int, own_embed: bool, norm_before_residual: bool):
        super().__init__()
        H = args.hidden_size
        self.fc = nn.Linear(fc_in, H, bias=False)
        self.layers = [Layer(args, norm_before_residual)]
        self.norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.lm_head = nn.Linear(H, draft_vocab, bias=False)
        if own_embed:
            self.embed_tokens = nn.Embedding(args.vocab_size, H)
        self.io = SimpleNamespace(hidden=None, fuse=True, out=None, embed=None, to_target=None, taps=())

    def __call__(self, tokens: mx.array, cache=None) -> mx.array:
        io = self.io
        h = self.fc(io.hidden) if io.fuse else io.hidden
        embed = self.embed_tokens if "embed_tokens" in self else io.embed
        io.out = self.layers[0](embed(tokens), h.astype(self.norm.weight.dtype), cache[0] if cache else None)
        logits = self.lm_head(self.norm(io.out[:, -1:]))
        if io.to_target is None:
            return logits
        padded = mx.concatenate([logits, mx.full(logits.shape[:-1] + (1,), float("-inf"), logits.dtype)], axis=-1)
        return mx.take(padded, io.to_target, axis=-1)


def weights(folder: Path, where: str) -> dict[str, mx.array]:
    """A head's safetensors weights, by the names its model here gives them (`midlayer.` is `layers.0.`)."""
    files = sorted(glob.glob(str(folder / "*.safetensors")))
    if not files:
        bins = sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))
        raise ModelError(f"{where}: no .safetensors weights" + (f" ({bins[0].name} is a PyTorch pickle: "
                         "convert it to safetensors)" if bins else ""))
    raw = {k.removeprefix("model."): v for f in files for k, v in mx.load(f).items()}
    return {k.replace("midlayer.", "layers.0.", 1) if k.startswith("midlayer.") else k: v for k, v in raw.items()}


def flat(config: dict) -> dict:
    """A head's config.json in one level: the Speculators export nests the layer's fields, and its ids are those of
    the layers whose INPUT is read. (Its norm_before_residual, always written, defaults to False as there.)"""
    if not isinstance(config.get("transformer_layer_config"), dict):
        return config
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    config = {**config, **config["transformer_layer_config"]}
    if ids:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids]}
    return config


def load(folder: Path | str, target_model, target_vocab: int) -> Head:
    """Build the EAGLE-3 head in `folder` over `target_model`, refused (one line) when it was made for another
    target: the width or number of the states it reads, the vocabulary it maps to, the layers it taps."""
    folder = Path(folder)
    config = flat(json.loads((folder / "config.json").read_text()))
    where = f"draft head {folder}"
    w = weights(folder, where)
    for name in ("fc.weight", "lm_head.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"):
        if name not in w:
            raise ModelError(f"{where}: not an EAGLE-3 head (no '{name}' weight)")
    layers = target_model.layers
    taps = tuple((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or default_taps(len(layers)))
    target_hidden = _width(target_model)
    H, fc_in = w["fc.weight"].shape
    if fc_in != len(taps) * target_hidden:
        raise ModelError(f"{where} is made for another target: its fc reads {fc_in} values per position, "
                         f"{len(taps)} layers of this target give {len(taps)} x {target_hidden}")
    check_taps(taps, len(layers), where)
    vocab = config.get("vocab_size", target_vocab)
    if vocab != target_vocab:
        raise ModelError(f"{where} is made for another target: its vocabulary has {vocab} tokens, the target's "
                         f"{target_vocab}")
    draft_vocab = w["lm_head.weight"].shape[0]
    to_target = None
    if "d2t" in w or draft_vocab != target_vocab:
        d2t = w.get("d2t")
        if d2t is None or d2t.shape != (draft_vocab,):
            raise ModelError(f"{where}: a reduced vocabulary of {draft_vocab} tokens needs d2t of that length")
        ids = mx.arange(draft_vocab) + d2t.astype(mx.int32)
        if int(ids.min()) < 0 or int(ids.max()) >= target_vocab or len(set(ids.tolist())) != draft_vocab:
            raise ModelError(f"{where}: its d2t maps draft tokens outside the target's {target_vocab} or onto one id twice")
        where_in = mx.full((target_vocab,), draft_vocab, mx.int32)  # target id -> draft id, draft_vocab: none
        where_in[ids] = mx.arange(draft_vocab, dtype=mx.int32)
        to_target = where_in
    own_embed = "embed_tokens.weight" in w
    if not own_embed and split_model(target_model) is None:
        raise ModelError(f"{where} has no embedding of its own, and the target's is not reachable")
    if not own_embed and target_hidden != H:
        raise ModelError(f"{where} is {H} wide without its own embedding; the target's embedding is {target_hidden} wide")
    try:
        args = llama.ModelArgs.from_dict({"model_type": "llama", "num_hidden_layers": 1, **config, "vocab_size": vocab,
                                          "hidden_size": H})
    except TypeError as e:
        raise ModelError(f"{where}: its config.json lacks a layer field ({e})") from None
    head = Head(args, fc_in, draft_vocab, own_embed, bool(config.get("norm_before_residual", False)))
    fitted(head, {k: v for k, v in w.items() if k not in ("d2t", "t2d")}, where)
    head.io.embed = None if own_embed else split_model(target_model)[0].embed_tokens
    head.io.to_target, head.io.taps = to_target, taps
    return head


def check_taps(taps, layers: int, where: str) -> None:
    if any(not 0 <= i < layers for i in taps):
        raise ModelError(f"{where} reads target layers {list(taps)}; this target has {layers} layers")


def fitted(model, w: dict, where: str) -> None:
    """A head's weights W loaded (strict: a mismatch is one line), float32 on a CPU (half is slow there), evaluated."""
    try:
        model.load_weights(list(w.items()), strict=True)
    except ValueError as e:
        raise ModelError(f"{where} does not match its config.json: {e}") from None
    if mx.default_device() == mx.cpu:
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    model.eval()


def _width(model) -> int:
    """The target's hidden size (the width of a layer's output)."""
    args = getattr(getattr(model, "language_model", model), "args", None)
    size = getattr(args, "hidden_size", None)
    if not isinstance(size, int):
        raise ModelError("the target's hidden size is not known: an EAGLE-3 head cannot be built over it")
    return size
