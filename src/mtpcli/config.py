"""Settings: ONE schema (the fields of `Config`), TOML profiles, precedence flag > env > profile > default;
`resolve` decides every default that needs no model, `settle` what depends on the loaded target (the sources)."""

from __future__ import annotations

import math
import os
import re
import sys
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from .errors import EXIT_RUNTIME, MtpError, UsageError

SHIPPED_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "exact"
META_KEYS = {"description", "extends"}
SOURCES = ("auto", "model", "eagle3", "dflash", "ngram", "mtp", "history", "none")
DRAFTED = ("auto", "model", "eagle3", "dflash")  # the draft values that read --draft-model
AUTO_N_MAX = 8  # the widest draft `auto` considers, unless n_max is set
AUTO_N_MAX_HISTORY = 16  # ... with the history on (a stored answer repeated is worth long drafts)
SEEDS = 1 << 64  # mx.random.key takes 0..2^64-1
MIN_TEMP = 1e-6  # below it (but 0) logits / temp overflow float32 on ordinary logits: softmax of inf - inf is NaN
MAX_EXTENDS = 64  # profiles in one `extends` chain
BOOLS = {**dict.fromkeys(("1", "true", "yes", "on"), True), **dict.fromkeys(("0", "false", "no", "off"), False)}


def _rng(lo=None, hi=None, lo_open=False, hi_open=False) -> Callable[[Any], bool]:
    """A finite value in [lo, hi] (an open end leaves its bound out; None: no bound); its `allowed` says so as a key's
    help shows it: 1..64 (whole numbers), (0, 1], >= 0."""
    def check(v) -> bool:
        if isinstance(v, float) and not math.isfinite(v):
            return False
        above = lo is None or v > lo or (v == lo and not lo_open)
        below = hi is None or v < hi or (v == hi and not hi_open)
        return above and below
    if hi is None:
        check.allowed = f"{'>' if lo_open else '>='} {lo:g}"
    elif isinstance(lo, int) and isinstance(hi, int):
        check.allowed = f"{lo}..{hi}"
    else:
        check.allowed = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    return check


def key(default, help: str, check=None, allowed: str = "", flag: str = ""):
    """A field of Config that is a settings key (profiles, environment, flags). CHECK: a test, or a tuple of choices."""
    if isinstance(check, tuple):
        check, allowed = check.__contains__, "one of " + ", ".join(check)
    allowed = allowed or getattr(check, "allowed", "")
    return field(default=default, metadata={"help": help, "check": check, "allowed": allowed, "flag": flag})


PRIVATE = ("system",)  # settings whose text is the user's: in a record only with --log-prompts


