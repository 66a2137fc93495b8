"""`mtpcli generate`: requests -> engine -> writers. `run` reads as the steps: the group, the models, the requests, the
settled configuration, the engine, the decoding, the record, the report, the run log."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx

from . import assemble, config, constrain, distributed, eagle, models, prefix, runlog
from .distributed import sharded
from .engine import Request
from .errors import EXIT_INTERRUPTED, EXIT_IO, EXIT_PIPE, EXIT_RUNTIME, EXIT_TERMINATED, MtpError, UsageError
from .fetch import cache_dir
from .costs import PRIOR_ACCEPT, Costs
from .prompts import Item
from .stats import RunStats
from .tables import render, status as working
from .writers import Completion, Writer, check_writable, write_file

TYPICAL_TAG = "[typical-accept] NOT distribution-exact;"
CHARS_PER_TOKEN = 8  # a prompt longer than this many characters per token of context is counted on a prefix first
MANY = 16  # -n above this: a note that -n counts completions (llama-cli's -n counts tokens)


@dataclass(frozen=True)
class Options:
    """What the command line says beyond the settings."""
    single: bool = True  # one prompt (its failure is a usage error), not several rows
    n: int = 1  # completions of the one prompt (-n)
    quiet: bool = False
    stats_json: str | None = None
    separator: str = "\n\n"
    argv: tuple = ()
    batch_size: int | None = None
    log: bool = True
    log_prompts: bool = False
    conversation: Any = None  # conversation.Conversation: its turns go before the prompt, and this turn is added
    turn: dict | None = None  # mtpcli chat: given the turn's record (for /stats)


def err(msg: str) -> None:
    with contextlib.suppress(BrokenPipeError):  # a closed stderr: nothing to tell, the run goes on to its log
        print(msg, file=sys.stderr, flush=True)


def chat_on(tokenizer, chat: bool | None) -> bool:
    return tokenizer.has_chat_template if chat is None else chat


def typical_line(cfg: config.Config) -> str | None:
    """The typical law's warning, for every run that sets it (at T = 0 it changes nothing, and says so)."""
    if cfg.typical_threshold > 0:
        noop = " a no-op at temp 0 (greedy);" if cfg.temp == 0 else ""
        return f"{TYPICAL_TAG}{noop} threshold={cfg.typical_threshold} eps={cfg.typical_eps}"
    return None


def encode_prompt(tokenizer, text: str, chat: bool | None, system: str | None,
                  earlier: list | None = None) -> list[int]:
    """The prompt's tokens; with EARLIER (a conversation's messages) the whole conversation, through the template."""
    use_chat = chat_on(tokenizer, chat)
    if use_chat and not tokenizer.has_chat_template:
        raise UsageError("--chat: the model's tokenizer has no chat template")
    if earlier is not None and not use_chat:
        raise UsageError("a conversation needs the chat template: " + ("--no-chat is set" if chat is False else
                                                                      "the model's tokenizer has none"))
    if not use_chat:
        return list(tokenizer.encode(text))
    messages = ([{"role": "system", "content": system}] if system else []) + (earlier or []) + [
        {"role": "user", "content": text}]
    templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(templated, add_special_tokens=False))


def settled(tokenizer, cfg: config.Config, messages: list[dict[str, str]]) -> list[int]:
    """The tokens of a conversation (its MESSAGES) up to the next user message's text (the same whatever that says)."""
    a, b = (encode_prompt(tokenizer, x, cfg.chat, cfg.system, messages) for x in ("a", "b"))
    return a[: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))]


