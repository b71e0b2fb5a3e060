"""Plotly figures of the web app, built by pure functions from plain data (no Streamlit, no I/O).

Each function returns a `go.Figure`; tests read the data back from its traces.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from meshplan.planner.palette import MEMORY_STYLE, STATUS_COLORS, TIME_STYLE

MEMORY_LABELS = {k: v.label for k, v in MEMORY_STYLE.items()}
MEMORY_COLORS = {k: v.color for k, v in MEMORY_STYLE.items()}
TIME_LABELS = {k: v.label for k, v in TIME_STYLE.items()}
USABLE_COLOR = STATUS_COLORS["usable"]
LIMIT_COLOR = STATUS_COLORS["limit"]
FIT_COLOR = STATUS_COLORS["fits"]
GREY = "rgba(140,140,140,0.35)"
FONT = dict(family="Source Sans Pro, sans-serif", size=13)
# Figures take their background and text colour from Streamlit's theme (light or dark); the few fixed colours are
# mid-greys that read on both.
NEUTRAL = "#8c8c8c"  # secondary text, faint edges
OUTLINE = "#707070"  # marker outlines


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0, xanchor="left", font=dict(size=15)) if title else None,
        height=height, margin=dict(l=10, r=10, t=50 if title else 20, b=10), font=FONT,
        legend=dict(orientation="h", yanchor="top", y=-0.15, x=0, xanchor="left"),
        hoverlabel=dict(align="left"),
    )
    return fig


LEGEND_ROW = 20  # px a legend entry takes at the figures' legend font


def _bar_layout(title: str, plot_height: int, left: int, axis_below: int, entries: int, **layout) -> dict:
    """The layout of a stacked-bar figure whose margins are given, not measured.

    Axes without automargin (Streamlit's theme turns it on: plotly then measures the tick labels and grows the
    margins, drawing again) and a legend of `entries` in one column at the figure's bottom, in a margin kept for it
    (its height does not depend on the chart's width, so the legend never pushes the plot). `left` holds the y tick
    labels and y title, `axis_below` the x tick labels (and x title) between the plot and the legend. Drawing the
    chosen plan's two charts in Chromium took about a quarter less time than with measured margins."""
    legend_height = LEGEND_ROW * entries + 10
    top = 50 if title else 20
    return dict(
        title=dict(text=title, x=0, xanchor="left", font=dict(size=15)) if title else None,
        height=top + plot_height + axis_below + legend_height, font=FONT,
        margin=dict(l=left, r=10, t=top, b=axis_below + legend_height),
        legend=dict(orientation="v", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
        hoverlabel=dict(align="left"), barmode="stack", **layout,
    )


def _text_px(text: str) -> int:
    """About how wide `text` is at the figures' tick font (12 px): the room a tick label takes."""
    return 7 * len(text) + 4


def memory_bars(bars: Sequence[tuple[str, dict[str, float]]], usable_gib: float, limit_gib: float,
                title: str = "") -> go.Figure:
    """Per-GPU memory as bars stacked by category (GiB), one bar per (label, breakdown), with a line at the
    usable HBM and one at the safety margin's limit. Categories in MEMORY_LABELS order, those every bar holds
    none of left out; a bar's segments sum to its peak (the breakdown includes fragmentation: peak = reserved
    memory)."""
    labels = [b[0] for b in bars]
    held = {c for b in bars for c, v in b[1].items() if v}
    cats = [c for c in MEMORY_LABELS if c in held] + sorted(held - set(MEMORY_LABELS))
    # traces as dicts: go.Figure builds each once (a go.Bar would be validated again when the figure copies it)
    traces = [dict(
        type="bar", x=labels, y=[float(b[1].get(cat, 0.0)) for b in bars], name=MEMORY_LABELS.get(cat, cat),
        marker_color=MEMORY_COLORS.get(cat), meta=cat,
        hovertemplate="%{x}<br>" + html.escape(MEMORY_LABELS.get(cat, cat)) + ": %{y:.2f} GiB<extra></extra>",
    ) for cat in cats]
    totals = [sum(float(v) for v in b[1].values()) for b in bars]
    traces.append(dict(
        type="scatter",
        # inside the bar's top: a chosen plan's peak sits near the margin and usable lines, which a label
        # above the bar would collide with
        # white with a contrasting shadow: it sits on the top segment (the brown fragmentation one, as a rule) in
        # both colour schemes, where the theme's default text colour was hard to read in light mode
        x=labels, y=totals, mode="text", text=[f"{t:.1f}" for t in totals], textposition="bottom center",
        textfont=dict(color="#ffffff", shadow="auto"),
        showlegend=False, hoverinfo="skip", name="peak", meta="peak",
    ))
    lines = [_hline(usable_gib, dict(color=USABLE_COLOR, width=2), f"usable HBM {usable_gib:.1f} GiB", "bottom")]
    if abs(limit_gib - usable_gib) > 1e-6:
        lines.append(_hline(limit_gib, dict(color=LIMIT_COLOR, width=2, dash="dash"),
                            f"margin limit {limit_gib:.1f} GiB", "top"))
    top = max([usable_gib, *totals]) * 1.12
    return go.Figure(traces, _bar_layout(
        title, 240, left=40 + _text_px(f"{top:.0f}" if top >= 10 else "0.5"), axis_below=30, entries=len(cats),
        shapes=[shape for shape, _ in lines], annotations=[note for _, note in lines],
        yaxis=dict(title="GiB per GPU (peak reserved)", range=[0, top], automargin=False),
        xaxis=dict(type="category", automargin=False), bargap=0.35 if len(bars) > 1 else 0.6,
    ))


def _hline(y: float, line: dict, text: str, anchor: str) -> tuple[dict, dict]:
    """(a horizontal line across the plot at `y`, its label at the right end, above it (`anchor` "bottom") or
    below it ("top")), as layout dicts: what fig.add_hline makes, at a tenth of its cost per rerun."""
    shape = dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=y, y1=y, line=line)
    note = dict(xref="paper", x=1, xanchor="right", yref="y", y=y, yanchor=anchor, text=text, showarrow=False,
                font=dict(color=line["color"]))
    return shape, note


def bar_totals(fig: go.Figure) -> list[float]:
    """Sum of the stacked segments of each bar of a `memory_bars` / `time_bars` figure."""
    bars = [t for t in fig.data if t.type == "bar"]
    if not bars:
        return []
    orient_h = bars[0].orientation == "h"
    return list(np.sum([np.asarray(t.x if orient_h else t.y, dtype=float) for t in bars], axis=0))


def time_bars(bars: Sequence[tuple[str, dict[str, float]]], title: str = "") -> go.Figure:
    """Where one optimizer step's time goes, stacked horizontal bars (seconds), one per (label, breakdown).
    Exposed communication only: overlapped communication costs nothing here."""
    labels = [b[0] for b in bars]
    cats = [c for c in TIME_LABELS if any(b[1].get(c, 0) > 0 for b in bars)]
    traces = [dict(
        type="bar", y=labels, x=[float(b[1].get(cat, 0.0)) for b in bars], name=TIME_LABELS[cat], orientation="h",
        marker_color=TIME_STYLE[cat].color, meta=cat,
        hovertemplate="%{y}<br>" + TIME_LABELS[cat] + ": %{x:.3f} s<extra></extra>",
    ) for cat in cats]
    layout = _bar_layout(title, 40 + 40 * len(bars), left=10 + max(map(_text_px, labels), default=0), axis_below=50,
                         entries=len(cats),
                         xaxis=dict(title=dict(text="seconds per optimizer step", standoff=4), automargin=False),
                         yaxis=dict(autorange="reversed", type="category", automargin=False))
    layout["legend"]["traceorder"] = "normal"
    return go.Figure(traces, layout)


def sweep_scatter(points: pd.DataFrame, limit_gib: float, usable_gib: float, chosen_index: int | None = None,
                  title: str = "") -> go.Figure:
    """Throughput (tokens/s/GPU) against peak memory for every estimated configuration of a sweep.

    `points` comes from `ui.web.compute.sweep_points`. Traces: `fits` (coloured), `does not fit` (grey,
    the rejection reason on hover), `Pareto front` (the non-dominated fitting configurations, joined by
    a line) and `chosen`. Every trace's `customdata[:, 0]` is the configuration's index in the sweep.
    """
    fig = go.Figure()
    fits, oom = points[points.fits], points[~points.fits]

    def hover(df: pd.DataFrame, with_reason: bool) -> list[str]:
        more = np.where(df["count"] > 1, "<br>(+" + (df["count"] - 1).astype(str) + " similar)", "")
        text = df["label"].map(html.escape) + more
        if with_reason:
            text = text + "<br><i>" + df["reason"].map(html.escape) + "</i>"
        return list(text)

    if len(oom):
        fig.add_trace(go.Scattergl(
            x=oom.peak_gib, y=oom.tps, mode="markers", name="does not fit (memory)",
            marker=dict(color=GREY, size=5), customdata=np.stack([oom["index"], oom["count"]], axis=1),
            text=hover(oom, True), hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:,.0f} tok/s/GPU<extra>does not fit</extra>",
        ))
    if len(fits):
        fig.add_trace(go.Scattergl(
            x=fits.peak_gib, y=fits.tps, mode="markers", name="fits",
            marker=dict(color=fits.mfu * 100, colorscale="Viridis", size=6, opacity=0.8,
                        colorbar=dict(title="MFU %", thickness=12, len=0.75)),
            customdata=np.stack([fits["index"], fits["count"]], axis=1), text=hover(fits, False),
            hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:,.0f} tok/s/GPU, MFU %{marker.color:.1f}%<extra>fits</extra>",
        ))
    front = points[points.pareto].sort_values("peak_gib")
    if len(front):
        fig.add_trace(go.Scatter(
            x=front.peak_gib, y=front.tps, mode="lines+markers", name="Pareto front",
            line=dict(color=STATUS_COLORS["oom"], width=2, shape="hv"), marker=dict(size=9, symbol="diamond"),
            customdata=np.stack([front["index"], front["count"]], axis=1), text=list(front["label"].map(html.escape)),
            hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:,.0f} tok/s/GPU<extra>Pareto</extra>",
        ))
    if chosen_index is not None and (points["index"] == chosen_index).any():
        ch = points[points["index"] == chosen_index]
        fig.add_trace(go.Scatter(
            x=ch.peak_gib, y=ch.tps, mode="markers", name="chosen",
            marker=dict(size=18, symbol="star", color=STATUS_COLORS["chosen"], line=dict(color=OUTLINE, width=1.5)),
            customdata=np.stack([ch["index"], ch["count"]], axis=1), text=list(ch["label"].map(html.escape)),
            hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:,.0f} tok/s/GPU<extra>chosen</extra>",
        ))
    # vertical lines as traces (shapes and annotations on a log axis take log10 coordinates)
    y_top = float(np.nanmax(points.tps)) * 1.05 if len(points) else 1.0
    fig.add_trace(go.Scatter(x=[usable_gib, usable_gib], y=[0, y_top], mode="lines", name=f"usable HBM {usable_gib:.1f} GiB",
                             line=dict(color=USABLE_COLOR, width=2), hoverinfo="skip", meta="usable"))
    if abs(limit_gib - usable_gib) > 1e-6:
        fig.add_trace(go.Scatter(x=[limit_gib, limit_gib], y=[0, y_top], mode="lines",
                                 name=f"margin limit {limit_gib:.1f} GiB", hoverinfo="skip", meta="limit",
                                 line=dict(color=LIMIT_COLOR, width=2, dash="dash")))
    fig.update_layout(
        xaxis=dict(title="peak memory per GPU (GiB, log scale)", type="log"),
        yaxis=dict(title="tokens / s / GPU", rangemode="tozero"),
    )
    return _layout(fig, title, 520)


