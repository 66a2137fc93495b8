"""Settings options from config.SCHEMA: their names, help with choices and default, the sections of `generate -h`."""

from __future__ import annotations

import inspect
import re
from typing import List, Optional

import typer

from .config import SCHEMA

SHORT = {"model": ("-m",)}  # short aliases of settings options
# The sections of `generate --help`, in this order: every settings key under one (tests/test_tidy4.py).
PANELS = {"Prompt": ("chat", "system"), "Model": ("model", "draft_model", "prefill_step", "prefill_cache",
                                                  "prefill_cache_mb"),
          "Sampling": ("max_tokens", "temp", "top_p", "top_k", "min_p", "seed", "typical_threshold", "typical_eps"),
          "Drafting": ("draft", "num_draft_tokens", "adaptive", "n_min", "n_max", "p_min", "tree", "tree_children", "history",
                       "history_max_mb", "ngram_min", "ngram_max", "ema_alpha", "ema_probe", "ema_init"),
          "Output": ("format", "schema", "json", "grammar"), "Distributed": ("distributed", "distributed_timeout")}
PANEL = {k: name for name, keys in PANELS.items() for k in keys}


def option(key: str):
    """The option of a settings key, named and explained by SCHEMA (a bool key takes --x/--no-x), its help ending in
    its allowed values and built-in default, as `[1..64; default: 4]`; None if not given."""
    k = SCHEMA[key]
    names = f"{k.option}/--no-{k.option[2:]}" if k.type is bool else k.option
    default = None if k.default is None else ("on" if k.default else "off") if k.type is bool else k.default
    shown = [k.allowed] * bool(k.allowed) + [f"default: {default}"] * (default is not None)
    return typer.Option(None, names, *SHORT.get(key, ()), help=k.help + (f"  [{'; '.join(shown)}]" if shown else ""),
                        show_default=False, rich_help_panel=PANEL.get(key))


class Sections(typer.core.TyperCommand):
    """click's plain help, its options in sections by `rich_help_panel` (PANELS' order), then the rest."""

    def format_options(self, ctx, formatter):
        groups: dict[str, list] = {name: [] for name in ("Arguments", *PANELS, "Options")}
        for param in self.get_params(ctx):
            if (record := param.get_help_record(ctx)) is not None:
                panel = "Arguments" if param.param_type_name == "argument" else param.rich_help_panel
                groups[panel if panel in groups else "Options"].append(record)
        for name, records in groups.items():
            if records:
                with formatter.section(name):
                    formatter.write_dl(records)


def settings(*keys: str, after: str | None, **made):
    """Add to a command, after its parameter AFTER (None: first), an option per settings key in KEYS, then the options
    MADE (name=(type, typer.Option), declared once for several commands); their values go to its **flags.
    (typer reads a command's parameters from its `__signature__` and `__annotations__`.)"""
    def add(fn):
        params = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.kind != p.VAR_KEYWORD]
        at = [p.name for p in params].index(after) + 1 if after else 0
        new = {**{k: (Optional[SCHEMA[k].type], option(k)) for k in keys}, **made}
        params[at:at] = [inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o, annotation=t)
                         for k, (t, o) in new.items()]
        fn.__signature__ = inspect.Signature(params)
        fn.__annotations__ = {p.name: p.annotation for p in params}
        return fn
    return add


class Plain:
    """An option's value taken as typer's pydantic TypeAdapter takes it, where it is plain: a str, a list of str, an
    int or a float written plainly and in range. typer 0.29 builds such an adapter for every option of the command it
    runs, and importing pydantic for them took 0.16 s of each start; anything else (a bad or out-of-range value, a
    type not listed) goes to typer's own coercion, for its result and its message."""

    NUMBER = {int: re.compile(r"-?(0|[1-9][0-9]*)"), float: re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")}

    def coerce(self, value, param, ctx):
        desc, multi = param.type_descriptor, param.multiple or param.nargs == -1
        kind, info = desc.annotation, desc.parameter_info
        if value is None:
            return () if multi else None
        if kind is bool and isinstance(value, bool):
            return value
        if kind is str and isinstance(value, str) or kind == List[str] and isinstance(value, (list, tuple)) and \
                all(isinstance(v, str) for v in value):
            return list(value) if multi else value
        if kind in self.NUMBER and type(value) in (str, int, float) and self.NUMBER[kind].fullmatch(str(value)):
            n = kind(value)
            if (info.min is None or n >= info.min) and (info.max is None or n <= info.max):
                return n
        param._runtime_param = None  # (typer's own, built now)
        return param.get_runtime_param().coerce(value, param=param, ctx=ctx)


def plain_values(command, help_names: list[str]) -> None:
    """Give every option of COMMAND (a click command or group, and its subcommands) a `Plain` coercion, its help
    option too (made now, as click makes it: once per command)."""
    for param in [*command.params, command.get_help_option(typer.Context(command, help_option_names=help_names))]:
        if hasattr(param, "type_descriptor"):
            param._runtime_param = Plain()
    for sub in getattr(command, "commands", {}).values():
        plain_values(sub, help_names)
