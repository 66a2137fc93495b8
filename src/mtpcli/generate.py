"""`mtpcli generate`: requests -> engine -> writer. One prompt is a batch of one; -n N is N requests of one
prompt (prefilled once); several prompts are decoded together, up to --batch-size rows, refilled as they finish.

Output in input order: text streams the first unfinished completion as it is committed and prints the later
ones whole when their turn comes (joined by --separator); jsonl prints a row per completion as soon as every
earlier row is out; json one document at the end. A prompt that cannot be used fails its own row.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from . import models
from .controller import CostAwareController, EmaController, FixedWidth
from .engine import DecodeConfig, Engine, Request
from .errors import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_RUNTIME, UsageError
from .profiles import Settings
from .prompts import Item
from .sampling import SamplingParams
from .stats import RunStats, render

TYPICAL_TAG = "[typical-accept] NOT distribution-exact;"
AUTO_N_MAX = 8  # the widest draft `auto` considers, unless n_max is set
AUTO_N_MAX_HISTORY = 16  # ... for the history when it is on (a stored answer repeated is worth long drafts)


def err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def encode_prompt(tokenizer, text: str, chat: bool | None, system: str | None) -> list[int]:
    use_chat = tokenizer.has_chat_template if chat is None else chat
    if use_chat and not tokenizer.has_chat_template:
        raise UsageError("--chat: the model's tokenizer has no chat template")
    if not use_chat:
        return list(tokenizer.encode(text))
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(templated, add_special_tokens=False))


def decode_config(s: Settings) -> DecodeConfig:
    v = s.values
    return DecodeConfig(
        sampling=SamplingParams(temp=v["temp"], top_p=v["top_p"], top_k=v["top_k"], min_p=v["min_p"]),
        max_tokens=v["max_tokens"], seed=v["seed"], typical_threshold=v["typical_threshold"],
        typical_eps=v["typical_eps"], prefill_step=v["prefill_step"],
    )


def build_controller(s: Settings, batch: int = 1):
    v = s.values
    if v["draft"] == "none":
        return FixedWidth(0, batch=batch)
    if v["adaptive"] and v["controller"] == "cost":
        return CostAwareController(v["n_min"], v["n_max"], batch=batch)
    if v["adaptive"]:
        return EmaController(v["n_min"], v["n_max"], v["ema_alpha"], v["ema_probe"], v["ema_init"], batch=batch)
    return FixedWidth(v["num_draft_tokens"], batch=batch)


def auto_sources(s: Settings, target: models.Loaded) -> list[str]:
    """Every source this run has: n-gram lookup always, the draft model when one is given, the MTP heads when the
    checkpoint has them, the history when it is on."""
    v = s.values
    return (["ngram"] + (["model"] if v["draft_model"] else []) + (["mtp"] if models.has_mtp(target) else [])
            + (["history"] if v["history"] else []))


def settle_draft(s: Settings, target: models.Loaded) -> None:
    """The ONE place draft = auto is settled. It stays the policy over every source (each cycle one source and
    a width 0..n_max) unless the width is pinned (num_draft_tokens set by a flag, the environment or a profile) or
    adaptive: then one source, the draft model when one is given, else the MTP heads, else the history when it is
    on, else n-gram lookup. --draft history turns the history on."""
    v = s.values
    if v["draft"] == "history":
        if v["history"] is False and s.origins.get("history", "default") != "default":
            raise UsageError(f"--draft history needs the history, but history is off ({s.origins['history']})")
        v["history"] = True
    if v["draft"] == "auto" and (v["adaptive"] or s.origins.get("num_draft_tokens", "default") != "default"):
        v["draft"] = ("model" if v["draft_model"] else "mtp" if models.has_mtp(target) else
                      "history" if v["history"] else "ngram")
    if v["draft"] == "auto" and s.origins.get("n_max", "default") == "default":
        v["n_max"] = AUTO_N_MAX_HISTORY if v["history"] else AUTO_N_MAX
    if v["draft"] == "model" and not v["draft_model"]:
        raise UsageError("--draft model needs --draft-model PATH_OR_ID")


def load_models(s: Settings) -> tuple[models.Loaded, models.Loaded | None]:
    target = models.load(s.values["model"], "target model")
    settle_draft(s, target)
    draft = None
    if s.values["draft"] == "model" or (s.values["draft"] == "auto" and s.values["draft_model"]):
        draft = models.load(s.values["draft_model"], "draft model")
        models.check_pair(target, draft)
    return target, draft


def open_history(s: Settings, target: models.Loaded, keep_prompts: bool = False):
    """The history store of this tokenizer (history.Store; the history drafter reads it); None when it is off."""
    from . import history

    v = s.values
    if not v["history"]:
        return None
    return history.Store(history.tokenizer_key(target.tokenizer), str(v["model"]),
                         max(1, int(v["history_max_mb"] * (1 << 20))), keep_prompts)


def build_engine(s: Settings, target: models.Loaded, draft: models.Loaded | None, batch_size: int = 1,
                 store=None) -> Engine:
    from .drafters import NoDraft
    from .drafters.model import ModelDrafter
    from .drafters.mtp import MtpDrafter
    from .drafters.ngram import NgramDrafter

    from .drafters.auto import AutoDrafter
    from .drafters.history import HistoryDrafter

    v = s.values
    if v["history"] and store is None:
        store = open_history(s, target)

    def source(kind):
        if kind == "none":
            return NoDraft()
        if kind == "ngram":
            return NgramDrafter(v["ngram_min"], v["ngram_max"])
        if kind == "history":
            return HistoryDrafter(store, models.output_size(target))
        if kind == "mtp":
            return MtpDrafter(models.mtp_head(target), target.model, p_min=v["p_min"], prefill_step=v["prefill_step"])
        return ModelDrafter(draft.model, p_min=v["p_min"], prefill_step=v["prefill_step"])

    if v["draft"] == "auto":
        names = auto_sources(s, target)
        if "mtp" in names and len(names) > 1 and batch_size > 1 and not _one_row(target):
            names.remove("mtp")  # MTP heads draft one row at a time: several rows go without them (--draft mtp)
        drafter = AutoDrafter({k: source(k) for k in names})
        controller = auto_policy(s, target, draft, drafter)
    else:
        drafter, controller = source(v["draft"]), build_controller(s)
    engine = Engine(target.model, drafter, controller, target.tokenizer.eos_token_ids, decode_config(s), batch_size)
    engine.controller.batch = engine.batch_size
    if v["draft"] == "auto":
        use_kept_costs(controller, costs_key(s, engine.batch_size))
    return engine


def _one_row(target: models.Loaded) -> bool:
    """A target whose cache decodes one row at a time anyway (recurrent or opaque layers)."""
    from mlx_lm.models.cache import make_prompt_cache

    from .cache import layer_kind

    return any(layer_kind(c) in ("state", "native") for c in make_prompt_cache(target.model))


def _params(model) -> int:
    from mlx.utils import tree_flatten

    return sum(x.size for _, x in tree_flatten(model.parameters()))


def costs_key(s: Settings, batch_size: int) -> str:
    """Cycle costs are kept per target, draft model, machine, sampling (greedy or not) and batch size bucket."""
    import platform

    import mlx.core as mx

    v = s.values
    info = mx.device_info()
    bucket = 1 << (max(batch_size, 1).bit_length() - 1)
    return "|".join([str(v["model"]), str(v["draft_model"] or "-"), platform.node(), str(mx.default_device()),
                     str(info.get("device_name", "")), "greedy" if v["temp"] == 0 else "sampled", f"B{bucket}"])


def auto_policy(s: Settings, target: models.Loaded, draft: models.Loaded | None, drafter):
    """The policy of draft = auto, with the prior from the models' sizes (use_kept_costs: this machine's table)."""
    import mlx.core as mx

    from .policy import AutoPolicy, prior_costs

    names = list(drafter.sources)
    ratio = {}
    if "model" in names:
        ratio["model"] = _params(draft.model) / _params(target.model)
    if "mtp" in names:
        ratio["mtp"] = _params(models.mtp_head(target)) / _params(target.model)
    prior = prior_costs(names, ratio, gpu=mx.default_device() == mx.gpu)
    widest = {}  # the history's default widest draft (16) is for the history: the other sources keep theirs
    if "history" in names and s.origins.get("n_max", "default") == "default":
        widest = {n: AUTO_N_MAX for n in names if n != "history"}
    stops = [n for n, d in drafter.sources.items() if hasattr(d, "floor")]  # the draft model, MTP heads
    policy = AutoPolicy(names, s.values["n_max"], prior, drafter.available, widest=widest, stops=stops)
    drafter.floor = policy.floor
    return policy


def _kept(value) -> "Costs | None":
    from .policy import Costs

    try:
        return Costs.from_dict(value) if value is not None else None
    except Exception:  # noqa: BLE001 - a table of another shape: the prior instead, the log left as it is
        return None


def use_kept_costs(policy, key: str) -> None:
    """Decide with the table earlier runs kept under `key`, if there is one (sources it lacks: from the prior)."""
    from . import runlog

    policy.key = key
    kept = _kept(runlog.load_costs(key))
    if kept is not None:
        prior = policy.costs
        kept.per_token = {n: kept.per_token.get(n, prior.per_token[n] * kept.plain) for n in policy.sources}
        policy.use(kept, warm=True)


def remember_costs(engine: Engine, log: bool = True) -> dict[str, Any] | None:
    """After a run under draft = auto: keep what it measured for the next run (see policy.Costs.settled)."""
    from . import runlog
    from .policy import AutoPolicy

    policy = engine.controller
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


def default_batch_size(config: dict, n: int, tokens_per_row: int) -> int:
    """All rows at once, unless their KV caches would take more than a quarter of the memory."""
    cfg = config.get("text_config") or config
    layers = cfg.get("num_hidden_layers", 32)
    heads = cfg.get("num_attention_heads", 32)
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 4096) // heads
    per_token = 2 * layers * kv * head_dim * 4  # keys and values, float32 at worst
    try:
        import mlx.core as mx

        memory = mx.device_info()["memory_size"]
    except Exception:  # noqa: BLE001 - any backend that cannot say: assume 16 GiB
        memory = 16 << 30
    per_row = per_token * tokens_per_row * 2  # x2: rejected drafts are holes until compaction
    return max(1, min(n, memory // 4 // max(per_row, 1)))


def settings_record(s: Settings, law: str) -> dict[str, Any]:
    v = s.values
    return {
        "profile": s.profile, "model": v["model"], "draft_model": v["draft_model"], "draft": v["draft"],
        "law": law, "num_draft_tokens": v["num_draft_tokens"], "adaptive": v["adaptive"], "n_min": v["n_min"],
        "n_max": v["n_max"], "p_min": v["p_min"], "temp": v["temp"], "top_p": v["top_p"], "top_k": v["top_k"],
        "min_p": v["min_p"], "seed": v["seed"], "max_tokens": v["max_tokens"],
        "typical_threshold": v["typical_threshold"], "typical_eps": v["typical_eps"], "history": v["history"],
    }


# ---- writers ----------------------------------------------------------------------------------------------------

class Output:
    """Writes generated text (or JSON) to stdout; detects a closed pipe."""

    def __init__(self, out: TextIO):
        self.out = out
        self.closed = False

    def write(self, text: str) -> None:
        if self.closed or not text:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            self.closed = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.out.fileno())  # so the interpreter's own flush at exit stays quiet


@dataclass
class Completion:
    index: int
    item: Item
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: RunStats | None = None
    text: str = ""

    def row(self, source: bool) -> dict[str, Any]:
        head = {"index": self.index, **({"source": self.item.source} if source else {})}
        if self.item.error:
            return {**head, "error": self.item.error}
        return {**head, "text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict() if self.stats else None}


class Writer:
    """Completions in input order: the first unfinished one streams (text), later ones wait their turn."""

    def __init__(self, fmt: str, output: Output, tokenizer, completions: list[Completion], separator: str,
                 source: bool, runs: dict):
        self.fmt, self.output, self.tok, self.rows, self.runs = fmt, output, tokenizer, completions, runs
        self.separator, self.source = separator, source
        self.detok = tokenizer.detokenizer
        self.next = 0  # the first completion not yet fully written
        self.started = False  # rows[next] has begun (text: its separator is out)
        self.streamed = 0  # tokens of rows[next] given to the detokenizer

    def event(self, index: int, tokens: list[int], finish: str | None) -> None:
        c = self.rows[index]
        c.tokens.extend(tokens)
        c.finish_reason = finish or c.finish_reason
        self.flush()

    @staticmethod
    def _done(c: Completion) -> bool:
        return c.item.error is not None or c.finish_reason is not None

    def flush(self) -> None:
        while self.next < len(self.rows) and not self.output.closed:
            c = self.rows[self.next]
            if self.fmt == "text":
                if not self.started:
                    self.output.write(self.separator if self.next else "")
                    self.started, self.streamed = True, 0
                for t in c.tokens[self.streamed:]:
                    self.detok.add_token(t)
                self.streamed = len(c.tokens)
                if self._done(c):
                    self.detok.finalize()
                self.output.write(self.detok.last_segment)
            if not self._done(c):
                return
            c.text = "" if c.item.error else self.tok.decode(c.tokens)
            c.stats = self.runs.get(c.index)
            if self.fmt == "jsonl":
                self.output.write(json.dumps(c.row(self.source)) + "\n")
            self.detok.reset()
            self.next, self.started = self.next + 1, False

    def close(self) -> None:
        """Interrupted rows end with what they committed."""
        for c in self.rows:
            if not self._done(c):
                c.finish_reason = "interrupted"
        self.flush()
        if self.fmt == "text":
            self.output.write("\n")


# ---- the run ----------------------------------------------------------------------------------------------------

def requests_for(s: Settings, items: list[Item], single: bool, n: int, tokenizer, limit: int | None):
    """Encode every usable prompt; (completions, requests). -n N makes N requests of one prompt and seed."""
    v = s.values
    completions, requests = [], []
    for it in items:
        if it.error is None and not (it.text or "").strip():
            it.error = f"empty prompt ({it.source})" if single else f"{it.source}: empty prompt"
        ids = None
        if it.error is None:
            ids = encode_prompt(tokenizer, it.text, v["chat"], v["system"])
            if limit and len(ids) >= limit:
                it.error = (("" if single else f"{it.source}: ") +
                            f"prompt is {len(ids)} tokens, longer than the model's context of {limit} tokens")
        if it.error and single:
            raise UsageError(it.error)
        seed = it.seed if it.seed is not None else v["seed"] + (0 if single else it.index)
        for c in range(n):
            completions.append(Completion(len(completions), it))
            if ids is not None:
                requests.append(Request(completions[-1].index, ids, it.max_tokens or v["max_tokens"], seed, c))
    return completions, requests


def run(s: Settings, items: list[Item], single: bool, n: int, quiet: bool, stats_json: str | None, separator: str,
        argv: list[str], batch_size: int | None = None, out: TextIO = None, log: bool = True,
        log_prompts: bool = False) -> int:
    v = s.values
    from . import distributed

    dist = distributed.setup(s, several=len(items) * n > 1)  # under mlx.launch: the group, else None
    sharded = dist is not None and dist.mode != "data"
    if dist is not None and not dist.root:  # only rank 0 writes the statistics file and the run log
        stats_json, log = None, False
    target, draft = distributed.load_models(dist, s) if sharded else load_models(s)
    completions, requests = requests_for(s, items, single, n, target.tokenizer, models.max_context(target.config))
    for c in completions:
        if c.item.error:
            err(f"mtpcli: row {c.index}: {c.item.error}")
    longest = max((len(r.prompt) + r.max_tokens for r in requests), default=1)
    size = batch_size or default_batch_size(target.config, max(len(requests), 1), longest)
    size = min(size, max(len(requests), 1))
    # the history drafts wherever a drafter runs (rank 0 of a sharded target; every rank of data mode), and only
    # rank 0, which sees every completion, keeps the outputs
    root = dist is None or dist.root
    store = open_history(s, target, log_prompts) if root or not sharded else None
    engine = (distributed.sharded_engine(dist, s, target, draft, size, store) if sharded
              else build_engine(s, target, draft, size, store))
    prompts = {r.index: r.prompt for r in requests}
    law = engine.cfg.law
    blas_hint(quiet)
    if law == "typical":
        err(f"{TYPICAL_TAG} threshold={v['typical_threshold']} eps={v['typical_eps']}")
    if len(requests) > 1 and engine.batch_size == 1 and (batch_size or size) > 1:
        mtp = v["draft"] == "mtp" or "mtp" in getattr(engine.drafter, "sources", {})
        why = "MTP heads draft" if mtp else "the target or draft model keeps recurrent state and"
        err(f"mtpcli: note: {why} one sequence at a time; decoding the prompts one after another")
    output = Output(out or sys.stdout)
    writer = Writer(v["format"], output, target.tokenizer, completions, separator, not single, engine.runs)
    started, t0 = time.time(), time.perf_counter()
    status = 0
    try:
        for ev in distributed.events(dist, engine, requests) if dist else engine.generate(requests):
            writer.event(ev.request, ev.tokens, ev.finish_reason)
            if store is not None and ev.finish_reason:  # it drafts for the rest of the run, and is kept
                store.add(prompts[ev.request], completions[ev.request].tokens)
            if output.closed:
                break
    except KeyboardInterrupt:
        status = EXIT_INTERRUPTED
    for c in completions:
        c.stats = engine.runs.get(c.index)
    writer.close()
    wall = time.perf_counter() - t0
    total = RunStats.total([c.stats for c in completions if c.stats])
    failed = sum(1 for c in completions if c.item.error)
    record = {**total.to_dict(), "settings": settings_record(s, law)}
    if store is not None and root:
        store.save()
    auto = remember_costs(engine, log)
    if auto:
        record["auto"] = auto
    if dist is not None:
        record["distributed"] = dist.record(engine.cycles)
        if dist.root and dist.extra.get("failed_ranks") and status == 0:
            status = EXIT_RUNTIME
    if not single or n > 1:
        record["batch"] = {"prompts": len(items), "failed": failed, "batch_size": engine.batch_size,
                           "cycles": engine.cycles, "tokens": total.generated_tokens, "wall_s": wall,
                           "throughput_tok_s": total.generated_tokens / wall if wall > 0 else 0.0,
                           "batched": engine.batch_size > 1}
    if v["format"] == "json":
        doc = completions[0].row(False) if "batch" not in record else {
            "completions": [c.row(not single) for c in completions], "stats": total.to_dict(), "batch": record["batch"]}
        output.write(json.dumps({**doc, "settings": record["settings"],
                                 **({"auto": record["auto"]} if "auto" in record else {}),
                                 **({"distributed": record["distributed"]} if "distributed" in record else {})}) + "\n")
    if output.closed:
        status = EXIT_PIPE
    b = record.get("batch")
    extra = "" if b is None or single else (
        f"batch: {len(items)} prompts ({failed} failed), batch size {b['batch_size']}, {b['cycles']} cycles, "
        f"{total.generated_tokens} tokens in {wall:.2f} s: {b['throughput_tok_s']:.2f} tok/s in all")
    title = f"mtpcli · {s.profile} · {law}" + ("" if single else f" · {len(items)} prompts")
    report(total, record, quiet, stats_json, title, extra)
    if status == EXIT_INTERRUPTED:
        err(f"mtpcli: interrupted after {total.generated_tokens} tokens")
    if output.closed:
        err(f"mtpcli: stdout was closed; stopped after {total.generated_tokens} tokens")
    if failed and status == 0:
        err(f"mtpcli: {failed} of {len(items)} prompts failed (see their rows)")
        status = EXIT_RUNTIME
    from . import runlog

    runlog.append_safely(
        command=argv, settings=record["settings"], profile=s.profile, model=v["model"],
        draft=v["draft_model"] or v["draft"], prompt=[t for r in requests[:1] for t in r.prompt] if single else
        [t for r in requests for t in r.prompt], stats=record, status=status, started=started,
        prompt_text=items[0].text if log_prompts and single else None, log=log)
    return status


def blas_hint(quiet: bool) -> None:
    """Once per cache folder, never with --quiet: MLX's slow reference BLAS is in use."""
    if quiet or not os.environ.get("MTPCLI_BLAS_HINT"):
        return
    from .gguf_convert import cache_dir

    marker = cache_dir() / "blas-hint-shown"
    if marker.exists():
        return
    err("mtpcli: note: MLX uses its slow reference BLAS here; installing OpenBLAS (Debian/Ubuntu: "
        "apt-get install libopenblas0-pthread) makes CPU decoding ~2-3x faster, and mtpcli preloads it itself")
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass


def report(total: RunStats, record: dict, quiet: bool, stats_json: str | None, title: str, extra: str = "") -> None:
    """The end of a run on stderr (and --stats-json): the statistics, then the typical-acceptance summary."""
    if stats_json:
        try:
            Path(stats_json).write_text(json.dumps(record, indent=1) + "\n")
        except OSError as e:
            err(f"mtpcli: warning: --stats-json {stats_json}: {e.strerror or e}")
    if not quiet:
        render(total, sys.stderr, sys.stderr.isatty(), title=title)
        if extra:
            err(extra)
        if record.get("distributed"):
            from .distributed import describe

            err(describe(record["distributed"]))
    if total.typical is not None:
        t = total.typical_summary()
        err(f"{TYPICAL_TAG} positions={t['positions']} accepted={t['accepted']} resamples={t['resamples']} "
            f"accept_rate={t['accept_rate']:.3f} mean_entropy={t['mean_entropy']:.3f} "
            f"tokens_per_cycle={total.tokens_per_cycle:.3f}")