def requests_for(cfg: config.Config, items: list[Item], opts: Options, tokenizer, limit: int | None,
                 grammar: str | None = None):
    """Encode every usable prompt; (completions, requests, notes). -n N makes N requests of one prompt and seed;
    max_tokens is capped where the prompt and its answer would not fit in the context (a note per row); `grammar`:
    the run's constraint, unless a JSONL row has its own schema. A prompt
    far longer than the context in characters is refused on a prefix's count, before the whole is tokenized."""
    completions, requests, said = [], [], []
    if cfg.system and not chat_on(tokenizer, cfg.chat):
        said.append("mtpcli: warning: --system is not used: " + ("--no-chat" if cfg.chat is False else
                                                                 "the model's tokenizer has no chat template"))
    for it in items:
        where = "" if opts.single else f"{it.source}: "  # several prompts: a line names its own
        if it.error is None and not (it.text or "").strip():
            it.error = f"empty prompt ({it.source})" if opts.single else f"{where}empty prompt"
        if it.error is None and limit and len(it.text) > CHARS_PER_TOKEN * limit:
            if (n := len(tokenizer.encode(it.text[: CHARS_PER_TOKEN * limit]))) >= limit:
                it.error = (f"{where}prompt is at least {n} tokens (in its first {CHARS_PER_TOKEN * limit} of "
                            f"{len(it.text)} characters), longer than the model's context of {limit} tokens")
        earlier = opts.conversation.messages() if opts.conversation is not None else None
        ids = encode_prompt(tokenizer, it.text, cfg.chat, cfg.system, earlier) if it.error is None else None
        if ids == []:  # (a tokenizer that knows none of the text: nothing to decode from)
            it.error, ids = f"{where}the model's tokenizer encodes the prompt to no tokens", None
        if ids is not None and limit and len(ids) >= limit:
            it.error = f"{where}prompt is {len(ids)} tokens, longer than the model's context of {limit} tokens"
        if it.error and opts.single:
            raise UsageError(it.error)
        seed = it.seed if it.seed is not None else (cfg.seed + (0 if opts.single else it.index)) % config.SEEDS
        asked = it.max_tokens or cfg.max_tokens
        room = asked if ids is None or not limit else min(asked, limit - len(ids))
        if room < asked:
            said.append(f"mtpcli: note: {where}max_tokens {asked} capped at {room}: the prompt's {len(ids)} tokens "
                        f"and the answer fill the model's context of {limit} tokens")
        for c in range(opts.n):
            completions.append(Completion(len(completions), it))
            if ids is not None:
                requests.append(Request(completions[-1].index, ids, room, seed, c, it.grammar or grammar))
    return completions, requests, said


