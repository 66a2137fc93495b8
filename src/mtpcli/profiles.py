"""Decode settings: ONE schema, TOML profiles, and precedence flag > env > profile > default."""

from __future__ import annotations

import difflib
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import UsageError

SHIPPED_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "exact"
META_KEYS = {"description", "extends"}


@dataclass(frozen=True)
class Key:
    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    allowed: str = ""  # how the allowed range reads in an error message
    flag: str = ""  # the command-line flag, when it differs from --name-with-dashes

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "MTPCLI_" + self.name.upper()


def _rng(lo=None, hi=None, lo_open=False, hi_open=False):
    def check(v):
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if lo is not None and (v < lo or (lo_open and v == lo)):
            return False
        return not (hi is not None and (v > hi or (hi_open and v == hi)))
    return check


def _choice(*options):
    return lambda v: v in options


SCHEMA: dict[str, Key] = {k.name: k for k in [
    Key("model", str, "smollm2-135m", "Target model: local folder, alias, GGUF file or Hugging Face id (local cache)."),
    Key("draft_model", str, None, "Draft model (same tokenizer as the target); implies draft = \"model\"."),
    Key("draft", str, "auto", "Draft source: model, ngram, mtp, history, none, or auto (each cycle the source and width "
        "0..n_max with the most expected tokens per second, over n-gram lookup, the draft model, MTP heads and the "
        "history; with a pinned num_draft_tokens or adaptive: the draft model, else MTP heads, else history when on, "
        "else ngram).",
        _choice("auto", "model", "ngram", "mtp", "history", "none"), "one of auto, model, ngram, mtp, history, none"),
    Key("num_draft_tokens", int, 4, "Draft width: tokens drafted per verify cycle (setting it pins the width; "
        "draft = auto otherwise chooses it).", _rng(1, 64), "1..64"),
    Key("max_tokens", int, 256, "Maximum number of tokens to generate per completion.", _rng(1), ">= 1"),
    Key("temp", float, 0.0, "Sampling temperature; 0 is greedy.", _rng(0.0), ">= 0", "--temp"),
    Key("top_p", float, 1.0, "Nucleus sampling mass, in (0, 1]; 1 is off.", _rng(0.0, 1.0, lo_open=True), "(0, 1]"),
    Key("top_k", int, 0, "Keep only the k most likely tokens; 0 is off.", _rng(0), ">= 0"),
    Key("min_p", float, 0.0, "Drop tokens below min_p times the top token's probability; 0 is off.",
        _rng(0.0, 1.0, hi_open=True), "[0, 1)"),
    Key("seed", int, 0, "Random seed: same seed, same output.", _rng(0), ">= 0"),
    Key("typical_threshold", float, 0.0,
        "Typical acceptance delta (Medusa-2). NOT distribution-exact; 0 = the exact law.", _rng(0.0), ">= 0"),
    Key("typical_eps", float, 1.0, "Typical acceptance cap eps: floor = min(eps, delta * exp(-H)).",
        _rng(0.0, 1.0, lo_open=True), "(0, 1]"),
    Key("adaptive", bool, False, "Adaptive draft width (censoring-aware EMA of accepted tokens).",
        flag="--spec-draft-adaptive"),
    Key("controller", str, "ema", "Adaptive width policy: ema (censoring-aware EMA) or cost (tokens per second).",
        _choice("ema", "cost"), "one of ema, cost", "--spec-draft-controller"),
    Key("n_min", int, 1, "Adaptive width lower bound.", _rng(1, 64), "1..64", "--spec-draft-n-min"),
    Key("n_max", int, None, "Adaptive width upper bound (default: num_draft_tokens; for draft = auto 8, and 16 for "
        "the history's drafts when it is on).", _rng(1, 64),
        "1..64",
        "--spec-draft-n-max"),
    Key("p_min", float, 0.0, "Draft confidence floor: stop drafting below this draft probability; 0 = off.",
        _rng(0.0, 1.0, hi_open=True), "[0, 1)", "--spec-draft-p-min"),
    Key("history", bool, False, "Keep every run's output token ids on disk ($XDG_DATA_HOME/mtpcli/history.sqlite; "
        "prompts too with --log-prompts) and draft from them (source history); --draft history implies it.",
        flag="--history"),
    Key("history_max_mb", float, 16.0, "Size cap of the history store in MiB of token ids; the oldest go first.",
        _rng(0.0, lo_open=True), "> 0"),
    Key("ngram_min", int, 2, "Shortest context suffix the n-gram drafter looks up.", _rng(1, 16), "1..16"),
    Key("ngram_max", int, 4, "Longest context suffix the n-gram drafter looks up.", _rng(1, 16), "1..16"),
    Key("ema_alpha", float, 0.25, "EMA weight of a partial accept.", _rng(0.0, 1.0, lo_open=True), "(0, 1]"),
    Key("ema_probe", float, 1.0, "EMA upward probe after a full (censored) accept.", _rng(0.0, lo_open=True), "> 0"),
    Key("ema_init", float, 2.0, "EMA initial estimate, reset per prompt.", _rng(0.0, lo_open=True), "> 0"),
    Key("chat", bool, None, "Apply the tokenizer's chat template (default: when it has one)."),
    Key("system", str, None, "System message for the chat template."),
    Key("format", str, "text", "Output format: text, json or jsonl.", _choice("text", "json", "jsonl"),
        "one of text, json, jsonl"),
    Key("prefill_step", int, 512, "Prefill chunk size in tokens.", _rng(1), ">= 1"),
    Key("distributed", str, "auto", "Under mlx.launch (mtpcli launch): data (each rank decodes a share of the prompts), "
        "tensor or pipeline (the target sharded over the ranks); auto: data with several prompts, else tensor.",
        _choice(*("auto", "data", "tensor", "pipeline")), "one of auto, data, tensor, pipeline"),
    Key("distributed_timeout", float, 600.0, "Under mlx.launch: seconds a rank waits for the others without progress "
        "before it gives up with an error.", _rng(0.0, lo_open=True), "> 0"),
]}