@dataclass(frozen=True)
class Config:
    model: str = key("smollm2-135m", "Target model: local folder, alias, GGUF file or Hugging Face id (the local cache, "
                     "else downloaded).")
    draft_model: Optional[str] = key(None, "Draft model (same tokenizer as the target), or a trained EAGLE-3 head's or DFlash "
                                     "drafter's folder (draft = \"eagle3\" / \"dflash\", a source of auto).")
    draft: str = key("auto", "Draft source. auto: each cycle the source and width 0..n_max with the most expected "
                     "tokens per second; with the width pinned (num_draft_tokens or adaptive): the draft model, else "
                     "MTP heads, else history when on, else ngram.", SOURCES)
    num_draft_tokens: int = key(4, "Draft width: tokens drafted per verify cycle (setting it pins the width; draft = "
                                "auto otherwise chooses it).", _rng(1, 64))
    max_tokens: int = key(256, "Maximum number of tokens to generate per completion.", _rng(1))
    temp: float = key(0.0, "Sampling temperature; 0 is greedy.", lambda v: v == 0 or _rng(MIN_TEMP)(v),
                      f"0 or >= {MIN_TEMP:g}", "--temp")
    top_p: float = key(1.0, "Nucleus sampling mass, in (0, 1]; 1 is off.", _rng(0.0, 1.0, lo_open=True))
    top_k: int = key(0, "Keep only the k most likely tokens; 0 is off.", _rng(0))
    min_p: float = key(0.0, "Drop tokens below min_p times the top token's probability; 0 is off.",
                       _rng(0.0, 1.0, hi_open=True))
    seed: int = key(0, "Random seed: same seed, same output.", _rng(0, SEEDS - 1), "0..2^64-1")
    typical_threshold: float = key(0.0, "Typical acceptance delta (Medusa-2). NOT distribution-exact; 0 = the exact "
                                   "law.", _rng(0.0))
    typical_eps: float = key(1.0, "Typical acceptance cap eps: floor = min(eps, delta * exp(-H)).",
                             _rng(0.0, 1.0, lo_open=True))
    tree: str = key("off", "Draft trees: several candidates per position (earlier occurrences, the draft's next most "
                    "likely tokens) verified in one target pass, exact at every temperature. A node budget per cycle, "
                    "auto (a tree where its expected tokens per second beat the chain's) or off.",
                    lambda v: v in ("off", "auto") or (re.fullmatch("[0-9]+", v) and 2 <= int(v) <= 64),
                    "off, auto or 2..64", "--spec-tree")
    tree_children: int = key(3, "Most children per node of a draft tree.", _rng(2, 8), flag="--spec-tree-children")
    adaptive: bool = key(False, "Adaptive draft width (censoring-aware EMA of accepted tokens).",
                         flag="--spec-draft-adaptive")
    n_min: int = key(1, "Adaptive width lower bound.", _rng(1, 64), flag="--spec-draft-n-min")
    n_max: Optional[int] = key(None, "Adaptive width upper bound (default: num_draft_tokens; for draft = auto 8, and "
                               "16 for the history's drafts when it is on).", _rng(1, 64), flag="--spec-draft-n-max")
    p_min: float = key(0.0, "Draft confidence cut: stop drafting below this draft probability; 0 = off.",
                       _rng(0.0, 1.0, hi_open=True), flag="--spec-draft-p-min")
    history: bool = key(False, "Keep every run's output token ids on disk ($XDG_DATA_HOME/mtpcli/history.sqlite; "
                        "prompts too with --log-prompts) and draft from them (source history); --draft history "
                        "implies it.", flag="--history")
    history_max_mb: float = key(16.0, "Size cap of the history store in MiB of token ids; the oldest go first.",
                                _rng(0.0, lo_open=True))
    ngram_min: int = key(2, "Shortest context suffix the n-gram drafter looks up.", _rng(1, 16))
    ngram_max: int = key(4, "Longest context suffix the n-gram drafter looks up.", _rng(1, 16))
    ema_alpha: float = key(0.25, "EMA weight of a partial accept.", _rng(0.0, 1.0, lo_open=True))
    ema_probe: float = key(1.0, "EMA upward probe after a full (censored) accept.", _rng(0.0, lo_open=True))
    ema_init: float = key(2.0, "EMA initial estimate, reset per prompt.", _rng(0.0, lo_open=True))
    chat: Optional[bool] = key(None, "Apply the tokenizer's chat template (default: when it has one).")
    system: Optional[str] = key(None, "System message for the chat template.")
    format: str = key("text", "Output format: text, json or jsonl.", ("text", "json", "jsonl"))
    schema: Optional[str] = key(None, "Constrain the answer to a JSON schema: a file, or the schema's JSON text "
                                "(exact: the law samples the target restricted to what the schema allows).")
    json: bool = key(False, "Constrain the answer to any JSON value (a schema of true).")
    grammar: Optional[str] = key(None, "Constrain the answer to a grammar: a file in llguidance's Lark syntax.")
    prefill_step: int = key(64, "Prefill chunk size in tokens (and where a kept prefill can resume).", _rng(1))
    prefill_cache: bool = key(True, "Keep each prompt's prefill (the target's and the draft model's) on disk "
                              "($XDG_CACHE_HOME/mtpcli/prefill/) and resume from the longest kept prefix of a later "
                              "prompt: the same output, token for token.", flag="--prefill-cache")
    prefill_cache_mb: float = key(2048.0, "Size cap of the kept prefills in MiB; the least recently used go first.",
                                  _rng(0.0, lo_open=True))
    distributed: str = key("auto", "Under mlx.launch (mtpcli launch): data (each rank decodes a share of the prompts), "
                           "tensor or pipeline (the target sharded over the ranks); auto: data with several prompts, "
                           "else tensor.", ("auto", "data", "tensor", "pipeline"))
    distributed_timeout: float = key(600.0, "Under mlx.launch: seconds a rank waits for the others without progress "
                                     "before it gives up with an error.", _rng(0.0, lo_open=True))
    # ---- not keys: where the values came from, and what `resolve` / `settle` decided
    profile: str = DEFAULT_PROFILE
    origins: Mapping[str, str] = field(default_factory=dict)
    pinned: bool = False  # draft = auto with a width set (num_draft_tokens not the default, or adaptive)
    sources: tuple[str, ...] = ()  # the sources that draft (settle): auto's, or the one source
    widest: Mapping[str, int] = field(default_factory=dict)  # auto: a source's widest draft where under n_max

    @property
    def law(self) -> str:
        return "greedy" if self.temp == 0 else "typical" if self.typical_threshold > 0 else "exact"

    def where(self, key: str) -> str:
        """Where the key's value came from, as a message names it: its flag, else its origin (env, a profile)."""
        return _where(key, self.origins.get(key, "default"))

    def record(self, texts: bool = False) -> dict[str, Any]:
        """What the run log and --stats-json keep of the settings: every key, so that a run can be replayed; the
        system message's text only with `texts` (--log-prompts), else <redacted> (as the command line keeps it)."""
        return {"profile": self.profile, "law": self.law,
                **{k: "<redacted>" if k in PRIVATE and getattr(self, k) is not None and not texts else getattr(self, k)
                   for k in SCHEMA}}


