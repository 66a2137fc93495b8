"""From a settled Config and the loaded models to an Engine: the draft sources, the width policy (auto's decides
with this machine's kept cost table, and keeps what the run measured for the next), the decode settings."""

from __future__ import annotations

import functools
import platform
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from . import history, models, prefix, runlog
from .config import Config
from .constrain import Guide
from .controller import EmaController, FixedWidth
from .drafters import NoDraft, Source
from .drafters.auto import AutoDrafter
from .drafters.dflash import DFlashDrafter
from .drafters.eagle import EagleDrafter
from .drafters.history import HistoryDrafter
from .drafters.model import ModelDrafter
from .drafters.mtp import MtpDrafter
from .drafters.ngram import NgramDrafter
from .engine import DecodeConfig, Engine
from .cache import tree_ropes
from .errors import ModelError
from .costs import Costs, prior_costs
from .policy import AutoPolicy
from .sampling import SamplingParams
from .tree import Spec


def decode_config(cfg: Config) -> DecodeConfig:
    return DecodeConfig(SamplingParams(cfg.temp, cfg.top_p, cfg.top_k, cfg.min_p), cfg.typical_threshold,
                        cfg.typical_eps, cfg.prefill_step)


def open_history(cfg: Config, target: models.Loaded, keep_prompts: bool = False):
    """The history store of this tokenizer (history.Store; the history drafter reads it); None when it is off."""
    if not cfg.history:
        return None
    return history.Store(history.tokenizer_key(target.tokenizer), models.canonical(str(cfg.model)),
                         max(1, int(min(cfg.history_max_mb * (1 << 20), 1 << 62))), keep_prompts)  # (1e308: no cap)


def source(kind: str, cfg: Config, target: models.Loaded, draft: models.Loaded | None, store, trees: bool = False,
           prefills: prefix.Store | None = None, guide: Guide | None = None) -> Source:
    """One draft source (`trees`: drafting the trees the configuration asks for, where it can; `guide`: the rows'
    constraints, which a sampled draft follows); under draft = auto a draft model defers its prompt's prefill until
    auto brings it in."""
    spec = tree_spec(cfg, kind, target, draft) if trees else None
    if kind == "ngram":
        return NgramDrafter(cfg.ngram_min, cfg.ngram_max, spec)
    if kind == "history":
        return HistoryDrafter(store, models.output_size(target), spec)
    if kind == "mtp":
        return MtpDrafter(models.mtp_head(target), target.model, cfg.p_min, cfg.prefill_step, guide)
    if kind == "eagle3":
        return EagleDrafter(draft.model, cfg.p_min, cfg.prefill_step, spec, guide)
    if kind == "dflash":
        return DFlashDrafter(draft.model, prefill_step=cfg.prefill_step)
    return ModelDrafter(draft.model, p_min=cfg.p_min, prefill_step=cfg.prefill_step, defer=cfg.draft == "auto",
                        trees=spec, shelf=shelf(cfg, prefills, draft, "draft model", "none"), guide=guide)


