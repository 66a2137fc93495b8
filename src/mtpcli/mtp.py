"""Native multi-token-prediction (MTP) heads: find them in a checkpoint, build them beside the mlx-lm model. The two
layouts (DeepSeek-V3's extra layer, Qwen3-Next / Qwen3.5's `mtp.*`; NAMES maps their keys) and what a head computes:
docs/guide.md, `--draft mtp`. `strip_sanitize` makes mlx-lm's loader drop these weights (strict loads)."""

from __future__ import annotations

import glob
import importlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from safetensors import safe_open

from .cache import split_model
from .errors import ModelError

SUPPORTED = ("deepseek_v3", "qwen3_next", "qwen3_5", "qwen3_5_moe")
LAYER_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")


@dataclass(frozen=True)
class MtpSpec:
    layout: str  # "deepseek" | "qwen" | "mimo" (found, not supported)
    prefix: str  # the checkpoint's key prefix of the head, e.g. "mtp." or "model.layers.61."
    layers: int  # MTP depths in the checkpoint (mtpcli uses the first, recursively)
    keys: tuple[str, ...]

    def owns(self, key: str) -> bool:
        if self.layout == "deepseek":  # model.layers.N., N+1, ... for several depths
            m = re.match(r"(.*layers\.)(\d+)\.", key)
            first = int(self.prefix.rstrip(".").rsplit(".", 1)[1])
            return bool(m) and m.group(1) == self.prefix[: len(m.group(1))] and int(m.group(2)) >= first
        return key.startswith(self.prefix)

    def describe(self) -> str:
        name = {"deepseek": "DeepSeek-V3 layout", "qwen": "Qwen3-Next/Qwen3.5 layout", "mimo": "MiMo layout"}
        return f"{name[self.layout]}, {self.layers} layer{'s' * (self.layers != 1)}, keys '{self.prefix}*'"


def weight_keys(folder: Path | str) -> list[str]:
    """Tensor names of a safetensors checkpoint, read from the file headers (no tensor is loaded)."""
    keys = []
    for f in sorted(glob.glob(str(Path(folder) / "model*.safetensors"))):
        with safe_open(f, framework="numpy") as fh:
            keys += list(fh.keys())
    return keys


def text_config(config: dict) -> dict:
    return config.get("text_config") or config


def supported(spec: MtpSpec | None, config: dict) -> bool:  # whether mtpcli can build the head `spec`
    return spec is not None and spec.layout != "mimo" and text_config(config).get("model_type") in SUPPORTED


def find(folder: Path | str, config: dict) -> MtpSpec | None:
    keys = weight_keys(folder)
    qwen = sorted({m.group(1) for k in keys if (m := re.match(r"^(.*?\bmtp\.)(fc|layers|norm|pre_fc)", k))})
    if qwen:
        own = tuple(k for k in keys if k.startswith(qwen[0]))
        depths = {k.split("layers.")[1].split(".")[0] for k in own if ".layers." in k}
        return MtpSpec("qwen", qwen[0], max(len(depths), 1), own)
    n = text_config(config).get("num_hidden_layers")
    if isinstance(n, int):
        heads = sorted({m.group(1) for k in keys if (m := re.match(rf"^(.*\blayers\.{n}\.)eh_proj\.", k))})
        if heads:
            spec = MtpSpec("deepseek", heads[0], 1, ())
            own = tuple(filter(spec.owns, keys))
            return replace(spec, layers=len({re.match(r".*layers\.(\d+)\.", k).group(1) for k in own}), keys=own)
    mimo = tuple(k for k in keys if ".mtp_layers." in k or k.startswith("mtp_layers."))
    if mimo:
        return MtpSpec("mimo", mimo[0].split("mtp_layers.")[0] + "mtp_layers.", 1, mimo)
    return None


def strip_sanitize(model_class: type, spec: MtpSpec) -> type:
    """A subclass of an mlx-lm model class whose sanitize drops the MTP weights first."""

    class Stripped(model_class):
        def sanitize(self, weights):
            weights = {k: v for k, v in weights.items() if not spec.owns(k)}
            return super().sanitize(weights) if hasattr(super(), "sanitize") else weights

    Stripped.__name__ = Stripped.__qualname__ = model_class.__name__
    Stripped.__module__ = model_class.__module__
    return Stripped


