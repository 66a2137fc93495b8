"""`mtpcli generate` with several prompts: read them, decode them as one batch, print rows in input order.

Prompts come from --prompt-file (repeated; a folder gives its *.txt files, sorted) and --prompts-jsonl (one
JSON object per line: "prompt", optional "max_tokens" and "seed"). A prompt that cannot be used (unreadable,
empty, too long, a bad JSONL line) fails its own row; the others still run, and the exit status is 1.
Text format prints each completion whole, in input order, joined by --separator; JSONL prints one row per
prompt in input order as soon as every earlier row is out.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TextIO

from . import models
from .batch import require_plain_cache
from .batch_engine import BatchEngine, Request
from .errors import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_RUNTIME, ModelError, UsageError
from .generate import (TYPICAL_TAG, Output, build_controller, build_engine, decode_config, encode_prompt, err,
                       load_models, report, settings_record)
from .profiles import Settings
from .stats import RunStats


@dataclass
class Item:
    index: int
    source: str
    text: str | None = None
    max_tokens: int | None = None
    seed: int | None = None
    error: str | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    done: bool = False
    text_out: str = ""  # the decoded completion, set when the row is printed


def _file_item(index: int, path: Path) -> Item:
    try:
        data = path.read_bytes()
    except OSError as e:
        return Item(index, str(path), error=f"cannot read {path}: {e.strerror or e}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace")
        err(f"mtpcli: warning: {path} is not valid UTF-8 (byte {e.start}); invalid bytes replaced with U+FFFD")
    return Item(index, str(path), text)


def read_items(prompt_files: list[str], prompts_jsonl: str | None) -> list[Item]:
    items: list[Item] = []
    for name in prompt_files:
        path = Path(name)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".txt")
            if not files:
                raise UsageError(f"--prompt-file {name}: no .txt files in that folder")
            items += [_file_item(len(items) + i, p) for i, p in enumerate(files)]
        else:
            items.append(_file_item(len(items), path))
    if prompts_jsonl:
        try:
            lines = Path(prompts_jsonl).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as e:
            raise UsageError(f"--prompts-jsonl {prompts_jsonl}: {e.strerror or e}") from None
        for n, line in enumerate(lines, 1):
            if line.strip():
                items.append(_jsonl_item(len(items), f"{prompts_jsonl}:{n}", line))
    if not items:
        raise UsageError(f"--prompts-jsonl {prompts_jsonl}: no prompts in the file")
    return items


def _jsonl_item(index: int, source: str, line: str) -> Item:
    try:
        row = json.loads(line)
    except ValueError as e:
        return Item(index, source, error=f"{source}: not valid JSON ({e.msg})")
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        return Item(index, source, error=f"{source}: needs a JSON object with a string \"prompt\"")
    unknown = sorted(set(row) - {"prompt", "max_tokens", "seed"})
    if unknown:
        return Item(index, source, error=f"{source}: unknown key {unknown[0]!r} (allowed: prompt, max_tokens, seed)")
    for key, low in (("max_tokens", 1), ("seed", 0)):
        if key in row and (type(row[key]) is not int or row[key] < low):
            return Item(index, source, error=f"{source}: {key} must be an integer >= {low}")
    return Item(index, source, row["prompt"], row.get("max_tokens"), row.get("seed"))


def default_batch_size(config: dict, n: int, tokens_per_row: int) -> int:
    """All prompts at once, unless their KV caches would take more than a quarter of the memory."""
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


def _batch_parts(s: Settings, target: models.Loaded, draft: models.Loaded | None):
    """(drafter, reason): the batch drafter, or why this run cannot be batched."""
    from .drafters.model import ModelBatchDrafter
    from .drafters.ngram import NgramBatch

    v = s.values
    if v["draft"] == "mtp":
        return None, "MTP heads draft from the target's hidden states one sequence at a time"
    try:
        require_plain_cache(target.model, "target model")
        if v["draft"] == "model":
            return ModelBatchDrafter(draft.model, v["p_min"], v["prefill_step"]), None
    except ModelError as e:
        return None, str(e).split(";")[0]
    if v["draft"] == "ngram":
        return NgramBatch(v["ngram_min"], v["ngram_max"]), None
    return None, None


def _sequential(s: Settings, target, draft, requests: list[Request], runs: dict) -> Iterator:
    from .engine import Event

    for req in requests:
        one = Settings({**s.values, "seed": req.seed, "max_tokens": req.max_tokens}, s.origins, s.profile)
        engine = build_engine(one, target, draft)
        try:
            for ev in engine.generate(req.prompt):
                yield Event(req.index, ev.tokens, ev.finish_reason)
        finally:
            runs[req.index] = engine.stats


def run(s: Settings, items: list[Item], quiet: bool, stats_json: str | None, separator: str, argv: list[str],
        batch_size: int | None, out: TextIO = None, log: bool = True) -> int:
    out = out or sys.stdout
    v = s.values
    target, draft = load_models(s)
    limit = models.max_context(target.config)
    requests = []
    for it in items:
        if it.error:
            continue
        if not it.text.strip():
            it.error = f"{it.source}: empty prompt"
            continue
        ids = encode_prompt(target.tokenizer, it.text, v["chat"], v["system"])
        if limit and len(ids) >= limit:
            it.error = f"{it.source}: prompt is {len(ids)} tokens, longer than the model's context of {limit} tokens"
            continue
        seed = it.seed if it.seed is not None else v["seed"] + it.index
        requests.append(Request(it.index, ids, it.max_tokens or v["max_tokens"], seed))
    for it in items:
        if it.error:
            err(f"mtpcli: row {it.index}: {it.error}")
    law = decode_config(s).law
    if law == "typical":
        err(f"{TYPICAL_TAG} threshold={v['typical_threshold']} eps={v['typical_eps']}")
    drafter, reason = _batch_parts(s, target, draft) if requests else (None, None)
    runs: dict[int, RunStats] = {}
    started, t0 = time.time(), time.perf_counter()
    engine = None
    if reason:
        err(f"mtpcli: note: {reason}; decoding the prompts one after another")
        events = _sequential(s, target, draft, requests, runs)
        size = 1
    else:
        longest = max((len(r.prompt) + r.max_tokens for r in requests), default=1)
        size = batch_size or default_batch_size(target.config, len(requests), longest)
        engine = BatchEngine(target.model, drafter, build_controller(s, size), target.tokenizer.eos_token_ids,
                             decode_config(s), size)
        runs = engine.runs
        events = engine.generate(requests)
    output = Output(out)
    status = _print(items, events, v["format"], separator, output, target.tokenizer, runs)
    wall = time.perf_counter() - t0
    done = [runs[it.index] for it in items if it.index in runs]
    total = done[0] if done else RunStats()
    for r in done[1:]:
        total = total.merge(r)
    failed = sum(1 for it in items if it.error)
    batch = {"prompts": len(items), "failed": failed, "batch_size": size, "wall_s": wall,
             "cycles": engine.cycles if engine else total.cycles, "tokens": total.generated_tokens,
             "throughput_tok_s": total.generated_tokens / wall if wall > 0 else 0.0, "batched": engine is not None}
    if v["format"] == "json":
        doc = {"completions": [_row(it, runs.get(it.index)) for it in items], "stats": total.to_dict(), "batch": batch,
               "settings": settings_record(s, v["draft"], law)}
        output.write(json.dumps(doc) + "\n")
    if output.closed:
        status = EXIT_PIPE
    record = {**total.to_dict(), "batch": batch, "settings": settings_record(s, v["draft"], law)}
    report(total, record, quiet, stats_json, title=f"mtpcli · {s.profile} · {law} · {len(items)} prompts",
           extra=f"batch: {len(items)} prompts ({failed} failed), batch size {size}, {batch['cycles']} cycles, "
                 f"{total.generated_tokens} tokens in {wall:.2f} s: {batch['throughput_tok_s']:.2f} tok/s in all")
    if status == EXIT_INTERRUPTED:
        err(f"mtpcli: interrupted after {total.generated_tokens} tokens")
    if failed and status == 0:
        err(f"mtpcli: {failed} of {len(items)} prompts failed (see their rows)")
        status = EXIT_RUNTIME
    from . import runlog

    runlog.append_safely(command=argv, settings=record["settings"], profile=s.profile, model=v["model"],
                         draft=v["draft_model"] or v["draft"], prompt=[t for r in requests for t in r.prompt],
                         stats=record, status=status, started=started, prompt_text=None, log=log)
    return status


def _row(it: Item, stats: RunStats | None) -> dict[str, Any]:
    if it.error:
        return {"index": it.index, "source": it.source, "error": it.error}
    return {"index": it.index, "source": it.source, "text": it.text_out, "tokens": it.tokens,
            "finish_reason": it.finish_reason, "stats": stats.to_dict() if stats else None}


def _print(items: list[Item], events, fmt: str, separator: str, output: Output, tokenizer, runs) -> int:
    """Collect events; print finished rows in input order (text: completions joined by `separator`)."""
    by_index = {it.index: it for it in items}
    for it in items:
        it.done = it.error is not None
    nxt = 0

    def flush():
        nonlocal nxt
        while nxt < len(items) and items[nxt].done and not output.closed:
            it = items[nxt]
            if not it.error:
                it.text_out = tokenizer.decode(it.tokens)
            if fmt == "jsonl":
                output.write(json.dumps(_row(it, runs.get(it.index))) + "\n")
            elif fmt == "text":
                output.write((separator if nxt else "") + ("" if it.error else it.text_out))
            nxt += 1

    status = 0
    try:
        flush()
        for ev in events:
            it = by_index[ev.completion]
            it.tokens.extend(ev.tokens)
            if ev.finish_reason:
                it.finish_reason, it.done = ev.finish_reason, True
                flush()
            if output.closed:
                break
    except KeyboardInterrupt:
        status = EXIT_INTERRUPTED
    for it in items:  # what is left (interrupted rows included, with what they committed)
        if not it.done:
            it.done, it.finish_reason = True, it.finish_reason or "interrupted"
    flush()
    if fmt == "text" and items:
        output.write("\n")
    return status