def engine(cfg: Config, target: models.Loaded, draft: models.Loaded | None, batch_size: int = 1, store=None,
           keep: bool = False, prefills: prefix.Store | None = None) -> Engine:
    """The engine of a settled configuration (config.settle); `keep`: the run keeps what auto measured (a first
    run then decides by its own measurements once it has some: REBASE; one that keeps nothing stays reproducible);
    `prefills`: the kept prefills (prefix.py), a shelf for the target and each draft model."""
    store = open_history(cfg, target) if store is None else store
    trees = verifies_trees(cfg, target)
    vocab = (target.config.get("text_config") or target.config).get("vocab_size")
    guide = Guide(target.tokenizer, target.tokenizer.eos_token_ids, vocab) if vocab else None  # (built at its first use)
    if cfg.draft == "auto":
        drafter = AutoDrafter({k: source(k, cfg, target, draft, store, trees, prefills, guide) for k in cfg.sources})
        policy = auto_policy(cfg, target, draft, drafter, rebase=REBASE if keep and not runlog.disabled() else 0)
    elif cfg.draft == "none":
        drafter, policy = NoDraft(), FixedWidth(0)
    else:  # one source's width: fixed, or adaptive (the censoring-aware EMA)
        drafter = source(cfg.draft, cfg, target, draft, store, trees, prefills, guide)
        policy = EmaController(cfg.n_min, cfg.n_max, cfg.ema_alpha, cfg.ema_probe, cfg.ema_init) if cfg.adaptive \
            else FixedWidth(cfg.num_draft_tokens)
    hidden = f"taps {list(drafter.taps)}" if drafter.taps else "last" if drafter.needs_hidden else "none"
    eng = Engine(target.model, drafter, policy, target.tokenizer.eos_token_ids, decode_config(cfg), batch_size,
                 guide=guide, trees=trees, shelf=shelf(cfg, prefills, target, "target", hidden))
    if isinstance(policy, AutoPolicy):
        use_kept_costs(policy, costs_key(cfg, eng.batch_size))
    return eng


def shelf(cfg: Config, prefills: prefix.Store | None, loaded: models.Loaded, role: str, hidden: str):
    """A model's shelf of kept prefills, under the key of what makes its states valid (a head's states are the
    target's hidden states, kept with them: `hidden`); None without kept prefills."""
    return prefills and prefills.shelf(prefix.model_key(loaded.path, loaded.model, role,
                                                        f"prefill_step {cfg.prefill_step}, hidden states {hidden}"))


def _model_drafters(eng: Engine) -> list[ModelDrafter]:
    named = eng.drafter.sources if isinstance(eng.drafter, AutoDrafter) else {eng.drafter.name: eng.drafter}
    return [d for d in named.values() if isinstance(d, ModelDrafter)]


def warm(eng: Engine, tokens: list[int]) -> None:
    """After a conversation's answer: the target's and each draft model's kept state moved on to the last chunk
    boundary of `tokens` (the conversation so far; in memory under chat, else on disk at the end of the run), so that
    the next turn prefills from there; a draft model that draft = auto deferred and that has kept nothing of this
    conversation is left to join when it pays."""
    for lm in [eng.target] + [d.lm for d in _model_drafters(eng) if not d.defer or d.lm.kept(tokens)]:
        lm.warm(tokens)


REBASE = 32  # a first run that keeps its table decides by its own measurements from this cycle on (AutoPolicy)
AUTO_TREE = 16  # tree = auto: the most nodes a tree may have


def verifies_trees(cfg: Config, target: models.Loaded) -> bool:
    """Whether the target verifies draft trees: as the configuration asks, where it can (a budget refused before
    decoding by a target that cannot verify one in a pass; `auto`: chains there)."""
    kinds = set(cfg.sources if cfg.draft == "auto" else [cfg.draft])
    try:  # (MTP heads read the target's last states; EAGLE-3 and DFlash heads, tapped layers')
        cfg.tree == "off" or tree_ropes(target.model, "target model", "mtp" in kinds and not kinds & {"eagle3", "dflash"})
    except ModelError:
        if cfg.tree != "auto":
            raise
        return False
    return cfg.tree != "off"


def tree_spec(cfg: Config, kind: str, target: models.Loaded, draft: models.Loaded | None) -> Spec | None:
    """The trees a source drafts (n-gram, history, a draft model, EAGLE-3 heads; None: the others); tree = auto: where
    they pay, by the prior's cycle costs (with the draft model's size over the target's) where auto's table does not
    price them (Plan.cost)."""
    if kind not in ("ngram", "history", "model", "eagle3"):
        return None
    prior = prior_costs([kind], ratios([kind], target, draft), mx.default_device() == mx.gpu)
    return Spec(AUTO_TREE if cfg.tree == "auto" else int(cfg.tree), cfg.tree_children,
                functools.partial(prior.time, kind) if cfg.tree == "auto" else None)