def scatter_indices(fig: go.Figure, name: str) -> np.ndarray:
    """Sweep indices of the points of one trace of a `sweep_scatter` figure."""
    for t in fig.data:
        if t.name == name:
            return np.asarray(t.customdata, dtype=np.int64)[:, 0]
    return np.array([], dtype=np.int64)


def decision_tree_figure(steps: Sequence[dict]) -> go.Figure:
    """The decision tree of `planner.tree.decision_tree` as an interactive flow: one node per step, top to
    bottom (green: taken, light: fits but not worth it, red: nothing fits); the closest rejected
    alternatives branch off to the left in grey. Hover shows configuration, memory, throughput, reason."""
    fig = go.Figure()
    n = len(steps)
    ys = [-k for k in range(n)]
    xs, colors, symbols, hovers = [], [], [], []
    for k, s in enumerate(steps):
        best = s.get("best")
        if best is None:
            colors.append(STATUS_COLORS["oom"])
            symbols.append("x")
        elif s.get("taken"):
            colors.append(STATUS_COLORS["taken"])
            symbols.append("circle")
        else:
            colors.append("#c7e9c0")
            symbols.append("circle-open")
        xs.append(0.0)
        body = [f"<b>{k + 1}. {html.escape(s['label'])}</b>", html.escape(s.get("adds", ""))]
        own = s.get("feature_best")
        if best and own and not s.get("taken"):
            body.append(f"best with it: {html.escape(own['summary'])}")
            body.append(f"{own['peak_gib']:.1f} GiB, {own['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU, "
                        f"MFU {own['mfu'] * 100:.1f}%")
        elif best:
            body.append(f"best: {html.escape(best['summary'])}")
            body.append(f"{best['peak_gib']:.1f} GiB, {best['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU, "
                        f"MFU {best['mfu'] * 100:.1f}%")
        body.append("<i>" + html.escape(s.get("reason", "")) + "</i>")
        hovers.append("<br>".join(body))
    # edges along the main path
    for k in range(n - 1):
        nxt = steps[k + 1]
        taken = bool(nxt.get("taken")) and nxt.get("best") is not None
        fig.add_trace(go.Scatter(
            x=[0, 0], y=[ys[k], ys[k + 1]], mode="lines", hoverinfo="skip", showlegend=False,
            line=dict(color=STATUS_COLORS["taken"] if taken else "#bbbbbb", width=3 if taken else 2, dash=None if taken else "dot"),
        ))
    # rejected alternatives, branching left
    alt_x, alt_y, alt_text = [], [], []
    for k, s in enumerate(steps):
        for j, r in enumerate(s.get("rejected", [])[:3]):
            x = -0.09 * (j + 1)
            fig.add_trace(go.Scatter(x=[0, x], y=[ys[k], ys[k] - 0.25], mode="lines", hoverinfo="skip",
                                     showlegend=False, line=dict(color=NEUTRAL, width=1)))
            alt_x.append(x)
            alt_y.append(ys[k] - 0.25)
            alt_text.append(f"rejected at step {k + 1}: {html.escape(r['summary'])}<br>"
                            f"{r['peak_gib']:.1f} GiB, {r['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU<br>"
                            f"<i>{html.escape(r.get('reason', ''))}</i>")
    if alt_x:
        fig.add_trace(go.Scatter(x=alt_x, y=alt_y, mode="markers", name="closest rejected (memory)",
                                 marker=dict(color="#aaaaaa", size=9, symbol="x-thin-open", line=dict(width=2)),
                                 text=alt_text, hovertemplate="%{text}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="markers", name="step", showlegend=False,
        marker=dict(size=22, color=colors, symbol=symbols, line=dict(color=OUTLINE, width=1.5)),
        text=hovers, hovertemplate="%{text}<extra></extra>", customdata=[s["key"] for s in steps],
    ))
    for k, s in enumerate(steps):
        best = s.get("best")
        own = s.get("feature_best")
        head = f"<b>{k + 1}. {html.escape(s['label'])}</b>"
        lines = []
        if best and own and not s.get("taken"):  # not taken: what the step's own feature reaches
            head += f"   with it: {own['peak_gib']:.1f} GiB, {own['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU"
            lines.append(html.escape(own["summary"]))
        elif best:
            head += f"   {best['peak_gib']:.1f} GiB, {best['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU"
            lines.append(html.escape(best["summary"]))
        elif s["key"] != "ac":
            head += "   nothing fits"
        lines.append(f"<span style='color:{NEUTRAL}'>{_wrap(s.get('reason', ''), 110)}</span>")
        fig.add_annotation(x=0.05, y=ys[k], xanchor="left", yanchor="middle", showarrow=False, align="left",
                           text="<br>".join([head, *lines]))
    for name, color, symbol in (("taken", STATUS_COLORS["taken"], "circle"), ("fits, not worth it", "#c7e9c0", "circle-open"),
                                ("nothing fits", STATUS_COLORS["oom"], "x")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(size=12, color=color, symbol=symbol, line=dict(color=OUTLINE, width=1))))
    fig.update_layout(
        xaxis=dict(visible=False, range=[-0.33, 1.7], fixedrange=False),
        yaxis=dict(visible=False, range=[-n + 0.4, 0.6]),
    )
    fig = _layout(fig, "", 105 * n + 80)
    fig.update_layout(legend=dict(y=1.02, yanchor="bottom"), margin=dict(t=40))
    return fig