@dataclass
class Profile:
    name: str
    path: Path | None
    values: dict[str, Any]
    description: str = ""


@dataclass
class Settings:
    values: dict[str, Any]
    origins: dict[str, str]
    profile: str

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


# ---- locations ---------------------------------------------------------------------------------

def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "mtpcli"


def user_dir() -> Path:
    return Path(os.environ.get("MTPCLI_PROFILE_DIR") or config_home() / "profiles")


def config_file() -> Path:
    return config_home() / "config.toml"


def available() -> dict[str, Path]:
    """name -> file; a user profile shadows a shipped one of the same name."""
    found = {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.toml"))}
    if user_dir().is_dir():
        found.update({p.stem: p for p in sorted(user_dir().glob("*.toml"))})
    return found


def default_name() -> str:
    cfg = config_file()
    if cfg.is_file():
        data = _read_toml(cfg)
        name = data.get("default_profile")
        if isinstance(name, str) and name:
            return name
    return DEFAULT_PROFILE


def set_default(name: str) -> Path:
    load(name)  # refuse unknown or broken profiles before persisting
    cfg = config_file()
    cfg.parent.mkdir(parents=True, exist_ok=True)
    tmp = cfg.with_suffix(".tmp")
    tmp.write_text(f'default_profile = "{name}"\n')
    tmp.replace(cfg)
    return cfg


# ---- parsing and validation --------------------------------------------------------------------

def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a byte-order mark, as some editors save, is fine
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: TOML syntax error: {e}") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read profile: {e.strerror}") from None


def _key_line(path: Path, key: str) -> str:
    """`path:line` of a top-level key, for error messages."""
    import re

    try:
        lines = path.read_bytes().decode("utf-8-sig", errors="replace").splitlines()
    except OSError:
        return str(path)
    pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    n = next((i for i, line in enumerate(lines, 1) if pattern.match(line)), None)
    return f"{path}:{n}" if n else str(path)


def check_value(key: str, value: Any, where: str) -> Any:
    """Validate one value against the schema; returns it (ints accepted for float keys)."""
    if key not in SCHEMA:
        hint = difflib.get_close_matches(key, list(SCHEMA) + sorted(META_KEYS), n=1, cutoff=0.4)
        raise UsageError(f"{where}: unknown key '{key}'" + (f"; did you mean '{hint[0]}'?" if hint else ""))
    spec = SCHEMA[key]
    if value is None:
        return None
    ok_type = isinstance(value, spec.type) and not (spec.type is int and isinstance(value, bool))
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok_type = float(value), True
    if not ok_type:
        raise UsageError(f"{where}: {key} = {value!r} must be {spec.type.__name__}"
                         + (f" in {spec.allowed}" if spec.allowed else ""))
    if spec.check and not spec.check(value):
        raise UsageError(f"{where}: {key} = {value!r} is out of range; allowed: {spec.allowed}")
    return value


