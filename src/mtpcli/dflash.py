"""DFlash block drafters (z-lab, 2026): a few Qwen3 layers that draft a whole block in ONE pass from the target's
own hidden states, sharing its embedding and LM head. The layout this reads: docs/heads.md."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import qwen3

from .cache import split_model
from .eagle import _width, check_taps, fitted, weights
from .errors import ModelError


def default_taps(target_layers: int, draft_layers: int) -> tuple[int, ...]:
    """z-lab's build_target_layer_ids."""
    if draft_layers == 1:
        return (target_layers // 2,)
    return tuple(int(round(1 + i * (target_layers - 4) / (draft_layers - 1))) for i in range(draft_layers))


class Block(nn.Module):
    """The drafter as a model that cache.LM drives to write the context's keys and values (`io.hidden`: the new
    entries' joined target states), and `block` for the one drafting pass."""

    def __init__(self, args: qwen3.ModelArgs, fc_in: int):
        super().__init__()
        H = args.hidden_size
        self.fc = nn.Linear(fc_in, H, bias=False)
        self.hidden_norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.layers = [qwen3.TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.io = SimpleNamespace(hidden=None, embed=None, lm_head=None, taps=(), block=2, mask_id=0)

    @staticmethod
    def _heads(at, x, proj, n):
        B, L, _ = x.shape
        return proj(x).reshape(B, L, n, -1).transpose(0, 2, 1, 3)

    def __call__(self, tokens: mx.array, cache=None) -> mx.array:
        ctx = self.hidden_norm(self.fc(self.io.hidden.astype(self.norm.weight.dtype)))
        for layer, c in zip(self.layers, cache):
            at = layer.self_attn
            k = at.k_norm(self._heads(at, ctx, at.k_proj, at.n_kv_heads))
            c.update_and_fetch(at.rope(k, offset=c.offset), self._heads(at, ctx, at.v_proj, at.n_kv_heads))
        return mx.zeros(tokens.shape + (1,))

    def block(self, embedded: mx.array, caches, valid: np.ndarray, pos: np.ndarray) -> mx.array:
        """(B, n, H) embeddings of [newest, mask, ...] at positions pos[b] + 0..n-1, over the cached context (slots
        `valid`) -> norm(x) (B, n, H)."""
        x = embedded.astype(self.norm.weight.dtype)
        B, n, _ = x.shape
        W = valid.shape[1]
        offset = mx.array(pos, dtype=mx.int32)
        mask = mx.array(np.concatenate([valid, np.ones((B, n), bool)], axis=1))[:, None, None, :]
        for layer, c in zip(self.layers, caches):
            at = layer.self_attn
            h = layer.input_layernorm(x)
            q = at.q_norm(at.q_proj(h).reshape(B, n, at.n_heads, -1)).transpose(0, 2, 1, 3)
            k = at.k_norm(at.k_proj(h).reshape(B, n, at.n_kv_heads, -1)).transpose(0, 2, 1, 3)
            v = self._heads(at, h, at.v_proj, at.n_kv_heads)
            q, k = at.rope(q, offset=offset), at.rope(k, offset=offset)
            if W and c.keys is not None:
                k = mx.concatenate([c.keys[..., :W, :], k], axis=2)
                v = mx.concatenate([c.values[..., :W, :], v], axis=2)
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=at.scale, mask=mask if W else None)
            x = x + at.o_proj(o.transpose(0, 2, 1, 3).reshape(B, n, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def load(folder: Path | str, target_model, target_vocab: int) -> Block:
    """Build the DFlash drafter in `folder` over `target_model`, refused (one line) when made for another target."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    where = f"DFlash drafter {folder}"
    w = weights(folder, where)
    if "fc.weight" not in w or "hidden_norm.weight" not in w:
        raise ModelError(f"{where}: not a DFlash drafter (no fc / hidden_norm weights)")
    if "sliding_attention" in (config.get("layer_types") or []):
        raise ModelError(f"{where}: sliding-window drafter layers are not supported yet")
    extra = config.get("dflash_config") or {}
    field = lambda k: config.get(k) if extra.get(k) is None else extra[k]  # noqa: E731  (exports use either place)
    layers, n = target_model.layers, config.get("num_hidden_layers", 1)
    taps = tuple(field("target_layer_ids") or default_taps(len(layers), n))
    width, (H, fc_in) = _width(target_model), w["fc.weight"].shape
    if fc_in != len(taps) * width or H != width:
        raise ModelError(f"{where} is made for another target: it reads {fc_in} values per position and is {H} wide; "
                         f"{len(taps)} layers of this target give {len(taps)} x {width}")
    check_taps(taps, len(layers), where)
    mask_id, block = field("mask_token_id"), field("block_size")
    if not isinstance(mask_id, int) or not 0 <= mask_id < target_vocab or not isinstance(block, int) or block < 2:
        raise ModelError(f"{where}: needs block_size >= 2 and a mask_token_id below the target's {target_vocab} tokens")
    parts = split_model(target_model)
    if parts is None:
        raise ModelError(f"{where}: the target's embedding and LM head are not reachable")
    try:
        args = qwen3.ModelArgs.from_dict({"model_type": "qwen3", "vocab_size": target_vocab, **config})
        model = Block(args, fc_in)
    except (TypeError, ValueError) as e:
        raise ModelError(f"{where} does not match its config.json: {e}") from None
    fitted(model, w, where)
    model.io.embed, model.io.lm_head = parts[0].embed_tokens, parts[1]
    model.io.taps, model.io.block, model.io.mask_id = taps, block, mask_id
    return model
