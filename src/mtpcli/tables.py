"""The terminal's side: the one table printer, a run's record as rows and sparklines, a slow step's status line."""

from __future__ import annotations

import contextlib
import statistics
import sys
from typing import Any, Sequence, TextIO

from .stats import PLAIN

SPARK = "▁▂▃▄▅▆▇█"


def plain_last(sources: dict[str, Any]) -> list[tuple[str, Any]]:
    return sorted(sources.items(), key=lambda kv: (kv[0] == PLAIN, kv[0]))


def rates_text(rates: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in rates)


def table(headers: Sequence[str] | None, rows: Sequence[Sequence[Any]], out: TextIO | None = None,
          tty: bool | None = None, title: str | None = None) -> None:
    """A rich table on a terminal; aligned plain text otherwise. Without headers the rows are (key, value) pairs:
    keys in bold cyan on a terminal, `key: value` lines (untitled) otherwise."""
    out = out or sys.stdout
    tty = out.isatty() if tty is None else tty
    cells = [[_fmt(c) for c in r] for r in rows]
    if tty:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        t = Table(title=title, title_justify="left", show_header=headers is not None)
        for i, h in enumerate(headers or ("", "")):  # without headers: the keys' column in bold cyan
            t.add_column(Text(h), style="bold cyan" if headers is None and i == 0 else None, overflow="fold")  # (wraps)
        for r in cells:  # (Text: no cell or header is read as markup, which dropped bench's "[min-max]")
            t.add_row(*map(Text, r))
        Console(file=out, force_terminal=True).print(t)
    elif headers is None:
        for k, v in cells:
            print(f"{k}: {v}", file=out)
    else:
        widths = [max([len(str(h)), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]  # (no rows: headers)
        if title:
            print(title, file=out)
        for r in [[str(h) for h in headers], *cells]:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)


def short_paths(values: Sequence[str]) -> dict[str, str]:
    """Each distinct value as a table shows it: a path cut to the fewest last components that tell it apart from the
    others ('…/' marks the cut), so that rows of models in the same folder differ where their paths do."""
    parts = {v: v.rstrip("/").split("/") for v in set(values)}
    out = {}
    for v, p in parts.items():
        k = next((k for k in range(1, len(p)) if all(q[-k:] != p[-k:] for u, q in parts.items() if u != v)), len(p))
        short = "…/" + "/".join(p[-k:])
        out[v] = short if len(short) < len(v) else v
    return out


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"
    return "-" if x is None else str(x)


def sparkline(values: list[int] | list[float], width: int = 60) -> str:
    if not values:
        return ""
    if len(values) > width:  # bucket means
        step = len(values) / width
        values = [statistics.fmean(values[int(i * step): max(int((i + 1) * step), int(i * step) + 1)])
                  for i in range(width)]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1
    return "".join(SPARK[min(int((v - lo) / span * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)] for v in values)


def _hist(h: dict) -> str:
    return " ".join(f"{k}:{v}" for k, v in h.items()) or "-"


def _seconds(d: dict[str, Any]) -> list[tuple[str, str]]:
    """Where the run's time went (records of earlier versions lack it): loading, each model's prefill, decoding."""
    if d.get("decode_s") is None:
        return []
    load = f"load {d['load_s']:.2f} s, " if d.get("load_s") is not None else ""
    draft = f", draft model prefill {d['draft_prefill_s']:.2f} s ({d['draft_prefill_tokens']} tokens)" \
        if d.get("draft_prefill_tokens") else ""
    return [("seconds", f"{load}prefill {d['prefill_s']:.2f} s{draft}, decode {d['decode_s']:.2f} s")]


def summary_rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    """The rows of a run's statistics, from its record (RunStats.to_dict, as the run log keeps it)."""
    rows = [(k, str(d[k])) for k in ("prompt_tokens", "generated_tokens", "cycles", "drafted", "accepted")]
    if d.get("prompt_cached_tokens") or d.get("draft_cached_tokens"):  # (kept prefills: prefix.py)
        rows.insert(1, ("prompt_cached_tokens", f"{d['prompt_cached_tokens']} (draft model "
                                                f"{d.get('draft_cached_tokens', 0)})"))
    rows += [("acceptance_rate", f"{d['acceptance_rate']:.3f}"), ("tokens_per_cycle", f"{d['tokens_per_cycle']:.3f}"),
             ("accept_by_position", rates_text(d["accept_by_position"]) or "-"),
             ("accept_length_hist", _hist(d["accept_length_hist"])), ("draft_width_hist", _hist(d["draft_width_hist"])),
             ("prefill_tps", f"{d['prefill_tps']:.1f}"), ("decode_tps", f"{d['decode_tps']:.2f}"),
             ("ttft_s", f"{d['ttft_s']:.3f}" if d.get("ttft_s") is not None else "-"), *_seconds(d),
             ("peak_memory", f"{d['peak_memory_bytes'] / 2**20:.1f} MiB")]
    if (estimate := d.get("width_estimate", d.get("controller_estimate"))) is not None:  # (its key before tidy5)
        rows.append(("width_estimate", f"{estimate:.2f}"))
    if d.get("floor_cut_drafts"):
        rows.append(("floor_cut_drafts", str(d["floor_cut_drafts"])))
    if d.get("forced_tokens"):  # (a constraint's)
        rows.append(("forced_tokens", f"{d['forced_tokens']} ({d['forced_tokens'] / max(d['generated_tokens'], 1):.0%} "
                                      "of the generated tokens)"))
    if d.get("trees"):
        t = d["trees"]
        rows.append(("trees", f"{t['cycles']} cycles ({t['chain_cycles']} chains), {t['nodes_per_cycle']:.1f} nodes "
                              f"verified per cycle, accepted depth {t['accepted_depth']:.2f}, "
                              f"{t['side_paths']} paths through a later child"))
    if q := d.get("task"):  # a bench arm scored on a task (mtpcli bench --task)
        rows.append(("task", f"{q['name']}: pass@1 {q['pass_at_1']:.3f} [{q['interval'][0]:.3f}-{q['interval'][1]:.3f}]"
                             f" ({q['passed']}/{q['runs']}; {q['format'].split(':')[0]})"))
    sources = d.get("sources") or {}
    if len(sources) > 1:  # auto, or a run that also took plain steps: what each source contributed
        for name, st in plain_last(sources):
            share = f"{st['time_share']:.0%} of decode time"
            rows.append(("plain_steps", f"{st['cycles']} cycles, {share}") if name == PLAIN else (
                f"source {name}", f"{st['cycles']} cycles, drafted {st['drafted']}, accepted {st['accepted']} "
                f"({st['acceptance_rate']:.2f}; by position {rates_text(st['accept_by_position'])}), "
                f"{st['tokens_per_cycle']:.2f} tokens/cycle, {share}"))
    return rows


def render(d: dict[str, Any], out: TextIO, tty: bool, title: str = "mtpcli run") -> None:
    """A run's record as a rich table on a terminal (with the traces and histogram bars), else `key: value` lines."""
    rows = summary_rows(d)
    if tty:
        widths, tpc = d.get("width_trace") or [], d.get("tokens_per_cycle_trace") or []
        if len(set(widths)) > 1:
            rows.append(("draft_width_trace", sparkline(widths)))
        if tpc:
            rows.append(("tokens_per_cycle_trace", sparkline(tpc)))
        for label, hist in (("accept_length", d["accept_length_hist"]), ("draft_width", d["draft_width_hist"])):
            total = sum(hist.values()) or 1
            rows += [(f"{label}={k}", f"{'█' * max(1, round(30 * v / total))} {v}") for k, v in hist.items()]
    table(None, rows, out, tty, title)


def status(message: str, quiet: bool = False, file=None):
    """A transient status line (a spinner and `message`) on stderr (or `file`) while a step works, gone when it is
    done; nothing when quiet or when it is no terminal (in a pipe nothing of it is written)."""
    file = sys.stderr if file is None else file
    if quiet or not file.isatty():
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(file=file, force_terminal=True).status(message)