def ratios(names, target: models.Loaded, draft: models.Loaded | None) -> dict[str, float]:
    """Each drafting model's size over the target's (the prior's cost of its token)."""
    return {n: _params(models.mtp_head(target) if n == "mtp" else draft.model) / _params(target.model)
            for n in names if n in ("model", "eagle3", "dflash", "mtp")}


def _params(model) -> int:
    return sum(x.size for _, x in tree_flatten(model.parameters()))


def auto_policy(cfg: Config, target: models.Loaded, draft: models.Loaded | None, drafter, rebase: int = 0) -> AutoPolicy:
    """The policy of draft = auto, with the prior from the models' sizes (use_kept_costs: this machine's table)."""
    names = list(drafter.sources)
    prior = prior_costs(names, ratios(names, target, draft), gpu=mx.default_device() == mx.gpu)
    stops = [n for n, d in drafter.sources.items() if d.stops]  # the draft model, MTP heads
    prefills = [n for n, d in drafter.sources.items() if d.defer]  # a deferred draft model
    return AutoPolicy(names, cfg.n_max, prior, drafter.available_of, widest=dict(cfg.widest), stops=stops,
                      rebase=rebase, prefills=prefills, backlog=drafter.backlogs, ends=target.tokenizer.eos_token_ids)


def costs_key(cfg: Config, batch_size: int) -> str:
    """Cycle costs are kept per target, draft model, machine, sampling (greedy or not) and batch size bucket."""
    info = mx.device_info()
    bucket = 1 << (max(batch_size, 1).bit_length() - 1)
    draft = models.canonical(cfg.draft_model) if cfg.draft_model else "-"
    return "|".join([models.canonical(str(cfg.model)), draft, platform.node(), str(mx.default_device()),
                     str(info.get("device_name", "")), "greedy" if cfg.temp == 0 else "sampled", f"B{bucket}"])


def _kept(value) -> Costs | None:
    try:
        kept = Costs.from_dict(value) if value is not None else None
    except Exception:  # noqa: BLE001 - a table of another shape: the prior instead, the log left as it is
        return None
    if kept is not None and not kept.verify:  # an earlier version's: a token's verification was in per_token
        kept.verify = prior_costs([], {}, mx.default_device() == mx.gpu).verify
        kept.per_token = {n: max(v - kept.verify * kept.step, 0.0) for n, v in kept.per_token.items()}
    return kept


def use_kept_costs(policy: AutoPolicy, key: str) -> None:
    """Decide with the table earlier runs kept under `key`, if there is one (sources it lacks: from the prior)."""
    policy.key = key
    kept = _kept(runlog.load_costs(key))
    if kept is not None:
        prior = policy.costs
        kept.per_token = {n: kept.per_token.get(n, prior.per_token[n] * kept.step) for n in policy.sources}
        kept.prefill = {**{n: v * kept.step for n, v in prior.prefill.items()}, **kept.prefill}
        policy.use(kept, warm=True)


def remember_costs(eng: Engine, log: bool = True) -> dict[str, Any] | None:
    """After a run under draft = auto: keep what it measured for the next run (see policy.Costs.settled)."""
    policy = eng.policy
    if not isinstance(policy, AutoPolicy):
        return None
    measured = policy.measured()
    info = {"sources": policy.sources, "costs": policy.costs.to_dict(), "warm": policy.warm,
            "measured": measured.to_dict() if measured else None}
    if measured is not None and log:
        def settle(current):  # against the table as it is now: another run may have changed it meanwhile
            base = _kept(current)
            if base is None:
                return measured.to_dict() if not policy.warm or current is None else None
            kept = base.settled(measured)
            return None if kept is base else kept.to_dict()
        runlog.update_costs(policy.key, settle)
    return info