@dataclass(frozen=True)
class Key:
    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], bool] | None
    allowed: str
    flag: str

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "MTPCLI_" + self.name.upper()


def _where(key: str, origin: str) -> str:
    return SCHEMA[key].option if origin == "flag" else origin


def _base(t) -> type:
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if args else t


_HINTS = typing.get_type_hints(Config)
SCHEMA: dict[str, Key] = {f.name: Key(f.name, _base(_HINTS[f.name]), f.default, **f.metadata)
                          for f in fields(Config) if "help" in f.metadata}


@dataclass
class Profile:
    name: str
    path: Path | None
    values: dict[str, Any]
    description: str = ""
    origins: dict[str, Path] = field(default_factory=dict)  # key -> the file that set it (through `extends`)


# ---- locations ---------------------------------------------------------------------------------
def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "mtpcli"


def user_dir() -> Path:
    return Path(os.environ.get("MTPCLI_PROFILE_DIR") or config_home() / "profiles")


def config_file() -> Path:
    return config_home() / "config.toml"


def available() -> dict[str, Path]:
    """name -> file; a user profile shadows a shipped one of the same name."""
    return {p.stem: p for folder in (SHIPPED_DIR, user_dir()) for p in sorted(folder.glob("*.toml"))}


def default_name() -> str:
    """config.toml's default_profile (its only key), else the shipped default."""
    cfg = config_file()
    data = _read_toml(cfg) if cfg.is_file() else {}
    for k, v in data.items():
        if k != "default_profile":
            raise UsageError(f"{_key_line(cfg, k)}: unknown key '{k}' (the only key is default_profile)")
        if not isinstance(v, str) or not v:
            raise UsageError(f"{_key_line(cfg, k)}: default_profile = {v!r} must be a profile name")
    return data.get("default_profile", DEFAULT_PROFILE)


def set_default(name: str) -> Path:
    load(name)  # refuse unknown or broken profiles before persisting
    cfg = config_file()
    tmp = cfg.with_suffix(".tmp")
    try:
        cfg.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(tomli_w.dumps({"default_profile": name}))
        tmp.replace(cfg)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise MtpError(f"{cfg}: not written ({e.strerror or e}); the default profile is unchanged", EXIT_RUNTIME) \
            from None
    return cfg


# ---- parsing and validation --------------------------------------------------------------------
def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8-sig"))  # a byte-order mark, as editors save, is fine
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: TOML syntax error: {e}") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read profile: {e.strerror}") from None


def _key_line(path: Path, name: str) -> str:
    """`path:line` of a top-level key, for error messages."""
    try:
        lines = path.read_bytes().decode("utf-8-sig", errors="replace").splitlines()
    except OSError:
        return str(path)
    pattern = re.compile(rf"^\s*[\"']?{re.escape(name)}[\"']?\s*=")
    n = next((i for i, line in enumerate(lines, 1) if pattern.match(line)), None)
    return f"{path}:{n}" if n else str(path)


