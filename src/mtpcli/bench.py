"""`mtpcli bench`: arms compared in one run, on the same prompts and seeds, interleaved after a warm-up: decode speed,
and end to end (a run as a fresh process pays it: loading the models it uses, each model's prefill, the decode)."""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler

from . import assemble, config, models, prompts, runlog, tasks
from .engine import Request
from .errors import EXIT_INTERRUPTED, EXIT_TERMINATED, UsageError
from .generate import chat_on, encode_prompt, typical_line
from .stats import RunStats
from .tables import table


@dataclass
class Arm:
    name: str
    cfg: config.Config
    kind: str = "mtpcli"  # mtpcli | mlx-lm
    load_s: float = 0.0  # loading the models it uses (timed once: bench loads them once for every arm)
    runs: dict[int, list[RunStats]] = field(default_factory=dict)  # seed -> one RunStats per prompt
    outputs: list[dict[str, Any]] = field(default_factory=list)


def fit_length(ids: list[int], n: int | None) -> list[int]:
    return (ids * (n // len(ids) + 1))[:n] if n else ids


def run_mtpcli(cfg: config.Config, target, draft, prompt: list[int], seed: int, max_tokens: int):
    """(statistics, tokens)."""
    cfg = replace(cfg, seed=seed, max_tokens=max_tokens)
    engine = assemble.engine(cfg, target, draft if cfg.draft in config.DRAFTED else None)
    mx.reset_peak_memory()
    tokens = [t for ev in engine.generate([Request(0, prompt, max_tokens, seed)]) for t in ev.tokens]
    return engine.stats, tokens


def run_mlx_lm(cfg: config.Config, target, draft, prompt: list[int], seed: int, max_tokens: int):
    """mlx-lm's own speculative decoding (token matching; plain when the arm drafts none), measured the same way."""
    draft = draft if cfg.draft != "none" and cfg.draft_model else None
    width = cfg.num_draft_tokens
    mx.random.seed(seed)
    mx.reset_peak_memory()
    sampler = make_sampler(temp=cfg.temp, top_p=cfg.top_p, top_k=cfg.top_k, min_p=cfg.min_p)
    st = RunStats(prompt_tokens=len(prompt), prefill_tokens=len(prompt))
    t0 = time.perf_counter()
    tokens, last_draft_run, ends = [], 0, []
    kw = dict(draft_model=draft.model, num_draft_tokens=width) if draft is not None else {}
    for r in stream_generate(target.model, target.tokenizer, mx.array(prompt), max_tokens=max_tokens,
                             sampler=sampler, **kw):
        if not tokens:
            st.ttft_s = time.perf_counter() - t0
            st.prefill_s = r.prompt_tokens / r.prompt_tps if r.prompt_tps else 0.0
        tokens.append(r.token)
        if r.from_draft:
            last_draft_run += 1
        else:  # a target token ends a cycle: the drafts before it were accepted
            st.record_cycle(width if draft is not None else 0, last_draft_run, last_draft_run + 1, "mlx-lm")
            last_draft_run = 0
            ends.append(time.perf_counter())
        if r.finish_reason:
            break
    if last_draft_run:  # (its last cycle ended in drafted tokens: an end token, or the limit)
        st.record_cycle(width, last_draft_run, last_draft_run, "mlx-lm")
        ends.append(time.perf_counter())
    # mlx-lm's prompt time runs to its first token, so it holds the first cycle (a speculative one: up to width + 1
    # tokens): decode time, as mtpcli's, priced as the median of the cycles after it (issue 58)
    if len(ends) > 1:
        st.prefill_s = max(st.prefill_s - statistics.median(b - a for a, b in zip(ends, ends[1:])), 0.0)
    st.decode_s = max(time.perf_counter() - t0 - st.prefill_s, 1e-9)  # decode time after the prompt, as mtpcli's
    st.peak_memory_bytes = mx.get_peak_memory()
    return st, tokens


def spread(values) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    return {"min": min(values), "median": statistics.median(values), "max": max(values)} if values else None


def summarize(arm: Arm) -> dict[str, Any]:
    seeds = [runs for _, runs in sorted(arm.runs.items())]
    per_seed = [RunStats.total(runs) for runs in seeds]
    # decode tok/s: RunStats.decode_tps, as `mtpcli stats` shows it (per seed, over its prompts; logged: every seed)
    out = {k: spread([getattr(s, k) for s in per_seed])
           for k in ("decode_tps", "tokens_per_cycle", "acceptance_rate", "prefill_tps", "ttft_s")}
    # end to end: seconds of a run, per seed the mean over its prompts
    mean = lambda f: spread([statistics.fmean(f(r) for r in runs) for runs in seeds])  # noqa: E731
    out["e2e"] = {"load_s": arm.load_s, "ttft_s": mean(lambda r: r.ttft_s or 0.0),
                  **{k: mean(lambda r, k=k: getattr(r, k)) for k in ("prefill_s", "draft_prefill_s", "decode_s")},
                  "run_s": mean(lambda r: arm.load_s + r.prefill_s + r.draft_prefill_s + r.decode_s)}  # start to exit
    return {"arm": arm.name, **out, "peak_memory_bytes": max(s.peak_memory_bytes for s in per_seed),
            "accept_by_position": per_seed[len(per_seed) // 2].accept_by_position,
            "generated_tokens": sum(s.generated_tokens for s in per_seed)}


def bench(*, model: str, draft_model: str | None, draft: str | None, profile_names: list[str], seeds: int,
          prompt_source: str | None, max_tokens: int, prompt_tokens: int | None, baselines: list[str],
          flags: dict[str, Any], argv: list[str], log: bool = True, progress=None, task: str | None = None
          ) -> dict[str, Any]:
    problems = tasks.load(task) if task else None  # (--task: its problems are the prompts, every output checked)
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(model=model, draft_model=draft_model, draft=draft)
    arms = [Arm(name, config.resolve(name, overrides)) for name in profile_names]
    if "mlx-lm" in baselines and not draft_model:
        raise UsageError("--baseline mlx-lm needs --draft-model")
    plain = {**overrides, "draft": "none", "draft_model": None, "num_draft_tokens": None}  # (no draft to refuse)
    for baseline, name, settings, kind in (("ar", "ar (plain)", plain, "mtpcli"),
                                           ("mlx-lm", "mlx-lm speculative", overrides, "mlx-lm"),
                                           ("mlx-lm-plain", "mlx-lm plain", plain, "mlx-lm")):
        if baseline in baselines:  # on the first profile's settings
            arms.append(Arm(name, config.resolve(profile_names[0], settings), kind))
    t0 = time.perf_counter()
    target = models.load(model, "target model")
    t1 = time.perf_counter()
    dmodel = models.load_draft(draft_model, target) if draft_model else None
    t2 = time.perf_counter()
    for arm in arms:  # the models each arm's run loads
        uses_draft = dmodel is not None and arm.cfg.draft != "none" and (arm.kind == "mlx-lm" or
                                                                          arm.cfg.draft in config.DRAFTED)
        arm.load_s = t1 - t0 + (t2 - t1 if uses_draft else 0.0)
    head = dmodel.kind if dmodel is not None and dmodel.kind != "model" else None
    if head and "mlx-lm" in baselines:
        raise UsageError(f"--baseline mlx-lm needs a draft model; --draft-model '{draft_model}' is a trained head")
    for arm in arms:
        arm.cfg = config.settle(arm.cfg, models.has_mtp(target), head=head)
    first = arms[0].cfg
    chat = chat_on(target.tokenizer, first.chat)
    texts = ([(p.id, tasks.prompt_text(p, chat)) for p in problems] if task else
             [(it.name, it.text) for it in prompts.bench_set(prompt_source)])
    encoded = [(name, fit_length(encode_prompt(target.tokenizer, text, first.chat, first.system), prompt_tokens))
               for name, text in texts]
    name, longest = max(encoded, key=lambda e: len(e[1]))
    if (limit := models.max_context(target.config)) and len(longest) + max_tokens > limit:  # as generate refuses it
        raise UsageError(f"prompt {name}: its {len(longest)} tokens" + " (--prompt-tokens)" * bool(prompt_tokens) +
                         f" and --max-tokens {max_tokens} run past the model's context of {limit} tokens")
    for arm in arms:
        if progress and (line := typical_line(arm.cfg)):
            progress(f"{line} (arm {arm.name})")

    def one(arm, ids, seed, n):
        return (run_mlx_lm if arm.kind == "mlx-lm" else run_mtpcli)(arm.cfg, target, dmodel, ids, seed, n)

    for arm in arms:  # warm-up, as long as a run: compile every shape a run meets (auto's widths and sources, on a
        one(arm, encoded[0][1], 0, max_tokens)  # GPU's JIT), page in the weights, fill the allocator
    # interleaved: A B C, A B C, ... so drift hits every arm alike
    total, t0, done, stop = seeds * len(encoded) * len(arms), time.perf_counter(), 0, None
    try:
        for i, (seed, (pname, ids), arm) in enumerate(itertools.product(range(seeds), encoded, arms), 1):
            st, toks = one(arm, ids, seed, max_tokens)
            arm.runs.setdefault(seed, []).append(st)
            arm.outputs.append({"seed": seed, "prompt": pname, "tokens": toks, "text": target.tokenizer.decode(toks),
                                "stats": {k: v for k, v in st.to_dict().items() if k in (
                                    "tokens_per_cycle", "acceptance_rate", "decode_tps", "draft_width_hist", "trees")}})
            done = i
            if progress:
                left = (time.perf_counter() - t0) / i * (total - i)
                progress(f"[{i}/{total}, {left // 60:.0f}m{left % 60:02.0f}s left] {arm.name} seed={seed} "
                         f"prompt={pname}: {st.decode_tps:.2f} decode tok/s, {st.tokens_per_cycle:.2f} tokens/cycle")
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the runs that finished are summarized, logged and kept
        if not done:
            raise
        stop = {"runs": done, "of": total, "terminated": e.args == (EXIT_TERMINATED,)}
    arms = [a for a in arms if a.runs]  # (interrupted: the first arm always has the most)
    quality = tasks.score(task, problems, [(a.name, a.cfg.temp, a.outputs) for a in arms], chat,
                          progress=progress) if task else None
    if quality and "stopped" in quality:  # (interrupted while checking: as in the runs, what ended is kept)
        stop = {"runs": done, "of": total, "terminated": quality["stopped"] == (EXIT_TERMINATED,)}
    summaries = [summarize(a) for a in arms]
    base, whole = summaries[0]["decode_tps"]["median"], summaries[0]["e2e"]["run_s"]["median"]
    for s in summaries:  # speed over the first arm's: decode tok/s, and a whole run's seconds (theirs over ours)
        s["ratio"] = s["decode_tps"]["median"] / base if base else None
        s["e2e_ratio"] = whole / s["e2e"]["run_s"]["median"] if s["e2e"]["run_s"]["median"] else None
    for arm in arms:  # to the run log (append_safely: not with log off)
        agg = RunStats.total([r for runs in arm.runs.values() for r in runs])
        law = {"law": "mlx-lm"} if arm.kind == "mlx-lm" else {}
        rec = {**agg.to_dict(), "settings": {**arm.cfg.record(), **law, "bench_arm": arm.name},
               **({"task": {**quality["arms"][arm.name], "name": task, "format": quality["format"]}} if task else {})}
        status = 0 if stop is None else EXIT_TERMINATED if stop["terminated"] else EXIT_INTERRUPTED
        runlog.append_safely(command=argv, settings=rec["settings"], profile=arm.name, model=model,
                             draft=draft_model or arm.cfg.draft, prompt=encoded[0][1], stats=rec,
                             status=status, started=time.time(), log=log)
    result = {"arms": summaries, "outputs": {a.name: a.outputs for a in arms}, **({"task": quality} if task else {}),
              "config": {"model": model, "draft_model": draft_model, "seeds": seeds,
                         "prompts": [n for n, _ in encoded], "max_tokens": max_tokens, "prompt_tokens": prompt_tokens,
                         "flags": overrides}}
    return result if stop is None else {**result, "interrupted": stop}


def render(result: dict[str, Any]) -> None:
    def f(m, fmt="{:.2f}"):  # noqa: E306
        return f"{fmt.format(m['median'])} [{fmt.format(m['min'])}-{fmt.format(m['max'])}]" if m else "-"

    rows = [[s["arm"], f(s["decode_tps"]), f"{s['ratio']:.2f}x" if s["ratio"] else "-", f(s["tokens_per_cycle"]),
             f(s["acceptance_rate"], "{:.3f}"), f(s["prefill_tps"], "{:.0f}"), f(s["ttft_s"], "{:.3f}"),
             f"{s['peak_memory_bytes'] / 2**20:.0f} MiB"] for s in result["arms"]]
    table(["arm", "decode tok/s median [min-max]", "ratio", "tokens/cycle", "acceptance", "prefill tok/s", "TTFT s",
           "peak mem"], rows)
    rows = [[s["arm"], f"{s['e2e']['load_s']:.2f}", *(f(s["e2e"][k]) for k in ("prefill_s", "draft_prefill_s", "ttft_s",
                                                                              "decode_s", "run_s")),
             f"{s['e2e_ratio']:.2f}x" if s["e2e_ratio"] else "-"] for s in result["arms"]]
    print()
    table(["arm", "load s", "prefill s", "draft prefill s", "TTFT s", "decode s", "run s (start to exit)",
           "e2e ratio"], rows, title="end to end, per run: median [min-max] over seeds")
    if "task" in result:
        tasks.render(result)
