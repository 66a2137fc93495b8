"""Finding and loading models: local folder > known alias > GGUF file > Hugging Face id (the local cache, else
downloaded from the Hub as mlx-lm does, unless the user set HF_HUB_OFFLINE)."""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# before huggingface_hub is imported (it reads this once, at import): nothing reaches the Hub behind our back (mlx-lm's
# and transformers' loaders); a Hub id not in the cache is downloaded by hub_download alone, unless the user's own
# HF_HUB_OFFLINE (kept in MTPCLI_HF_HUB_OFFLINE by the first mtpcli process: cli.py, or here) says no
os.environ.setdefault("MTPCLI_HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", ""))
os.environ["HF_HUB_OFFLINE"] = "1"
HUB_TIMEOUT = 5  # seconds a Hub request may wait: a machine without network is told so within seconds

import mlx.core as mx  # noqa: E402
from huggingface_hub import snapshot_download  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS, MODEL_REMAPPING, load_config, load_model, load_tokenizer  # noqa: E402

from . import dflash, eagle, fetch, gguf_convert, mtp, prefix  # noqa: E402
from .cache import layer_kind  # noqa: E402
from .errors import ModelError  # noqa: E402


@dataclass
class Loaded:
    model: object
    tokenizer: object  # mlx_lm TokenizerWrapper
    path: Path | None
    name: str
    config: dict
    mtp: object = None  # mtp.MtpSpec: the checkpoint's multi-token-prediction head, if any
    head: object = None  # the MTP head, built on first use
    kind: str = "model"  # a draft: "model" (a model of the same tokenizer), or a trained head ("eagle3", "dflash")


def canonical(name: str) -> str:
    """The name a model is logged under (run log, history, cost table): a local folder or GGUF file as its absolute
    path (the same from any folder); an alias or a Hugging Face id as given."""
    path = Path(name).expanduser()
    return str(path.resolve()) if folder_named(name) or (path.suffix == ".gguf" and path.is_file()) else name


def folder_named(name: str) -> Path | None:
    """The local folder `name` names, if any. A folder named like an alias is one only with a config.json: an empty
    ./smollm2-135m in the working folder does not hide the alias."""
    path = Path(name).expanduser()
    return path if path.is_dir() and (name not in fetch.ALIASES or (path / "config.json").is_file()) else None


def resolve(name: str, download: bool = True) -> Path:
    """Turn a model name into a local folder mlx-lm's loaders take (a Hub id: its snapshot in the local cache).
    download: fetch and convert an alias, or download a Hub id (hub_download), on first use (else one not cached yet
    is an error)."""
    if not name.strip():
        raise ModelError("the model name is empty: give a local folder, an alias "
                         f"({', '.join(fetch.ALIASES)}), a .gguf file or a Hugging Face id")
    path = Path(name).expanduser()
    if folder_named(name):
        if not (path / "config.json").is_file():
            raise ModelError(f"model folder {path} has no config.json (not an mlx-lm/Hugging Face model folder)")
        return path.resolve()
    if name in fetch.ALIASES:
        if not (download or fetch.is_cached(name)):
            size = fetch.human_size(fetch.ALIASES[name].size)
            raise ModelError(f"'{name}' is a known alias not fetched yet (a {size} download); "
                             f"`mtpcli models pull {name}` fetches and converts it")
        return fetch.ensure(name)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist")
        return fetch.cached_conversion(path)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelError(f"model '{name}' not found: no such folder, not a known alias "
                         f"({', '.join(fetch.ALIASES)}), not a .gguf file, not a Hugging Face id")
    try:  # a Hub id: its snapshot in the local cache first
        return Path(snapshot_download(name, local_files_only=True, allow_patterns=DEFAULT_ALLOW_PATTERNS))
    except Exception as e:  # noqa: BLE001 - not in the cache (LocalEntryNotFoundError), a malformed id, ...: one line
        if type(e).__name__ != "LocalEntryNotFoundError":
            raise ModelError(f"model '{name}': not a local folder, not a Hugging Face id: {_first_line(e)}") from None
    if not download or os.environ.get("MTPCLI_HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE"):
        why = "HF_HUB_OFFLINE is set" if download else "this command downloads nothing"
        raise ModelError(f"model '{name}': not a local folder and not in the Hugging Face cache, and {why} "
                         f"(`hf download {name}` fetches it)")
    return hub_download(name)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def hub_download(name: str) -> Path:
    """NAME's files that mlx-lm loads, downloaded from the Hub (HF_ENDPOINT) into its cache, with huggingface_hub's
    progress bars on stderr; a failure (no network, no such repository, a gated one) is one line."""
    from huggingface_hub import constants, get_session
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    print(f"mtpcli: downloading {name} from {constants.ENDPOINT} (HF_HUB_OFFLINE=1 turns this off) ...", file=sys.stderr,
          flush=True)
    constants.HF_HUB_OFFLINE, was = False, constants.HF_HUB_OFFLINE
    get_session().timeout = HUB_TIMEOUT  # (its own default is none: an unreachable host would hang, not fail)
    try:
        return Path(snapshot_download(name, allow_patterns=DEFAULT_ALLOW_PATTERNS, etag_timeout=HUB_TIMEOUT))
    except Exception as e:  # noqa: BLE001 - connection, HTTP, disk: the user needs one line
        cause = e.__cause__ or e.__context__ or e  # (a connection error is raised as "not in the cache", from it)
        if isinstance(e, GatedRepoError) or isinstance(cause, GatedRepoError):
            why = "a gated repository: accept its terms on the Hub and log in (`hf auth login`, or HF_TOKEN)"
        elif isinstance(e, RepositoryNotFoundError) or isinstance(cause, RepositoryNotFoundError):
            why = "no such repository (or a private one: log in with `hf auth login`, or set HF_TOKEN)"
        elif isinstance(e, RevisionNotFoundError):
            why = "no such revision"
        elif type(e).__name__ == "LocalEntryNotFoundError":
            why = f"the Hub cannot be reached (no network?): {_first_line(cause)}"
        else:
            why = _first_line(e)
        raise ModelError(f"model '{name}': download from {constants.ENDPOINT} failed: {why}") from None
    finally:
        constants.HF_HUB_OFFLINE = was


