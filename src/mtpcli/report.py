"""Views over the run log for `mtpcli stats`."""

from __future__ import annotations

import functools
import json
import re
import statistics
import sys
import time
from collections import Counter
from datetime import datetime
from typing import Any

from .errors import UsageError
from .stats import REQUIRED, SourceStats
from .tables import plain_last, rates_text, render, short_paths, table
from .plot import check as check_plot, plot
from .writers import check_writable


def parse_since(text: str) -> float:
    """'30m', '2h', '7d' ago, or an ISO date/time."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return time.time() - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UsageError(f"--since {text!r}: give a duration like 2h or 7d, or an ISO date like 2026-11-29") from None


def aggregate(records: list[dict]) -> dict[str, Any]:
    st = [r["stats"] for r in records]
    drafted = sum(s["drafted"] for s in st)
    med = lambda key: statistics.median(s[key] for s in st) if st else None  # noqa: E731
    return {"runs": len(st), "tokens": sum(s["generated_tokens"] for s in st),
            "median_tokens_per_cycle": med("tokens_per_cycle"),
            "acceptance": sum(s["accepted"] for s in st) / drafted if drafted else 0.0,
            "median_decode_tps": med("decode_tps"), "median_prefill_tps": med("prefill_tps"),
            "median_ttft_s": med("ttft_s") if all(s.get("ttft_s") is not None for s in st) else None}


def by_source(records: list[dict]) -> dict[str, dict[str, Any]]:
    """What each draft source contributed over these runs (and the plain steps, width 0, apart)."""
    pooled: dict[str, SourceStats] = {}
    runs, total_s = Counter(), 0.0
    for r in records:
        for name, d in (r["stats"].get("sources") or {}).items():
            st = SourceStats.from_dict(d)
            pooled[name] = pooled.get(name, SourceStats()).merge(st)
            runs[name] += 1
            total_s += st.seconds
    if not pooled:
        raise UsageError("--by source: none of these runs has per-source statistics (runs before draft = auto)")
    return {name: {"runs": runs[name], "cycles": st.cycles, "drafted": st.drafted, "accepted": st.accepted,
                   "acceptance": st.acceptance_rate, "tokens_per_cycle": st.tokens_per_cycle,
                   "accept_by_position": rates_text(st.accept_by_position) or "-",
                   "time_share": st.seconds / total_s if total_s > 0 else 0.0} for name, st in plain_last(pooled)}


def one_model(records: list[dict], view: str) -> None:
    """The one rule of every view that pools runs (medians, rates): over runs of several models it compares nothing,
    and is refused, naming the models."""
    spanned = sorted({str(r["model"]) for r in records})
    if len(spanned) > 1:
        raise UsageError(f"{view}: the runs span models {', '.join(spanned)}; pick one with --model")


def group_by(records: list[dict], field: str) -> dict[str, dict[str, Any]]:
    if field not in ("profile", "model", "draft", "source"):
        raise UsageError(f"--by {field!r}: choose profile, model, draft or source")
    if field != "model":
        one_model(records, f"--by {field}")
    if field == "source":
        return by_source(records)
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(str(r[field]), []).append(r)
    return {k: aggregate(v) for k, v in sorted(groups.items())}


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[list[Any]]:
    """Rows of metric, A, B, B/A."""
    num = lambda v: isinstance(v, (int, float))  # noqa: E731
    return [[k, a[k], b[k], b[k] / a[k] if num(a[k]) and num(b[k]) and a[k] else None] for k in a]


def run_title(record: dict | None, stats: dict[str, Any], fallback: str) -> str:
    """What a chart or table needs to name its run: id, model, profile, law and draft source."""
    rec = record or {}
    settings = rec.get("settings") or stats.get("settings") or {}
    parts = [f"run {rec['id']}" if "id" in rec else fallback]
    drafted = stats.get("drafted")
    for key in ("model", "draft_model", "profile", "law", "draft"):  # the profile from the record, where there is one
        value = rec.get(key) if key == "profile" and rec else settings.get(key)
        if key == "draft_model" and (settings.get("draft") not in ("model", "auto") or drafted == 0):
            value = None  # a draft model that drafted nothing in this run (plain decoding, another source)
        if value:
            parts.append(f"{key.replace('_', ' ')} {value}")
    if temp := settings.get("temp"):
        parts.append(f"T={temp:g}")
    return " · ".join(parts)


def show(*, last=None, by=None, compare=None, since=None, model=None, profile=None, file=None, plot=None,
         as_json=False, export=None, run=None, clear=None, conversations=False, conversation_id=None) -> None:
    """`mtpcli stats`: one view of the run log (a --stats-json file, the conversations) on stdout; any combination
    of flags no view can honour is refused, naming them (_refuse). `clear`: the confirmation to ask first."""
    from . import runlog

    _refuse({"--last": last, "--by": by, "--compare": compare, "--run": run, "--since": since, "--model": model,
             "--profile": profile, "--file": file, "--plot": plot, "--json": as_json, "--clear": clear,
             "--export": export, "--conversations": conversations})
    if conversations:
        from . import conversation

        return conversation.show(conversation_id, as_json)
    if clear:
        clear()
        print(f"deleted {runlog.clear()} records from {runlog.log_path()}", file=sys.stderr)
        return
    if plot:
        check_writable("--plot", plot)
        check_plot(plot)
    if file:
        try:
            doc = json.loads(open(file, encoding="utf-8").read())
        except (OSError, ValueError) as e:
            raise UsageError(f"--file {file}: {getattr(e, 'strerror', None) or e}") from None
        except RecursionError:
            raise UsageError(f"--file {file}: not a run's statistics (JSON nested too deeply)") from None
        if not isinstance(doc, dict):
            kind = "null" if doc is None else type(doc).__name__
            raise UsageError(f"--file {file}: not a run's statistics (a JSON {kind})")
        return _show_run(doc, as_json, plot, run_title(None, doc, file), f"--file {file}")
    if model:  # logged as models.canonical names it: a folder by its absolute path
        from .models import canonical

        model = canonical(model)
    records = runlog.query(last=last, since=parse_since(since) if since else None, model=model, profile=profile)
    if not records:
        raise UsageError(f"the run log {runlog.log_path()} has no matching runs")
    if run is not None:
        records = [r for r in records if r["id"] == run]
        if not records:
            filters = " (with --since, --model, --profile)" if since or model or profile else ""
            raise UsageError(f"--run {run}: no such run in the run log{filters}; `mtpcli stats --last 10` lists ids")
    if export:
        if export != "jsonl":
            raise UsageError(f"--export {export!r}: the only format is jsonl")
        for r in records:
            print(json.dumps(r))
        return
    shown = short_paths([str(r["model"]) for r in records]) if not as_json and sys.stdout.isatty() else {}
    name = lambda model: shown.get(model, model)  # noqa: E731  (a table's model: JSON keeps the whole path)
    if compare:
        doc, headers, rows = _compare(records, compare, name)
    elif by:
        doc = group_by(records, by)  # (headers in words, which a narrow column wraps)
        headers = [by, *(k.replace("_", " ") for k in next(iter(doc.values())))]
        rows = [[name(key) if by == "model" else key, *g.values()] for key, g in doc.items()]
    elif last:
        doc = records
        headers = ["id", "time", "profile", "model", "law", "tokens", "tokens/cycle", "acceptance", "decode tok/s"]
        rows = [[r["id"], datetime.fromtimestamp(r["time"]).strftime("%Y-%m-%d %H:%M:%S"), r["profile"],
                 name(r["model"]), r["settings"].get("law"), r["stats"]["generated_tokens"],
                 r["stats"]["tokens_per_cycle"], r["stats"]["acceptance_rate"], r["stats"]["decode_tps"]] for r in doc]
    else:  # the last run, or the one --run picked (none of the views above goes with --run)
        r = records[-1]
        return _show_run(r["stats"], as_json, plot, run_title(r, r["stats"], "mtpcli run"), f"run {r['id']}")
    if as_json:
        print(json.dumps(doc))
    else:
        table(headers, rows)


def _refuse(given: dict[str, Any]) -> None:
    """The first combination of `stats` flags given that no view can honour, refused naming both."""
    views = [f for f in given if f not in ("--clear", "--conversations")]
    one_run = "--plot draws one run: the last (alone) or the one --run ID names; `stats --last N` lists the ids"
    for a, b, why in [
        *[(f, "--conversations", "the conversations' view takes only --json") for f in given if f not in (
            "--json", "--conversations")],
        *[("--clear", f, "--clear deletes every record and shows nothing") for f in views],
        *[("--file", f, "--file renders one statistics file, not the run log") for f in (
            "--last", "--by", "--compare", "--since", "--model", "--profile", "--export", "--run")],
        *[("--export", f, "--export writes the records themselves, not a view of them") for f in ("--by", "--compare")],
        ("--export", "--run", "--export writes every matching record; --run shows one"),
        ("--export", "--plot", "--export writes records, --plot a run's charts"),
        ("--export", "--json", "--export jsonl is already JSON (one record a line)"),
        ("--by", "--compare", "choose one view: aggregates (--by) or a comparison (--compare)"),
        *[("--run", f, "--run shows one run in full") for f in ("--last", "--by", "--compare")],
        *[("--plot", f, one_run) for f in ("--last", "--by", "--compare")]]:
        if given.get(a) and given.get(b):
            raise UsageError(f"{a} and {b} together: {why}")


def _compare(records: list[dict], compare: list[str], name) -> tuple[dict, list[str], list[list[Any]]]:
    """--compare A --compare B: two profiles' runs (of one model), or two runs by id, metric by metric."""
    if len(compare) != 2:
        raise UsageError("--compare takes two profiles or two run ids: --compare A --compare B")
    by_id = all(re.fullmatch("[0-9]+", x) for x in compare)  # (not isdigit: '²' is a digit, not a number)
    sides = [[r for r in records if (r["id"] == int(key) if by_id else r["profile"] == key)] for key in compare]
    if (empty := next((key for key, side in zip(compare, sides) if not side), None)) is not None:
        raise UsageError(f"--compare {empty}: no matching runs in the log")
    if not by_id:  # (two run ids: one run a side, each its own model)
        one_model(sides[0] + sides[1], f"--compare {compare[0]} --compare {compare[1]}")
    rows = [["model", *(name(str(side[0]["model"])) for side in sides), None],
            *compare_rows(*(aggregate(s) for s in sides))]
    return {"a": compare[0], "b": compare[1], "rows": rows}, ["metric", *compare, "ratio B/A"], rows