def _wrap(text: str, width: int) -> str:
    """`text` HTML-escaped and wrapped at `width` characters with <br>."""
    import textwrap

    return "<br>".join(html.escape(line) for line in textwrap.wrap(text, width)) if text else ""


def hardware_figure(rows: Sequence[dict], title: str = "") -> go.Figure:
    """The same job on several hardware profiles: throughput per GPU, days and cost (bars per profile).
    Profiles where nothing fits get an empty bar labelled 'does not fit'."""
    ids = [r["hardware"] for r in rows]
    have_days = any(r.get("days") is not None for r in rows)
    have_cost = any(r.get("cost_usd") is not None for r in rows)
    panels = [("tokens_per_sec_per_gpu", "tokens / s / GPU", "{:,.0f}")]
    if have_days:
        panels.append(("days", "days to train the budget", "{:,.1f}"))
    if have_cost:
        panels.append(("cost_usd", "cost (US$)", None))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels], horizontal_spacing=0.08)
    colors = ["#4c78a8", "#f58518", "#54a24b", STATUS_COLORS["oom"], "#72b7b2", "#b279a2", "#eeca3b", "#9d755d"]
    for col, (key, label, fmt) in enumerate(panels, 1):
        vals = [r.get(key) for r in rows]
        text = [(fmt.format(v) if fmt else _usd(v)) if v is not None else "does not fit" if not r["fits"]
                else "no price" for v, r in zip(vals, rows, strict=True)]
        fig.add_trace(go.Bar(
            x=ids, y=[v if v is not None else 0 for v in vals], text=text, textposition="outside",
            marker_color=[colors[k % len(colors)] for k in range(len(ids))], name=label, showlegend=False,
            meta=key, cliponaxis=False,
            hovertext=[f"{r['name']}: {r['nodes']} x {r['gpus'] // max(r['nodes'], 1)} GPUs<br>"
                       + (html.escape(r["configuration"]) if r["fits"] else _wrap(r["why_not"], 80))
                       for r in rows],
            hovertemplate="%{hovertext}<extra></extra>",
        ), row=1, col=col)
        top = max([v for v in vals if v is not None] or [1])
        fig.update_yaxes(range=[0, top * 1.2], row=1, col=col)
    fig = _layout(fig, title, 400)
    fig.update_layout(margin=dict(t=80 if title else 40))
    return fig