KEPT: dict | None = None  # `mtpcli chat` sets a dict: each model is loaded once, for every turn


def kept(load):
    """LOAD(name, ...) once per name and arguments while KEPT is a dict (chat), else every time."""
    @functools.wraps(load)
    def once(name, *args, **kwargs):
        if KEPT is None:
            return load(name, *args, **kwargs)
        key = (load.__name__, name, *(a if isinstance(a, str) else id(a) for a in [*args, *kwargs.values()]))
        if key not in KEPT:
            KEPT[key] = load(name, *args, **kwargs)
        return KEPT[key]
    return once


@kept
def load(name: str, role: str = "model", lazy: bool = False, tokenizer=None) -> Loaded:
    """Load with mlx-lm's public loaders; with MTP heads through the family's classes, whose sanitize drops them.
    The config, the tokenizer and the weights' names first: a broken folder fails, naming its file, before any weights
    load. `lazy`: the weights are read from their files when first used (a deferred draft model: maybe never);
    `tokenizer`: another folder's, of the same files (not read again)."""
    target = resolve(name)
    try:
        config = read_config(target)
        check_config(target, config)
        tokenizer = read_tokenizer(target, config) if tokenizer is None else tokenizer
        check_weights(target, config)
        spec = mtp.find(target, config)

        def classes(config):  # any family whose checkpoint carries MTP weights: dropped before its strict load
            kind = MODEL_REMAPPING.get(config["model_type"], config["model_type"])
            family = importlib.import_module(f"mlx_lm.models.{kind}")
            return mtp.strip_sanitize(family.Model, spec), family.ModelArgs

        model, config = load_model(target, lazy) if spec is None else \
            load_model(target, lazy, get_model_classes=classes)
    except Exception as e:  # noqa: BLE001 - the loader raises many kinds; the user needs one line
        raise ModelError(f"cannot load {role} '{name}': {_first_line(e)}") from None
    return Loaded(model, tokenizer, Path(target), name, config, spec)


HEADS = {"eagle3": "EAGLE-3 draft head", "dflash": "DFlash block-diffusion drafter"}


@kept
def load_draft(name: str, target: Loaded, lazy: bool = False) -> Loaded:
    """The draft of --draft-model: a model of the target's tokenizer (check_pair), or a trained head over the
    target's hidden states, built beside it (refused when made for another target). `lazy`: a draft model's weights
    are read when it first drafts (draft = auto defers it, and may never bring it in)."""
    folder = resolve(name)
    kind = eagle.kind(folder)
    if kind is None:
        same = _vocabulary(folder) == _vocabulary(target.path)
        draft = load(name, "draft model", lazy, target.tokenizer if same else None)  # (a second read: seconds)
        check_pair(target, draft)
        return draft
    head = (dflash.load if kind == "dflash" else eagle.load)(folder, target.model, output_size(target))
    return Loaded(head, target.tokenizer, folder, name, read_config(folder), kind=kind)