def batch_size(model_config: dict, requests: list[Request], asked: int | None) -> int:
    """--batch-size, else all rows at once unless their KV caches would take more than a quarter of the memory."""
    n = max(len(requests), 1)
    if asked:
        return min(asked, n)
    tokens_per_row = max((len(r.prompt) + r.max_tokens for r in requests), default=1)
    cfg = model_config.get("text_config") or model_config
    heads = cfg.get("num_attention_heads", 32)
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 4096) // heads
    per_token = 2 * cfg.get("num_hidden_layers", 32) * kv * head_dim * 4  # keys and values, float32 at worst
    try:
        memory = mx.device_info()["memory_size"]
    except Exception:  # noqa: BLE001 - any backend that cannot say: assume 16 GiB
        memory = 16 << 30
    per_row = per_token * tokens_per_row * 2  # x2: rejected drafts are holes until compaction
    return max(1, min(n, memory // 4 // max(per_row, 1)))


def decode(group, engine, requests: list[Request], writer: Writer, store) -> int:
    """The event loop: every event to the writer, every finished completion to the history store."""
    prompts = {r.index: r.prompt for r in requests}
    try:
        for ev in group.events(engine, requests):
            writer.event(ev.request, ev.tokens, ev.finish_reason)
            if ev.incomplete:
                where = f"{writer.rows[ev.request].item.source}: " if writer.source else ""
                err(f"mtpcli: error: {where}max_tokens was reached before the value was complete: the answer does not "
                    "match the constraint")
            if store is not None and ev.finish_reason:  # it drafts for the rest of the run, and is kept
                store.add(prompts[ev.request], writer.rows[ev.request].tokens)
            if writer.closed:
                break
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (cli.main raises it with EXIT_TERMINATED)
        return EXIT_TERMINATED if e.args == (EXIT_TERMINATED,) else EXIT_INTERRUPTED
    return 0


def draft_head(cfg: config.Config, group) -> str | None:
    """The kind of trained head --draft-model is, if it is one (from its config.json): under a sharded target, where
    the draft lives on rank 0, rank 0 reads it and tells the others, so that every rank settles alike."""
    if not (cfg.draft_model and cfg.draft in config.DRAFTED):
        return None
    if not group.sharded:
        return eagle.kind(models.resolve(cfg.draft_model))
    kinds, failed = [None, *models.HEADS], None
    try:  # (a failure is told too: the others end with its name, not a lost-connection error)
        code = kinds.index(eagle.kind(models.resolve(cfg.draft_model))) if group.root else 0
    except MtpError as e:
        code, failed = len(kinds), e
    code = group.bcast([code], 1, "the draft's kind")[0]
    group.watchdog.disarm()  # (no deadline while rank 0 loads the draft)
    if failed is not None:
        raise failed
    if code == len(kinds):
        raise models.ModelError(f"--draft-model '{cfg.draft_model}': rank 0 could not read it (its error is rank 0's)")
    return kinds[code]


def run(cfg: config.Config, items: list[Item], opts: Options) -> int:
    grammar = constrain.of_config(cfg)  # a bad schema or grammar: one line before any model loads
    group = distributed.setup(cfg, several=len(items) * opts.n > 1)  # under mlx.launch: the group, else Solo
    if not group.root:  # only rank 0 writes the statistics file and the run log
        opts = replace(opts, stats_json=None, log=False)
    if opts.stats_json:  # before the work
        check_writable("--stats-json", opts.stats_json)
    loading = time.perf_counter()
    with working(f"loading target model {cfg.model} ...", opts.quiet):  # (a terminal's only sign of life meanwhile)
        target = sharded.load_target(cfg.model, group.mode, group.group) if group.sharded else \
            models.load(cfg.model, "target model")
    load_s = time.perf_counter() - loading
    head = draft_head(cfg, group)
    completions, requests, said = requests_for(cfg, items, opts, target.tokenizer, models.max_context(target.config),
                                               grammar)
    for c in completions:
        if c.item.error:
            err(f"mtpcli: row {c.index}: {c.item.error}")
    size = batch_size(target.config, requests, opts.batch_size)
    cfg = config.settle(cfg, models.has_mtp(target), several_rows=size > 1 and not models.one_row(target),
                        sharded=group.sharded, head=head)
    draft = None  # a sharded target's draft model: on rank 0 (after settle: a head over one is refused, not built)
    if cfg.draft_model and cfg.draft in config.DRAFTED and (group.root or not group.sharded):
        loading = time.perf_counter()
        with working(f"loading draft model {cfg.draft_model} ...", opts.quiet):
            draft = models.load_draft(cfg.draft_model, target, lazy=cfg.draft == "auto")  # (auto defers it)
        load_s += time.perf_counter() - loading
    # the history drafts wherever a drafter runs (rank 0 of a sharded target; every rank of data mode), and only
    # rank 0, which sees every completion, keeps the outputs
    store = assemble.open_history(cfg, target, opts.log_prompts) if group.root or not group.sharded else None
    kept = prefix.Store(cfg.prefill_cache_mb, disk=cfg.prefill_cache) \
        if (cfg.prefill_cache or prefix.MEMORY is not None) and not group.sharded else None  # (chat: in memory)
    engine = sharded.engine(group, cfg, target, draft, size, store, opts.log) if group.sharded else \
        assemble.engine(cfg, target, draft, size, store, keep=opts.log, prefills=kept)
    if cfg.prefill_cache and group.sharded and group.root and not opts.quiet:  # (its ranks would have to agree)
        err(f"mtpcli: note: a sharded target (--distributed {group.mode}) does not keep prefills; the prompt is "
            "prefilled in full")
    notes(cfg, engine, requests, opts, size, said)
    writer = Writer(cfg.format, sys.stdout, target.tokenizer, completions, opts.separator, not opts.single,
                    engine.runs)
    started, t0 = time.time(), time.perf_counter()
    status = decode(group, engine, requests, writer, store)
    writer.close()
    total, record = summarize(cfg, group, engine, items, completions, opts, time.perf_counter() - t0, load_s)
    if kept is not None and opts.conversation is not None and not items[0].error and not writer.closed:
        try:  # the next turn starts where this answer ends: the conversation's states moved on to its last boundary
            assemble.warm(engine, settled(target.tokenizer, cfg, opts.conversation.messages() + [
                {"role": "user", "content": items[0].text}, {"role": "assistant", "content": completions[0].text}]))
        except KeyboardInterrupt:  # (this turn is kept all the same)
            status = EXIT_INTERRUPTED
    if kept is not None:  # (after the output)
        kept.flush()
    if store is not None and group.root:
        store.save()
    if auto := assemble.remember_costs(engine, opts.log):
        record["auto"] = auto
    if group.root and record.get("distributed", {}).get("failed_ranks") and status == 0:
        status = EXIT_RUNTIME
    if cfg.format == "json":
        doc = completions[0].row(False) if "batch" not in record else {
            "completions": [c.row(not opts.single) for c in completions], "stats": total.to_dict(),
            "batch": record["batch"]}
        doc.update({k: record[k] for k in ("settings", "auto", "distributed") if k in record})
        writer.write(json.dumps(doc) + "\n")
    status = (EXIT_IO if writer.failed else EXIT_PIPE) if writer.closed else status
    if report(cfg, total, record, opts, len(items)) and status == 0:  # --stats-json was not written
        status = EXIT_RUNTIME
    if group.root and (why := idle_draft_model(cfg, record)):  # (after the table, which shows the sources' shares)
        err(why)
    failed = sum(1 for c in completions if c.item.error)
    if status in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        how = "terminated" if status == EXIT_TERMINATED else "interrupted"
        err(f"mtpcli: {how} after {total.generated_tokens} tokens")
    if writer.closed:
        err(f"mtpcli: error: stdout: {writer.failed}; stopped after {total.generated_tokens} tokens" if writer.failed
            else f"mtpcli: stdout was closed; stopped after {total.generated_tokens} tokens")
    if engine.incomplete and status == 0:  # (each said so on its own line)
        status = EXIT_RUNTIME
    if failed and status == 0:
        err(f"mtpcli: {failed} of {len(items)} prompts failed (see their rows)")
        status = EXIT_RUNTIME
    logged = runlog.append_safely(
        command=opts.argv, settings=record["settings"], profile=cfg.profile,
        model=models.canonical(cfg.model),  # a local folder: its absolute path, from any folder
        draft=models.canonical(cfg.draft_model) if cfg.draft_model else cfg.draft, stats=record, status=status,
        started=started, prompt=[t for r in requests[: 1 if opts.single else None] for t in r.prompt],
        prompt_text=items[0].text if opts.log_prompts and opts.single else None, log=opts.log)
    if opts.conversation is not None and not items[0].error and not writer.closed:  # (an answer the user saw)
        opts.conversation.add(items[0].text, completions[0].text, logged)
    if opts.turn is not None:
        opts.turn.update(record=record, status=status)
    return status


def notes(cfg: config.Config, engine, requests: list[Request], opts: Options, size: int, said: list[str]) -> None:
    """What a user should know before the output: MLX's slow reference BLAS (once per cache folder, never with
    --quiet), what requests_for said (answers capped at the context, --system unused), the typical law's warning,
    what -n counts, a --batch-size that does nothing, rows decoded one after another."""
    for line in said:
        err(line)
    marker = cache_dir() / "blas-hint-shown"
    if os.environ.get("MTPCLI_BLAS_HINT") and not opts.quiet and not marker.exists():
        err("mtpcli: note: MLX uses its slow reference BLAS here; MKL (pip install mkl, on x86-64) or OpenBLAS "
            "(apt-get install libopenblas0-pthread) makes CPU decoding ~2-3x faster, and mtpcli loads it itself")
        with contextlib.suppress(OSError):
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
    if line := typical_line(cfg):
        err(line)
    if opts.n > MANY:
        err(f"mtpcli: note: -n {opts.n} decodes {opts.n} completions of the prompt (--max-tokens sets the tokens of "
            f"each; llama-cli's -n is a token count)")
    if opts.batch_size and opts.single and opts.n == 1:
        err("mtpcli: warning: --batch-size has no effect on one prompt and one completion (one row)")
    if len(requests) > 1 and engine.batch_size == 1 and size > 1:
        why = "MTP heads draft" if "mtp" in cfg.sources else "the target or draft model keeps recurrent state and"
        err(f"mtpcli: note: {why} one sequence at a time; decoding the prompts one after another")


def idle_draft_model(cfg: config.Config, record: dict) -> str | None:
    """Under draft = auto, why a --draft-model drafted in none or few (< 10%) of the cycles: one line with the
    figures the policy weighed (a draft token's cost against a target step, its acceptance); None otherwise."""
    auto = record.get("auto") or {}
    if not cfg.draft_model or "model" not in auto.get("sources", ()) or not record.get("cycles"):
        return None
    cycles, used = record["cycles"], (record.get("sources") or {}).get("model", {})
    drafted = used.get("cycles", 0)
    if drafted >= 0.1 * cycles:
        return None
    measured = Costs.from_dict(auto["measured"]) if auto.get("measured") else None
    costs = Costs.from_dict(auto["costs"])
    if measured is not None and "model" in measured.per_token:
        table, where = measured, "measured in this run"
    else:
        table = costs
        where = "from this machine's kept cost table" if auto.get("warm") else "a prior from the models' sizes"
    step = table.step
    cost = f"{(table.time('model', 1) - step - table.fixed.get('model', 0.0)) / step:.0%} of a target step"
    if table.fixed.get("model"):
        cost += f", and {table.fixed['model'] / step:.0%} of one a cycle to catch up"
    if used.get("drafted"):
        accept = f"{used['acceptance_rate']:.0%} of its tokens accepted in this run"
    elif costs.accept.get("model"):
        accept = f"a first token accepted {costs.accept['model'][0]:.0%} of the time (kept)"
    else:
        accept = f"acceptance unmeasured (assumed {PRIOR_ACCEPT:.0%})"
    if not record.get("draft_prefill_tokens") and table.prefill.get("model"):  # it never came in (deferred)
        accept += (f"; it never prefilled the prompt's {record['prompt_tokens']} tokens "
                   f"({table.prefill['model'] / step:.0%} of a step each: auto brings it in only where the rest of "
                   "the answer pays that back)")
    return (f"mtpcli: note: draft model {cfg.draft_model} drafted in {drafted} of {cycles} cycles: draft = auto found "
            f"it did not pay, a draft token costing {cost} ({where}), {accept}; "
            f"--draft model uses it in every cycle")


def summarize(cfg, group, engine, items, completions, opts: Options, wall: float,
              load_s: float | None = None) -> tuple[RunStats, dict]:
    """The run's totals and the record kept of it (run log, --stats-json); `load_s`: loading the models."""
    total = RunStats.total([c.stats for c in completions if c.stats])
    total.load_s = load_s
    record: dict[str, Any] = {**total.to_dict(), "settings": cfg.record(opts.log_prompts)}
    if (dist := group.record(engine.cycles)) is not None:
        record["distributed"] = dist
    if not opts.single or opts.n > 1:
        record["batch"] = {"prompts": len(items), "failed": sum(1 for c in completions if c.item.error),
                           "batch_size": engine.batch_size, "cycles": engine.cycles, "tokens": total.generated_tokens,
                           "wall_s": wall, "throughput_tok_s": total.generated_tokens / wall if wall > 0 else 0.0,
                           "batched": engine.batch_size > 1}
    return total, record


def report(cfg: config.Config, total: RunStats, record: dict, opts: Options, prompts: int) -> int:
    """The end of a run on stderr: the statistics, the batch's and the group's lines, the typical-acceptance
    summary; --stats-json first (written whole or not at all: its failure is one line and a non-zero return), so
    that a closed stderr loses no file."""
    code = 0
    try:
        if opts.stats_json:
            write_file("--stats-json", opts.stats_json, json.dumps(record, indent=1) + "\n")
    except MtpError as e:
        err(f"mtpcli: error: {e}")
        code = e.exit_code
    if not opts.quiet:
        title = f"mtpcli · {cfg.profile} · {cfg.law}" + ("" if opts.single else f" · {prompts} prompts")
        with contextlib.suppress(BrokenPipeError):  # (a closed stderr: the run still ends and is logged)
            render(record, sys.stderr, sys.stderr.isatty(), title=title)
        if (b := record.get("batch")) and not opts.single:
            err(f"batch: {prompts} prompts ({b['failed']} failed), batch size {b['batch_size']}, {b['cycles']} "
                f"cycles, {b['tokens']} tokens in {b['wall_s']:.2f} s: {b['throughput_tok_s']:.2f} tok/s in all")
        if record.get("distributed"):
            err(distributed.describe(record["distributed"]))
    if total.typical is not None:
        t = total.typical_summary()
        err(f"{TYPICAL_TAG} positions={t['positions']} accepted={t['accepted']} resamples={t['resamples']} "
            f"accept_rate={t['accept_rate']:.3f} mean_entropy={t['mean_entropy']:.3f} "
            f"tokens_per_cycle={total.tokens_per_cycle:.3f}")
    return code
