"""`mtpcli generate`: read the prompt, load models, build the engine, stream text, report statistics."""

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
from .drafters import NoDraft
from .engine import DecodeConfig, Engine
from .errors import EXIT_INTERRUPTED, EXIT_PIPE, UsageError
from .profiles import Settings
from .sampling import SamplingParams
from .stats import RunStats, render

TYPICAL_TAG = "[typical-accept] NOT distribution-exact;"


def err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_prompt(prompt: str | None, prompt_file: str | None, stdin=None) -> tuple[str, str]:
    """The prompt text and where it came from. Non-UTF-8 bytes are replaced, with a warning."""
    stdin = stdin or sys.stdin
    if prompt is not None and prompt_file is not None:
        raise UsageError("give either --prompt or --prompt-file, not both")
    if prompt is not None:
        text, source = prompt, "--prompt"
    else:
        if prompt_file is None or prompt_file == "-":
            if prompt_file is None and (stdin is None or stdin.isatty()):
                raise UsageError("no prompt: give --prompt TEXT, --prompt-file PATH, or pipe text on stdin")
            data, source = stdin.buffer.read(), "stdin"
        else:
            try:
                data, source = Path(prompt_file).read_bytes(), prompt_file
            except OSError as e:
                raise UsageError(f"--prompt-file {prompt_file}: {e.strerror or e}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            text = data.decode("utf-8", errors="replace")
            err(f"mtpcli: warning: {source} is not valid UTF-8 (byte {e.start}); invalid bytes replaced with U+FFFD")
    if not text.strip():
        raise UsageError(f"empty prompt ({source})")
    return text, source


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


def build_engine(s: Settings, target: models.Loaded, draft: models.Loaded | None) -> Engine:
    from .drafters.model import ModelDrafter
    from .drafters.mtp import MtpDrafter
    from .drafters.ngram import NgramDrafter

    v = s.values
    settle_draft(s, target)
    if v["draft"] == "none":
        drafter = NoDraft()
    elif v["draft"] == "ngram":
        drafter = NgramDrafter(v["ngram_min"], v["ngram_max"])
    elif v["draft"] == "mtp":
        drafter = MtpDrafter(models.mtp_head(target), target.model, p_min=v["p_min"], prefill_step=v["prefill_step"])
    else:
        drafter = ModelDrafter(draft.model, p_min=v["p_min"], prefill_step=v["prefill_step"])
    return Engine(target.model, drafter, build_controller(s), target.tokenizer.eos_token_ids, decode_config(s))


def settle_draft(s: Settings, target: models.Loaded) -> None:
    """draft = auto without a draft model: the checkpoint's MTP heads if it has them, else n-gram lookup."""
    if s.values["draft"] == "auto":
        s.values["draft"] = "mtp" if models.has_mtp(target) else "ngram"


def load_models(s: Settings) -> tuple[models.Loaded, models.Loaded | None]:
    v = s.values
    target = models.load(v["model"], "target model")
    settle_draft(s, target)
    draft = None
    if v["draft"] == "model":
        if not v["draft_model"]:
            raise UsageError("--draft model needs --draft-model PATH_OR_ID")
        draft = models.load(v["draft_model"], "draft model")
        models.check_pair(target, draft)
    return target, draft


def settings_record(s: Settings, draft_source: str, law: str) -> dict[str, Any]:
    v = s.values
    return {
        "profile": s.profile, "model": v["model"], "draft_model": v["draft_model"], "draft": draft_source,
        "law": law, "num_draft_tokens": v["num_draft_tokens"], "adaptive": v["adaptive"], "n_min": v["n_min"],
        "n_max": v["n_max"], "p_min": v["p_min"], "temp": v["temp"], "top_p": v["top_p"], "top_k": v["top_k"],
        "min_p": v["min_p"], "seed": v["seed"], "max_tokens": v["max_tokens"],
        "typical_threshold": v["typical_threshold"], "typical_eps": v["typical_eps"],
    }


@dataclass
class Completion:
    index: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None


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


def run(s: Settings, prompt_text: str, n: int, quiet: bool, stats_json: str | None, separator: str,
        argv: list[str], out: TextIO = None, log: bool = True, log_prompts: bool = False) -> int:
    out = out or sys.stdout
    v = s.values
    target, draft = load_models(s)
    prompt = encode_prompt(target.tokenizer, prompt_text, v["chat"], v["system"])
    limit = models.max_context(target.config)
    if limit and len(prompt) >= limit:
        raise UsageError(f"prompt is {len(prompt)} tokens, longer than the model's context of {limit} tokens")
    engine = build_engine(s, target, draft)
    if os.environ.get("MTPCLI_BLAS_HINT") and not quiet:
        err("mtpcli: note: MLX uses its slow reference BLAS here; installing OpenBLAS (Debian/Ubuntu: "
            "apt-get install libopenblas0-pthread) makes CPU decoding ~2-3x faster, and mtpcli preloads it itself")
    law = engine.cfg.law
    draft_source = v["draft"]
    if law == "typical":
        err(f"{TYPICAL_TAG} threshold={v['typical_threshold']} eps={v['typical_eps']}")
    fmt = v["format"]
    output = Output(out)
    started = time.time()
    completions, interrupted = _stream(engine, prompt, n, fmt, separator, output, target.tokenizer)
    status = EXIT_INTERRUPTED if interrupted else 0
    total = engine.stats
    for c in completions:
        if not c.text and c.tokens:
            c.text = target.tokenizer.decode(c.tokens)
    if fmt == "json":
        if n == 1:
            doc = _row(completions[0], total)
        else:
            doc = {"completions": [_row(c, r) for c, r in zip(completions, engine.runs)], "stats": total.to_dict()}
        doc["settings"] = settings_record(s, draft_source, law)
        output.write(json.dumps(doc) + "\n")
    if output.closed:
        status = EXIT_PIPE
    record = {**total.to_dict(), "settings": settings_record(s, draft_source, law)}
    report(total, record, quiet, stats_json, title=f"mtpcli · {s.profile} · {law}")
    if interrupted:
        err(f"mtpcli: interrupted after {total.generated_tokens} tokens")
    if output.closed:
        err(f"mtpcli: stdout was closed; stopped after {total.generated_tokens} tokens")
    from . import runlog

    runlog.append_safely(
        command=argv, settings=record["settings"], profile=s.profile, model=v["model"],
        draft=v["draft_model"] or draft_source, prompt=prompt, stats=record, status=status, started=started,
        prompt_text=prompt_text if log_prompts else None, log=log,
    )
    return status


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
    if total.typical is not None:
        t = total.typical_summary()
        err(f"{TYPICAL_TAG} positions={t['positions']} accepted={t['accepted']} resamples={t['resamples']} "
            f"accept_rate={t['accept_rate']:.3f} mean_entropy={t['mean_entropy']:.3f} "
            f"tokens_per_cycle={total.tokens_per_cycle:.3f}")


def _stream(engine: Engine, prompt: list[int], n: int, fmt: str, separator: str, output: Output,
            tokenizer) -> tuple[list[Completion], bool]:
    """Decode, writing text as it is committed (or a JSONL row per finished completion)."""
    detok = tokenizer.detokenizer
    completions = [Completion(i) for i in range(n)]
    current = 0
    try:
        for ev in engine.generate(prompt, n):
            c = completions[ev.completion]
            if fmt == "text" and ev.completion != current:
                output.write(separator)
                current = ev.completion
            c.tokens.extend(ev.tokens)
            for t in ev.tokens:
                detok.add_token(t)
            if ev.finish_reason:
                detok.finalize()
                c.finish_reason = ev.finish_reason
            if fmt == "text":
                output.write(detok.last_segment)
            if ev.finish_reason:
                detok.reset()
                c.text = tokenizer.decode(c.tokens)
                if fmt == "jsonl":
                    output.write(json.dumps(_row(c, engine.runs[c.index])) + "\n")
            if output.closed:
                break
    except KeyboardInterrupt:
        detok.finalize()
        if fmt == "text":
            output.write(detok.last_segment)
        return completions, True
    finally:
        if fmt == "text":
            output.write("\n")
    return completions, False


def _row(c: Completion, stats: RunStats) -> dict[str, Any]:
    return {"index": c.index, "text": c.text, "tokens": c.tokens, "finish_reason": c.finish_reason,
            "stats": stats.to_dict()}