def _vocabulary(folder: Path) -> dict:
    """What a folder's tokenizer files say of its tokens: every file but its chat template (a draft's is never used),
    tokenizer_config.json parsed, without one."""
    files = {p.name: p.read_bytes() for p in prefix.tokenizer_files(folder) if not p.name.startswith("chat_template")}
    try:
        config = json.loads(files.pop("tokenizer_config.json", b"{}"))
        config.pop("chat_template", None)
    except (ValueError, AttributeError):  # (not a JSON object: read as the tokenizer loader reads it)
        return {"unreadable": folder}
    return {**files, "tokenizer_config.json": config}


def one_row(loaded: Loaded) -> bool:
    """A target whose cache decodes one row at a time anyway (recurrent or opaque layers)."""
    return any(layer_kind(c) in ("state", "native") for c in make_prompt_cache(loaded.model))


def has_mtp(loaded: Loaded) -> bool:
    return mtp.supported(loaded.mtp, loaded.config)


def mtp_head(loaded: Loaded):
    """Build the target's MTP head (for --draft mtp); one clear error when it has none."""
    if loaded.mtp is None:
        raise ModelError(f"--draft mtp: model '{loaded.name}' carries no multi-token-prediction heads "
                         "(no 'mtp.*' or extra 'model.layers.N' weights); use --draft ngram or --draft-model")
    if loaded.head is None:
        loaded.head = mtp.load(loaded.model, loaded.path, loaded.config, loaded.mtp)
    return loaded.head


def check_pair(target: Loaded, draft: Loaded) -> None:
    """Refuse a draft whose tokenizer or vocabulary differs from the target's, before any decoding (a draft that
    shares the target's tokenizer, read from the same files, has its vocabulary: not built again, 0.16 s on
    Qwen2.5's 151k tokens)."""
    where = f"--draft-model '{draft.name}' does not match --model '{target.name}'"
    tv, dv = ({}, {}) if draft.tokenizer is target.tokenizer else (
        target.tokenizer._tokenizer.get_vocab(), draft.tokenizer._tokenizer.get_vocab())
    if tv != dv:
        if len(tv) != len(dv):
            raise ModelError(f"{where}: tokenizer vocabularies differ ({len(dv)} vs {len(tv)} tokens)")
        tok = next(t for t in tv if dv.get(t) != tv[t])
        raise ModelError(f"{where}: token {tok!r} has id {dv.get(tok)} in the draft, {tv[tok]} in the target")
    t_out, d_out = output_size(target), output_size(draft)
    if t_out != d_out:
        raise ModelError(f"{where}: output vocabulary sizes differ ({d_out} vs {t_out} logits)")


def output_size(loaded: Loaded) -> int:
    """Logits per position: from the config when it says, else from one forward pass."""
    size = loaded.config.get("vocab_size") or (loaded.config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) else int(loaded.model(mx.array([[0]])).shape[-1])


def max_context(config: dict) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    text = config.get("text_config")
    return max_context(text) if isinstance(text, dict) else None


def read_config(folder: Path | str) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelError(f"'{folder}' is not a local model folder (no config.json); inspect works on folders and aliases")
    try:
        config = json.loads(path.read_bytes())
    except ValueError as e:  # (UnicodeDecodeError too)
        raise ModelError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path}: not a JSON object")
    return config


# keys mlx-lm and max_context read as counts: 0 or -5 there fails later as "'full_attention' is not in list" or a
# context of -5 tokens
POSITIVE = ("num_hidden_layers", "hidden_size", "vocab_size", "max_position_embeddings", "n_positions", "max_seq_len",
            "seq_length")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def check_config(folder: Path, config: dict) -> None:
    """Refuse a config.json that mlx-lm would fail on without naming what is wrong."""
    path = folder / "config.json"
    if not isinstance(config.get("model_type"), str):
        raise ModelError(f"{path}: no \"model_type\" (the model's family: llama, qwen2, ...)")
    for part in (config, config.get("text_config")):
        for key in POSITIVE if isinstance(part, dict) else ():
            v = part.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ModelError(f"{path}: {key} is {v!r}; it must be a positive integer")