def check_value(name: str, value: Any, where: str) -> Any:
    """Validate one value against the schema; returns it (ints accepted for float keys)."""
    if name not in SCHEMA:
        import difflib  # (only for a mistyped key)

        hint = difflib.get_close_matches(name, list(SCHEMA) + sorted(META_KEYS), n=1, cutoff=0.4)
        raise UsageError(f"{where}: unknown key '{name}'" + (f"; did you mean '{hint[0]}'?" if hint else ""))
    spec = SCHEMA[name]
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, spec.type) or (spec.type is int and isinstance(value, bool)):
        raise UsageError(f"{where}: {name} = {value!r} must be {spec.type.__name__}"
                         + (f" in {spec.allowed}" if spec.allowed else ""))
    if spec.check and not spec.check(value):
        raise UsageError(f"{where}: {name} = {value!r} is out of range; allowed: {spec.allowed}")
    return value


def parse_env(name: str, raw: str) -> Any:
    spec = SCHEMA[name]
    where = f"environment {spec.env}"
    try:
        value = BOOLS[raw.strip().lower()] if spec.type is bool else spec.type(raw)
    except (KeyError, ValueError):
        raise UsageError(f"{where}: {raw!r} is not a valid {spec.type.__name__}") from None
    return check_value(name, value, where)


def load(name_or_path: str, _seen: tuple[str, ...] = (), where: str = "") -> Profile:
    """Load a profile by name (user dir, then shipped) or by path, following `extends`; `where` asked for it."""
    path = Path(name_or_path)
    if not (name_or_path.endswith(".toml") and path.is_file()):
        known = available()
        if name_or_path not in known:
            raise UsageError(f"{where}unknown profile '{name_or_path}'; known profiles: {', '.join(sorted(known))}")
        path = known[name_or_path]
    seen = _seen + (str(path.resolve()),)
    if seen[-1] in _seen:
        raise UsageError(f"{path}: 'extends' forms a cycle ({' -> '.join(Path(p).stem for p in seen)})")
    if len(seen) > MAX_EXTENDS:
        raise UsageError(f"{Path(seen[0])}: its 'extends' chain is longer than {MAX_EXTENDS} profiles "
                         f"({' -> '.join(Path(p).stem for p in seen[:3])} -> ...)")
    data = _read_toml(path)
    description = data.pop("description", "")
    parent = data.pop("extends", None)
    values = {k: check_value(k, v, _key_line(path, k)) for k, v in data.items()}
    origins = dict.fromkeys(values, path)
    if parent is not None:
        if not isinstance(parent, str):
            raise UsageError(f"{path}: extends = {parent!r} must be a profile name")
        base = load(parent, seen, f"{_key_line(path, 'extends')}: extends: ")
        values, origins = {**base.values, **values}, {**base.origins, **origins}
        description = description or base.description
    n_max = values.get("n_max") or values.get("num_draft_tokens")
    if values.get("n_min") is not None and n_max is not None and values["n_min"] > n_max:
        raise UsageError(f"{path}: n_min ({values['n_min']}) must not exceed n_max ({n_max})")
    return Profile(path.stem, path, values, description, origins)