def parse_env(key: str, raw: str) -> Any:
    spec = SCHEMA[key]
    where = f"environment {spec.env}"
    try:
        if spec.type is bool:
            low = raw.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError
            value = low in ("1", "true", "yes", "on")
        else:
            value = spec.type(raw)
    except ValueError:
        raise UsageError(f"{where}: {raw!r} is not a valid {spec.type.__name__}") from None
    return check_value(key, value, where)


def load(name_or_path: str, _seen: tuple[str, ...] = ()) -> Profile:
    """Load a profile by name (user dir, then shipped) or by path, following `extends`."""
    path = Path(name_or_path)
    if not (name_or_path.endswith(".toml") and path.is_file()):
        known = available()
        if name_or_path not in known:
            raise UsageError(f"unknown profile '{name_or_path}'; known profiles: {', '.join(sorted(known))}")
        path = known[name_or_path]
    name = path.stem
    if str(path.resolve()) in _seen:
        chain = " -> ".join(Path(p).stem for p in _seen + (str(path.resolve()),))
        raise UsageError(f"{path}: 'extends' forms a cycle ({chain})")
    data = _read_toml(path)
    description = data.pop("description", "")
    parent = data.pop("extends", None)
    values = {k: check_value(k, v, _key_line(path, k)) for k, v in data.items()}
    if parent is not None:
        if not isinstance(parent, str):
            raise UsageError(f"{path}: extends = {parent!r} must be a profile name")
        base = load(parent, _seen + (str(path.resolve()),))
        values = {**base.values, **values}
        description = description or base.description
    _check_cross(values, str(path))
    return Profile(name, path, values, description)


def _check_cross(v: dict[str, Any], where: str) -> None:
    n_max = v.get("n_max") or v.get("num_draft_tokens")
    if v.get("n_min") is not None and n_max is not None and v["n_min"] > n_max:
        raise UsageError(f"{where}: n_min ({v['n_min']}) must not exceed n_max ({n_max})")


def resolve(profile: str | None, flags: dict[str, Any], env: dict[str, str] | None = None) -> Settings:
    """Settings with precedence: flag > environment (MTPCLI_*) > profile > built-in default."""
    env = os.environ if env is None else env
    name = profile or env.get("MTPCLI_PROFILE") or default_name()
    prof = load(name)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key, spec in SCHEMA.items():
        if flags.get(key) is not None:
            values[key], origins[key] = check_value(key, flags[key], spec.option), "flag"
        elif spec.env in env and env[spec.env] != "":
            values[key], origins[key] = parse_env(key, env[spec.env]), f"env {spec.env}"
        elif key in prof.values:
            values[key], origins[key] = prof.values[key], str(prof.path)
        else:
            values[key], origins[key] = spec.default, "default"
    if values["n_max"] is None:
        values["n_max"] = values["num_draft_tokens"]
    if values["ngram_min"] > values["ngram_max"]:
        raise UsageError(f"ngram_min ({values['ngram_min']}) must not exceed ngram_max ({values['ngram_max']})")
    if values["n_min"] > values["n_max"]:
        raise UsageError(f"--spec-draft-n-min ({values['n_min']}) must not exceed --spec-draft-n-max ({values['n_max']})")
    return Settings(values, origins, prof.name)


def markdown_table() -> str:
    """The README's table of profile keys, generated from the schema (a test keeps them in step)."""
    lines = ["| key | flag | environment | type | default | allowed | meaning |", "|---|---|---|---|---|---|---|"]
    for k in SCHEMA.values():
        default = "" if k.default is None else str(k.default).lower() if isinstance(k.default, bool) else str(k.default)
        lines.append(f"| `{k.name}` | `{k.option}` | `{k.env}` | {k.type.__name__} | {default} | {k.allowed} | {k.help} |")
    return "\n".join(lines)