def _usd(v: float) -> str:
    """$ amounts in three significant digits: $950, $12.3k, $2.1M."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"${v / div:.3g}{unit}"
    return f"${v:,.0f}"


SCAN_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#72b7b2", "#eeca3b"]


def capacity_figure(rows: Sequence[dict], deadline_days: float | None = None, budget_usd: float | None = None,
                    title: str = "") -> go.Figure:
    """Throughput per GPU, days and cost against node count (one line per accelerator; log-2 node axis), with the
    deadline and the budget as dashed lines. Clusters where nothing fits are left out of the lines."""
    have_days = any(r.get("days") is not None for r in rows)
    panels = [("tokens_per_sec_per_gpu", "tokens / s / GPU")]
    if have_days:
        panels += [("days", "days to train the budget"), ("cost_usd", "cost (US$)")]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels], horizontal_spacing=0.07)
    hws = list(dict.fromkeys(r["hardware"] for r in rows))
    for k, hw in enumerate(hws):
        mine = sorted((r for r in rows if r["hardware"] == hw and r["fits"]), key=lambda r: r["nodes"])
        for col, (key, _) in enumerate(panels, 1):
            pts = [r for r in mine if r.get(key) is not None]
            fig.add_trace(go.Scatter(
                x=[r["nodes"] for r in pts], y=[r[key] for r in pts], mode="lines+markers", name=hw, meta=key,
                legendgroup=hw, showlegend=col == 1, line=dict(color=SCAN_COLORS[k % len(SCAN_COLORS)]),
                marker=dict(size=[11 if r["current"] else 7 for r in pts],
                            symbol=["diamond" if r["current"] else "circle" for r in pts]),
                hovertext=[f"{hw}: {r['nodes']} nodes ({r['gpus']} GPUs)<br>{html.escape(r['configuration'])}<br>"
                           f"{r['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU"
                           + (f", {r['days']:,.1f} days" if r.get("days") is not None else "")
                           + (f", {_usd(r['cost_usd'])}" if r.get("cost_usd") is not None else "") for r in pts],
                hovertemplate="%{hovertext}<extra></extra>",
            ), row=1, col=col)
    for col, (key, _) in enumerate(panels, 1):
        fig.update_xaxes(type="log", title_text="nodes", row=1, col=col,
                         tickvals=sorted({r["nodes"] for r in rows}), ticktext=[str(n) for n in sorted({r["nodes"] for r in rows})])
        if key == "days" and deadline_days:
            fig.add_hline(y=deadline_days, line_dash="dash", line_color=LIMIT_COLOR, row=1, col=col,
                          annotation_text=f"deadline {deadline_days:g} d", annotation_position="top left")
        if key == "cost_usd" and budget_usd:
            fig.add_hline(y=budget_usd, line_dash="dash", line_color=LIMIT_COLOR, row=1, col=col,
                          annotation_text=f"budget {_usd(budget_usd)}", annotation_position="top left")
        if key in ("days", "cost_usd"):
            # an explicit range: a line's annotation otherwise stretches plotly's log autorange to 1e60
            vals = [r[key] for r in rows if r["fits"] and r.get(key)]
            vals += [v for v in ((deadline_days,) if key == "days" else (budget_usd,)) if v]
            if vals:
                fig.update_yaxes(type="log", row=1, col=col,
                                 range=[np.log10(min(vals)) - 0.1, np.log10(max(vals)) + 0.15])
    fig = _layout(fig, title, 420)
    fig.update_layout(margin=dict(t=80 if title else 40))
    return fig


def seq_memory_figure(points: Sequence[dict], usable_gib: float, title: str = "") -> go.Figure:
    """Peak memory per GPU against sequence length for one configuration (the global batch held in tokens), with
    the planner's limit and the usable HBM; lengths the configuration cannot run are marked on the axis."""
    ok = [p for p in points if p["peak_gib"] is not None]
    fig = go.Figure()
    limit = points[0]["limit_gib"] if points else 0.0
    fig.add_trace(go.Scatter(
        x=[p["seq_len"] for p in ok], y=[p["peak_gib"] for p in ok], mode="lines+markers", name="peak GiB",
        marker=dict(size=[12 if p["current"] else 7 for p in ok],
                    color=[FIT_COLOR if p["peak_gib"] <= limit else STATUS_COLORS["oom"] for p in ok]),
        hovertext=[f"seq {p['seq_len']:,}: {p['peak_gib']:.1f} GiB (global batch {p['global_batch_size']:,} sequences)"
                   for p in ok], hovertemplate="%{hovertext}<extra></extra>",
    ))
    bad = [p for p in points if p["peak_gib"] is None]
    if bad:
        fig.add_trace(go.Scatter(
            x=[p["seq_len"] for p in bad], y=[limit] * len(bad), mode="markers", name="cannot run",
            marker=dict(symbol="x", color=GREY, size=9),
            hovertext=[_wrap(f"seq {p['seq_len']:,}: {p['why_not']}", 80) for p in bad],
            hovertemplate="%{hovertext}<extra></extra>",
        ))
    fig.add_hline(y=limit, line_dash="dash", line_color=LIMIT_COLOR, annotation_text=f"limit {limit:.1f} GiB",
                  annotation_position="top left")
    fig.add_hline(y=usable_gib, line_dash="dot", line_color=USABLE_COLOR,
                  annotation_text=f"usable {usable_gib:.1f} GiB", annotation_position="bottom left")
    fig.update_xaxes(type="log", title_text="sequence length (tokens)", tickvals=[p["seq_len"] for p in points],
                     ticktext=[f"{p['seq_len'] // 1024}k" if p["seq_len"] >= 1024 else str(p["seq_len"]) for p in points])
    # log: 16 GiB at 1k and 700 GiB at 128k both read; an explicit range (the lines' labels stretch the autorange)
    vals = [p["peak_gib"] for p in ok] + [limit, usable_gib]
    fig.update_yaxes(title_text="peak GiB per GPU (log)", type="log",
                     range=[np.log10(min(vals)) - 0.1, np.log10(max(vals)) + 0.15])
    return _layout(fig, title, 380)