def resolve(profile: str | None, flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """The configuration with precedence: flag > environment (MTPCLI_*) > profile > built-in default."""
    env = os.environ if env is None else env
    if asked := profile or env.get("MTPCLI_PROFILE"):
        prof = load(asked, where="" if profile else "environment MTPCLI_PROFILE: ")
    else:
        prof = load(default_name(), where=f"{_key_line(config_file(), 'default_profile')}: default_profile: ")
    v: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for name, spec in SCHEMA.items():
        if flags.get(name) is not None:
            v[name], origins[name] = check_value(name, flags[name], spec.option), "flag"
        elif env.get(spec.env):
            v[name], origins[name] = parse_env(name, env[spec.env]), f"env {spec.env}"
        elif name in prof.values:
            v[name], origins[name] = prof.values[name], str(prof.origins[name])
        else:
            v[name], origins[name] = spec.default, "default"
    for name in ("model", "draft_model"):  # (an empty name would be read as the working folder, or as no draft)
        if v[name] is not None and not v[name].strip():
            raise UsageError(f"{_where(name, origins[name])}: {name} is empty; give a local folder, an alias, a .gguf file or a Hugging "
                             "Face id")
    if v["tree"] != "off" and v["typical_threshold"] > 0:
        raise UsageError("--spec-tree needs the exact law: it is not used with typical acceptance "
                         "(--typical-threshold)")
    if sum(1 for k in ("schema", "json", "grammar") if v[k]) > 1:
        raise UsageError("--schema, --json and --grammar are each a constraint: give one")
    if v["ngram_min"] > v["ngram_max"]:
        raise UsageError(f"ngram_min ({v['ngram_min']}) must not exceed ngram_max ({v['ngram_max']})")
    if v["draft"] in DRAFTED[1:] and not v["draft_model"]:
        raise UsageError(f"--draft {v['draft']} needs --draft-model PATH_OR_ID" + {"eagle3": " (an EAGLE-3 head's folder)",
                         "dflash": " (a DFlash drafter's folder)"}.get(v["draft"], ""))
    if v["draft"] == "none" and (unused := [SCHEMA[k].option for k in ("draft_model", "num_draft_tokens", "adaptive")
                                            if origins[k] == "flag" and v[k]]):
        raise UsageError(f"--draft none drafts nothing: {' and '.join(unused)} would not be used")
    if v["draft"] == "history":
        if v["history"] is False and origins["history"] != "default":
            raise UsageError(f"--draft history needs the history, but history is off ({origins['history']})")
        v["history"] = True
    if v["history"] and v["history_max_mb"] * (1 << 20) < 4 * v["max_tokens"]:  # (int32 token ids)
        where = "--history-max-mb" if origins["history_max_mb"] == "flag" else \
            f"history_max_mb ({origins['history_max_mb']})"
        raise UsageError(f"{where} {v['history_max_mb']:g} keeps less than one answer of max_tokens {v['max_tokens']} "
                         f"({4 * v['max_tokens']} bytes of token ids): it would delete every stored output and keep "
                         "none")
    pinned = v["draft"] == "auto" and (v["adaptive"] or origins["num_draft_tokens"] != "default")
    if v["n_max"] is None:
        auto = v["draft"] == "auto" and not pinned
        v["n_max"] = (AUTO_N_MAX_HISTORY if v["history"] else AUTO_N_MAX) if auto else v["num_draft_tokens"]
    if v["n_min"] > v["n_max"]:
        raise UsageError(f"--spec-draft-n-min ({v['n_min']}) must not exceed --spec-draft-n-max ({v['n_max']})")
    return Config(**v, profile=prof.name, origins=origins, pinned=pinned)


def settle(cfg: Config, has_mtp: bool, several_rows: bool = False, sharded: bool = False,
           head: str | None = None) -> Config:
    """What depends on the loaded models: the sources that draft. draft = auto chooses among every source the run has
    (n-gram lookup, the draft model when given (or the trained head it is: `head`, which then stands for the MTP
    heads too), the MTP heads when the checkpoint has them and rows decode one at a time, the history when on)
    unless its width is pinned: then the first it has of model, mtp, history, ngram."""
    draft, model = cfg.draft, head or "model"
    if draft == "auto" and cfg.pinned:
        draft = model if cfg.draft_model else "mtp" if has_mtp else "history" if cfg.history else "ngram"
    if draft in DRAFTED[1:] and draft != model:
        names = {"eagle3": "an EAGLE-3 head", "dflash": "a DFlash drafter", "model": "a model"}
        raise UsageError(f"--draft {draft}: --draft-model '{cfg.draft_model}' is {names[model]}" + (
            f" (use --draft {model} or auto)" if head else f", not {names[draft]} (its config.json)"))
    if cfg.tree != "off" and (sharded or draft == "mtp"):
        raise UsageError("--spec-tree is not supported with " + (f"--distributed {cfg.distributed}" if sharded else
                                                                 "--draft mtp") + " yet (use --spec-tree off)")
    if sharded and (cfg.schema or cfg.json or cfg.grammar):
        raise UsageError(f"--schema, --json and --grammar are not supported with --distributed {cfg.distributed} yet")
    if (draft == "mtp" or head) and sharded:
        raise UsageError(("--draft mtp" if draft == "mtp" else f"a trained head (--draft-model {cfg.draft_model})") +
                         f" is not supported with --distributed {cfg.distributed} yet (use a draft model, ngram or none)")
    if draft != "auto":
        return replace(cfg, draft=draft, sources=() if draft == "none" else (draft,))
    sources = ("ngram",) + (model,) * bool(cfg.draft_model) + ("mtp",) * (has_mtp and not several_rows and not head) \
        + ("history",) * cfg.history
    widest = {}  # the history's default widest draft (16) is for the history: the other sources keep theirs
    if cfg.history and cfg.origins.get("n_max", "default") == "default":
        widest = {n: AUTO_N_MAX for n in sources if n != "history"}
    return replace(cfg, sources=sources, widest=widest)