def _show_run(doc: dict, as_json: bool, plot_path: str | None, title: str, name: str) -> None:
    if missing := next((k for k in REQUIRED if k not in doc), None):
        raise UsageError(f"{name}: not a run's statistics (no {missing})")
    if as_json:
        print(json.dumps(doc))
    else:
        try:  # (the rows are made before any is printed)
            render(doc, sys.stdout, sys.stdout.isatty(), title=title)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise UsageError(f"{name}: not a run's statistics ({type(e).__name__}: {e})") from None
        if doc.get("distributed"):
            from .distributed import describe

            print(describe(doc["distributed"]))
    if plot_path:
        plot(doc, plot_path, title)
        print(f"wrote {plot_path}", file=sys.stderr)


# ---- `mtpcli history stats` and `mtpcli history export` ---------------------------------------------------------

def human_count(n: float) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e4 else f"{int(n)}"


def ago(ts: float) -> str:
    s = max(0.0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def history_use(records: list[dict]) -> dict[str, Any]:
    """What the history drafter gave the runs that had it, and the share of their tokens its drafts supplied."""
    runs = [r for r in records if r["settings"].get("history") or "history" in (r["stats"].get("sources") or {})]
    src = [(r["stats"].get("sources") or {}).get("history") or {} for r in runs]
    drafted, accepted = sum(s.get("drafted", 0) for s in src), sum(s.get("accepted", 0) for s in src)
    tokens = sum(r["stats"]["generated_tokens"] for r in runs)
    return {"runs": len(runs), "cycles": sum(s.get("cycles", 0) for s in src), "drafted": drafted,
            "accepted": accepted, "acceptance": accepted / drafted if drafted else 0.0, "tokens": tokens,
            "share_of_tokens": accepted / tokens if tokens else 0.0}


def history_stats(as_json: bool = False) -> None:
    from . import history, runlog
    from .fetch import human_size

    info = history.summary()
    try:
        info["use"] = history_use(runlog.query())
    except UsageError:  # no run log (or an unreadable one): the store's own numbers only
        info["use"] = None
    if as_json:
        print(json.dumps(info, indent=1))
        return
    if not info["tokenizers"]:
        print(f"history store: empty ({info['path']})", file=sys.stderr)
    else:
        rows = [[t["tokenizer"], ", ".join(t["models"]), t["docs"], human_count(t["tokens"]),
                 human_size(t["bytes"], binary=True), t["with_prompts"], ago(t["oldest"]), ago(t["newest"])]
                for t in info["tokenizers"]]
        table(["tokenizer", "models", "outputs", "tokens", "size", "with prompts", "oldest", "newest"], rows,
              title=f"history store {info['path']} ({human_size(info['file_bytes'], binary=True)} on disk)")
    u = info["use"]
    if u and u["runs"]:
        print(f"history drafts in {u['runs']} logged runs: {human_count(u['drafted'])} tokens drafted in "
              f"{u['cycles']} cycles, {u['acceptance']:.0%} accepted; they supplied {u['share_of_tokens']:.0%} of the "
              f"{human_count(u['tokens'])} tokens those runs generated")


def history_export(text: bool = False) -> None:
    """Every kept output as a JSON line on stdout, oldest first; with TEXT, its decoded text too."""
    from . import history

    for doc in history.export():
        if text:
            tok = _tokenizer(doc["model"])
            doc["text"] = tok.decode(doc["output"]) if tok else None
        print(json.dumps(doc))


@functools.cache  # each model's loaded once
def _tokenizer(model: str):
    """The model's tokenizer; None (with a warning) where it has none."""
    from mlx_lm.utils import load_tokenizer

    from . import models

    try:
        return load_tokenizer(models.resolve(model))
    except Exception as e:  # noqa: BLE001 - the ids are still exported
        print(f"mtpcli: warning: no tokenizer for {model} ({e}); its outputs have text null", file=sys.stderr)
        return None