def read_tokenizer(folder: Path, config: dict):
    """mlx-lm's tokenizer of a model folder, checked against the model's vocabulary."""
    files = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not files:
        raise ModelError(f"{folder}: no tokenizer files (none of {', '.join(TOKENIZER_FILES)})")
    try:
        tokenizer = load_tokenizer(folder, eos_token_ids=load_config(folder).get("eos_token_id", None))
    except Exception as e:  # noqa: BLE001 - transformers' reasons name no file (a KeyError's text): one line that does
        raise ModelError(f"{files[0]}: not a tokenizer mlx-lm can load ({_tokenizer_fault(files[0], e)})") from None
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    # the tokenizer's own vocabulary, not the special tokens transformers may add (an <|endoftext|> of its own)
    backend = getattr(tokenizer._tokenizer, "backend_tokenizer", None)
    size = backend.get_vocab_size(with_added_tokens=False) if backend is not None else 0
    if isinstance(vocab, int) and size > vocab:
        raise ModelError(f"{files[0]}: {size} tokens, more than the {vocab} of config.json's vocab_size (the "
                         "tokenizer of another model?)")
    return tokenizer


def _tokenizer_fault(path: Path, e: Exception) -> str:
    """Why a tokenizer file did not load: a tokenizer.json that is not the tokenizers library's (no JSON object with a
    "model"), else the loader's first line."""
    if path.name == "tokenizer.json":
        try:
            doc = json.loads(path.read_bytes())
        except ValueError as bad:  # (UnicodeDecodeError too)
            return f"not valid JSON: {bad}"
        if not (isinstance(doc, dict) and "model" in doc):
            return "no \"model\" in it: not a tokenizer.json of the Hugging Face tokenizers library"
    return _first_line(e)


def check_weights(folder: Path, config: dict) -> None:
    """Refuse a .safetensors file whose header is not one (MLX's loader fails without naming it), and weights for
    fewer layers than config.json's num_hidden_layers (mlx-lm's "Missing 18 parameters" names neither)."""
    layers = set()
    for path in sorted(folder.glob("*.safetensors")):
        doc = gguf_convert.header(path)
        if doc is None:
            raise ModelError(f"{path}: not a safetensors file (damaged or not weights)")
        layers.update(int(m.group(1)) for key in doc if (m := LAYER.search(key)))
    n = config.get("num_hidden_layers") or (config.get("text_config") or {}).get("num_hidden_layers")
    if layers and isinstance(n, int) and (missing := [i for i in range(n) if i not in layers]):
        raise ModelError(f"{folder}: config.json's num_hidden_layers is {n}, but the weights (*.safetensors) hold "
                         f"{n - len(missing)} layers (none for layer {missing[0]})")


# a decoder layer's weight (model.layers.3..., language_model.model.layers.3..., model.language_model.layers.3...)
LAYER = re.compile(r"(?:^|\.)(?:model|language_model)\.layers\.(\d+)\.")


def draft_sources(folder: Path | str, config: dict) -> list[str]:
    """The draft sources mtpcli can use with this checkpoint as the target."""
    sources = ["model (with --draft-model)", "ngram", "none"]
    spec = mtp.find(folder, config)
    if spec is not None:
        sources.insert(0, f"mtp ({spec.describe()}{'' if mtp.supported(spec, config) else '; NOT supported'})")
    if any(k in config for k in ("linear_num_value_heads", "ssm_cfg", "state_size", "mamba_d_state")):
        sources.append("(recurrent layers: a rejected draft restores a snapshot and replays the kept tokens)")
    return sources


def describe(path: str) -> list[str]:
    """`mtpcli models inspect`: what a checkpoint is (a model, or a draft head for a target) and what drafts for it."""
    folder = resolve(path, download=False)  # (an alias not fetched yet: said, not fetched to print 4 lines)
    cfg = read_config(folder)
    if head := eagle.kind(folder):
        cfg = eagle.flat(cfg)
        taps = ((cfg.get("eagle_config") or cfg.get("dflash_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                or (cfg.get("dflash_config") or {}).get("target_layer_ids") or "the defaults")
        return [f"kind: {HEADS[head]} (a draft for a target; --draft {head} --draft-model {path})",
                f"hidden: {cfg.get('hidden_size')}  target layers read: {taps}  "
                f"vocab: {cfg.get('draft_vocab_size', cfg.get('vocab_size'))} of {cfg.get('vocab_size')}"]
    check_config(folder, cfg)
    return [f"model_type: {cfg.get('model_type')}",
            f"layers: {cfg.get('num_hidden_layers')}  hidden: {cfg.get('hidden_size')}  vocab: {cfg.get('vocab_size')}",
            f"context: {max_context(cfg)}", "draft sources: " + ", ".join(draft_sources(folder, cfg))]