class MtpHead(nn.Module):
    def __init__(self, layout: str, hidden: int, eps: float, layer: nn.Module, own_head: int | None):
        super().__init__()
        self.layout = layout
        self.norm_e = nn.RMSNorm(hidden, eps=eps)
        self.norm_h = nn.RMSNorm(hidden, eps=eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = layer
        self.norm = nn.RMSNorm(hidden, eps=eps)
        if own_head:
            self.head = nn.Linear(hidden, own_head, bias=False)

    def __call__(self, hidden: mx.array, tokens: mx.array, embed, lm_head, cache) -> tuple[mx.array, mx.array]:
        """hidden (1, n, H) paired with tokens (1, n) -> (hidden fed to the next depth, logits (1, n, V))."""
        x = self.proj(mx.concatenate([self.norm_e(embed(tokens)), self.norm_h(hidden)], axis=-1))
        x = self.layer(x, create_attention_mask(x, cache, return_array=True), cache)
        out = self.norm(x)
        logits = self.head(out) if "head" in self else lm_head(out)
        return (x if self.layout == "deepseek" else out), logits


# checkpoint name (after the prefix) -> MtpHead parameter name, per layout
NAMES = {
    "deepseek": {"enorm.weight": "norm_e.weight", "hnorm.weight": "norm_h.weight", "eh_proj.weight": "proj.weight",
                 "shared_head.norm.weight": "norm.weight", "shared_head.head.weight": "head.weight"},
    "qwen": {"pre_fc_norm_embedding.weight": "norm_e.weight", "pre_fc_norm_hidden.weight": "norm_h.weight",
             "fc.weight": "proj.weight", "norm.weight": "norm.weight"},
}


def _layer_module(model, moe: bool) -> tuple[nn.Module, int]:
    """A full-attention decoder layer of the target's family (and the main-model index it is sanitized as)."""
    args = getattr(model, "language_model", model).args
    family = args.model_type
    if family == "deepseek_v3":
        a = replace(args, first_k_dense_replace=0 if moe else 1 << 30, moe_layer_freq=1)
        return importlib.import_module("mlx_lm.models.deepseek_v3").DeepseekV3DecoderLayer(a, 0), 0
    i = args.full_attention_interval - 1  # a full-attention index of the main model
    if family == "qwen3_next":
        a = replace(args, mlp_only_layers=[] if moe else [i], decoder_sparse_step=1)
        return importlib.import_module("mlx_lm.models.qwen3_next").Qwen3NextDecoderLayer(a, i), i
    a = args if moe or args.num_experts == 0 else replace(args, num_experts=0)
    return importlib.import_module("mlx_lm.models.qwen3_5").DecoderLayer(a, i), i


def load(model, folder: Path | str, config: dict, spec: MtpSpec) -> MtpHead:
    """Build the checkpoint's first MTP depth beside the loaded target `model`."""
    family = text_config(config).get("model_type", config.get("model_type"))
    if spec.layout == "mimo" or family not in SUPPORTED:
        raise ModelError(f"MTP heads of this checkpoint ({spec.describe()}, model type '{family}') are not supported; "
                         f"supported: DeepSeek-V3 and Qwen3-Next/Qwen3.5 layouts ({', '.join(SUPPORTED)})")
    prefix = next((m.group(1) for k in weight_keys(folder) if (m := re.match(r"^(.*\blayers\.)\d+\.", k))
                   and not spec.owns(k) and "visual" not in k), None)  # model.layers., model.language_model.layers.
    if prefix is None:
        raise ModelError("cannot find the main model's layers in the checkpoint")
    final_norm = prefix[: -len("layers.")] + "norm.weight"
    raw = {k: v for f in sorted(glob.glob(str(Path(folder) / "model*.safetensors")))
           for k, v in mx.load(f).items() if spec.owns(k) or k == final_norm}
    first = spec.prefix if spec.layout == "deepseek" else spec.prefix + "layers.0."
    own = {k[len(spec.prefix):]: v for k, v in raw.items() if k.startswith(spec.prefix) and not k.startswith(first)}
    layer_raw = {k[len(first):]: v for k, v in raw.items() if k.startswith(first)}
    if spec.layout == "deepseek":  # the head's own tensors share the layer's prefix
        own = {k: layer_raw.pop(k) for k in list(layer_raw)  # (and DeepSeek-V3's copy of the shared embedding)
               if k in NAMES["deepseek"] or k == "embed_tokens.weight"}
    missing = [k for k in NAMES[spec.layout] if k not in own and k != "shared_head.head.weight"]
    if missing or not layer_raw:
        raise ModelError(f"incomplete MTP head ({spec.describe()}): missing {', '.join(missing) or 'its decoder layer'}")
    layer, idx = _layer_module(model, moe=any(".experts." in k or k == "mlp.gate.weight" for k in layer_raw))

    # The layer goes through mlx-lm's own sanitize, renamed as a main layer (expert stacking, fp8, MLA split).
    out = model.sanitize({f"{prefix}{idx}.{k}": v for k, v in layer_raw.items()})
    layer_w = {m.group(1): v for k, v in out.items() if (m := re.match(rf".*\blayers\.{idx}\.(.*)", k))}

    # Zero-centred norms: shift exactly when mlx-lm shifted the main model's final norm.
    inner, _ = split_model(model)
    final, norm = raw.get(final_norm), inner.norm.weight
    shifted = final is not None and mx.allclose(norm, final + 1.0).item() and not mx.allclose(norm, final).item()
    head_w = {NAMES[spec.layout][k]: v for k, v in own.items() if k in NAMES[spec.layout]}
    if shifted:
        for k, v in layer_w.items():
            if any(("." + k).endswith(s) for s in LAYER_NORMS) and v.ndim == 1 and mx.array_equal(v, layer_raw[k]).item():
                layer_w[k] = v + 1.0
        head_w = {k: v + 1.0 if k.startswith("norm") else v for k, v in head_w.items()}

    tc = text_config(config)
    own_head = head_w["head.weight"].shape[0] if "head.weight" in head_w else None
    head = MtpHead(spec.layout, tc["hidden_size"], tc.get("rms_norm_eps", 1e-6), layer, own_head)
    try:
        head.load_weights(list(head_w.items()) + [(f"layer.{k}", v) for k, v in layer_w.items()], strict=True)
    except ValueError as e:
        raise ModelError(f"MTP head ({spec.describe()}) does not match the model config: {e}") from None
    dtype = inner.embed_tokens.weight.dtype
    if dtype in (mx.float16, mx.bfloat16, mx.float32):
        head.set_dtype(dtype)
    mx.eval(head.parameters())
    head.eval()
    return head
