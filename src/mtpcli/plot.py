"""`mtpcli stats --plot`: a run's statistics drawn (matplotlib), and the figures the drawing shows."""

from __future__ import annotations

import io
import os
from typing import Any

from .errors import UsageError
from .stats import PLAIN
from .writers import write_file


def headline(stats: dict[str, Any]) -> str:
    """The run's figures in one line: tokens per cycle, acceptance, decode tok/s."""
    acc = f"{stats.get('acceptance_rate', 0.0):.0%}" if stats.get("drafted") else "- (nothing drafted)"
    return (f"{stats.get('tokens_per_cycle', 0.0):.2f} tokens/cycle · acceptance {acc} · "
            f"decode {stats.get('decode_tps', 0.0):.1f} tok/s (committed tokens / decode s) · "
            f"{stats.get('generated_tokens', 0)} tokens in {stats.get('cycles', 0)} cycles")


def plot_data(stats: dict[str, Any]) -> dict[str, Any]:
    """What the charts draw, from a run's record: the accept-length bins of drafting cycles only (a plain step drafts
    nothing, so it is no rejected draft), and per source and position accepted / reached counts (None where the
    position was never reached)."""
    widths = {int(k): v for k, v in (stats.get("draft_width_hist") or {}).items()}
    plain = widths.get(0, 0)
    accept = {int(k): v for k, v in (stats.get("accept_length_hist") or {}).items()}
    accept[0] = accept.get(0, 0) - plain  # the width-0 cycles accepted 0 of 0 drafted
    accept = {k: v for k, v in sorted(accept.items()) if v > 0}
    sources = {k: v for k, v in (stats.get("sources") or {}).items() if k != PLAIN and v.get("drafted", 1)}
    if not sources and stats.get("drafted"):  # a record without per-source counts: the run's rates alone
        sources = {"all": {"accept_by_position": stats.get("accept_by_position") or []}}
    positions: dict[str, list[dict[str, Any]]] = {}
    depth = max((len(d.get("accept_by_position") or []) for d in sources.values()), default=0)
    for name, d in sorted(sources.items()):
        rates, reached = d.get("accept_by_position") or [], d.get("reached_by_position")
        positions[name] = rows = []
        for j in range(depth):
            n = reached[j] if reached is not None and j < len(reached) else None
            if j >= len(rates) or n == 0:
                rows.append({"position": j + 1, "rate": None, "accepted": 0, "reached": 0, "label": "never reached"})
            else:
                a = round(rates[j] * n) if n is not None else None
                rows.append({"position": j + 1, "rate": rates[j], "accepted": a, "reached": n,
                             "label": f"{a}/{n}" if n is not None else f"{rates[j]:.2f}"})
    return {"accept_hist": accept, "width_hist": dict(sorted(widths.items())), "plain_steps": plain,
            "drafting_cycles": sum(accept.values()), "positions": positions, "headline": headline(stats)}


def check(path: str) -> str:
    """Before the view: matplotlib is there and writes PATH's format (its extension; png without one), returned."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'mtpcli[plot]' (or pip install matplotlib)") from None
    fmt = os.path.splitext(path)[1][1:].lower() or "png"
    if fmt not in (known := FigureCanvasBase.get_supported_filetypes()):
        raise UsageError(f"--plot {path}: matplotlib writes no .{fmt} files; name a .png (or "
                         f"{', '.join(sorted(known))})")
    return fmt


def plot(stats: dict[str, Any], path: str, title: str = "mtpcli run") -> None:
    """Four charts a reader can read alone: what was accepted, how wide the drafts were, acceptance by position per
    source, and the source and width chosen over the run; the run's headline figures under the title."""
    fmt = check(path)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    data = plot_data(stats)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    fig.suptitle(f"{title}\n{data['headline']}", fontsize=10)

    def empty(a, why):  # a chart with nothing to draw says so (no made-up axes)
        a.text(0.5, 0.5, why, ha="center", va="center", transform=a.transAxes, color="grey")
        a.set_xticks([])
        a.set_yticks([])

    def whole(a, keys):  # one tick per whole number the bars span (one bar alone: no -0.4..0.4 ticks)
        a.set_xticks(range(min(keys), max(keys) + 1))
        a.set_xlim(min(keys) - 0.6, max(keys) + 0.6)

    def histogram(a, hist, why):
        if not hist:
            return empty(a, why)
        a.bar(list(hist), list(hist.values()))
        whole(a, list(hist))

    ax[0, 0].set(title=f"Accepted draft tokens per drafting cycle ({data['plain_steps']} plain steps not counted)",
                 xlabel="draft tokens accepted in a cycle", ylabel="cycles")
    histogram(ax[0, 0], data["accept_hist"], "no drafting cycles: every cycle was a plain step")
    ax[0, 1].set(title="Draft width per cycle (0 = plain step)", xlabel="tokens drafted in a cycle", ylabel="cycles")
    histogram(ax[0, 1], data["width_hist"], "no cycles")
    a = ax[1, 0]
    a.set(title="Acceptance by draft position, per source (accepted/reached)",
          xlabel="draft position (1 = first drafted token)", ylabel="accepted / reached")
    positions = data["positions"]
    if positions:
        width = 0.8 / len(positions)
        for i, (name, rows) in enumerate(positions.items()):
            xs = [r["position"] + (i - (len(positions) - 1) / 2) * width for r in rows]
            bars = a.bar(xs, [r["rate"] or 0.0 for r in rows], width, label=name)
            for x, r, b in zip(xs, rows, bars):
                a.text(x, (r["rate"] or 0.0) + 0.01, r["label"] if r["rate"] is not None else "never\nreached",
                       ha="center", va="bottom", fontsize=7, rotation=90 if len(rows) * len(positions) > 12 else 0,
                       color=b.get_facecolor() if r["rate"] is not None else "grey")
        a.set_ylim(0, 1.15)
        whole(a, [r["position"] for rows in positions.values() for r in rows])
        a.legend(title="source")
    else:
        empty(a, "nothing drafted: no acceptance by position")
    a = ax[1, 1]
    a.set(title="Source and draft width chosen, cycle by cycle", xlabel="cycle", ylabel="draft width (tokens)")
    widths, names = stats.get("width_trace", []), stats.get("source_trace", [])
    if not widths:
        empty(a, "no cycles")
    elif names and len(names) == len(widths):
        for name in sorted(set(names)):
            xs = [i + 1 for i, n in enumerate(names) if n == name]
            a.scatter(xs, [widths[i - 1] for i in xs], s=10, label=name, color="grey" if name == PLAIN else None)
        a.legend(title="source", fontsize=8)
    else:
        a.plot(range(1, len(widths) + 1), widths, drawstyle="steps-mid")
    if widths and not any(widths):
        a.set_ylim(-0.5, 1.5)  # plain decoding: width 0 throughout, on whole-number ticks
    if widths:
        ax[1, 1].xaxis.set_major_locator(MaxNLocator(integer=True))
    for a in (ax[0, 0], ax[0, 1], ax[1, 1]):
        if a.get_yticks().size:
            a.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    plt.close(fig)
    write_file("--plot", path, buf.getvalue())
