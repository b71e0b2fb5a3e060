"""Widgets of the terminal UI: the memory bars and the chosen plan's details (plain Rich text, no plots)."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import DataTable

from meshplan.planner.palette import MEMORY_STYLE
from meshplan.ui.tui.form import fmt_count, fmt_days, fmt_money, fmt_tokens

# memory category -> (short label, colour), from the one palette the web app uses too
CATEGORIES = {k: (v.short, v.color) for k, v in MEMORY_STYLE.items()}
LIMIT_MARK, USABLE_MARK = "│", "┃"


def cell(text: str, style: str = "", right: bool = True) -> Text:
    """A table cell, right-aligned unless `right` is False."""
    return Text(text, style=style, justify="right" if right else "left")


def column_widths(columns: list[tuple[str, Text]], rows: list[tuple[str, list[Text]]],
                  extra: dict[str, int] | None = None) -> list[int]:
    """Each column's width in cells (padding not counted): its widest cell or label, plus `extra` for its key."""
    return [max([label.cell_len, *(cells[n].cell_len for _, cells in rows)]) + (extra or {}).get(key, 0)
            for n, (key, label) in enumerate(columns)]


def fill(table: DataTable, columns: list[tuple[str, Text]], rows: list[tuple[str, list[Text]]],
         extra: dict[str, int] | None = None) -> None:
    """Replace a table's columns and rows, with column widths measured here from the cells: the same
    layout on every frame (DataTable would otherwise measure lazily, on idle)."""
    table.clear(columns=True)
    for (key, label), width in zip(columns, column_widths(columns, rows, extra), strict=True):
        table.add_column(label, key=key, width=width)
    for key, cells in rows:
        table.add_row(*cells, key=key)
MAX_STAGE_BARS = 16


def memory_bar(breakdown: dict[str, float], width: int, scale_gib: float, limit_gib: float,
               usable_gib: float) -> Text:
    """One stacked bar, `width` cells for `scale_gib`: the categories in colour, then `·` up to the limit
    (the margin's share of usable HBM) marked `│`, then `░` up to usable HBM marked `┃`."""
    width = max(width, 4)
    per_cell = scale_gib / width
    cells: list[tuple[str, str]] = []
    total = 0.0
    for key, (_, colour) in CATEGORIES.items():
        start = round(total / per_cell)
        total += max(breakdown.get(key, 0.0), 0.0)
        end = min(round(total / per_cell), width)
        cells.extend([("█", colour)] * (end - start))
    cells = cells[:width]
    used = len(cells)
    limit_cell = min(int(limit_gib / per_cell), width - 1)
    usable_cell = min(int(usable_gib / per_cell), width - 1)
    for c in range(used, width):
        if c < limit_cell:
            cells.append(("·", "dim"))
        elif c < usable_cell:
            cells.append(("░", "dim"))
        else:
            cells.append((" ", ""))
    over = total > limit_gib
    if limit_cell >= used or over:
        cells[limit_cell] = (LIMIT_MARK, "bold red" if over else "bold")
    if usable_cell != limit_cell and (usable_cell >= used or total > usable_gib):
        cells[usable_cell] = (USABLE_MARK, "bold red" if total > usable_gib else "bold")
    text = Text()
    for ch, style in cells:
        text.append(ch, style)
    return text


def legend(breakdown: dict[str, float], width: int = 80) -> Text:
    """`█ params 4.1  █ grads 4.1 ...`, wrapped between items (never inside one) at `width`."""
    text = Text()
    line = 0
    for key, (label, colour) in CATEGORIES.items():
        value = breakdown.get(key, 0.0)
        if value < 0.05:
            continue
        item = f"{label} {value:.1f}"
        need = len(item) + 2
        if line and line + 2 + need > width:
            text.append("\n")
            line = 0
        elif line:
            text.append("  ")
            line += 2
        text.append("█ ", colour)
        text.append(item)
        line += need
    return text


def warn_style(dark: bool) -> str:
    """Warnings and differences: yellow on dark backgrounds, a darker amber on light ones."""
    return "yellow" if dark else "#9a6700"


def detail_text(info: dict, width: int, dark: bool = True) -> Text:
    """The chosen plan: configuration, throughput, time-to-train and cost, memory bars (per stage for PP)."""
    est = info["estimate"]
    mem, thr = est["memory"], est["throughput"]
    out = Text(no_wrap=False)
    out.append(f"#{info['rank']} ", "bold")
    out.append(info["summary"], "bold")
    if info.get("defaults_left"):  # the default words the table's configuration header had no room for
        more = f"header …: {' '.join(info['defaults_left'])}"
        out.append("  " if out.cell_len + 2 + len(more) <= width else "\n")
        out.append(more, "dim")
    out.append("\n")
    out.append(f"{thr['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU", "bold")
    tlo, thi = thr["tokens_per_sec_per_gpu_interval"]
    out.append(f" (80 %: {tlo:,.0f}-{thi:,.0f})", "dim")
    out.append(f" · MFU {thr['mfu']:.1%} · step {thr['step_time_s']:.2f} s")
    t = info.get("train")
    if t:
        out.append(f" · {fmt_tokens(info['tokens'])} tok: ")
        out.append(fmt_days(t["days"]), "bold")
        if t["cost_usd"] is not None:
            out.append(" · ")
            out.append(fmt_money(t["cost_usd"]), "bold")
            out.append(f" · {fmt_count(t['gpu_hours'])} GPU-h at ${info['price']:.2f}")
    out.append("\n")
    peak, usable, limit = mem["peak_gib"], mem["usable_gib"], info["limit_gib"]
    out.append(f"memory {peak:.1f} GiB", "bold")
    out.append(f" (80 %: {mem['peak_gib_interval'][0]:.1f}-{mem['peak_gib_interval'][1]:.1f}, fits "
               f"{mem['fit_probability']:.0%})", "dim")
    out.append(f" · {LIMIT_MARK} limit {limit:.1f} ({info['margin']:.0%}) · {USABLE_MARK} usable {usable:.1f}"
               f" · headroom {limit - peak:.1f}")
    if "host_limit_gib" in info:  # host RAM per node beside the GPU's: pinned offloaded state, processes, loading
        out.append("\n")
        out.append(f"host RAM {mem['host_ram_gib_per_node']:,.0f} GiB/node", "bold")
        out.append(f" of {info['host_limit_gib']:,.0f}")
        offloaded = mem.get("host_ram_offloaded_gib_per_node", 0.0)
        if offloaded:
            out.append(f" · {offloaded:,.0f} GiB offloaded state (FSDP CPU offload)")
    stages = mem.get("per_stage") or []
    label_w = 9 if stages else 8
    bar_w = max(10, width - label_w - 6)
    scale = max(usable, peak) * 1.0001
    rows = ([(f"stage {s['stage']}", s["breakdown_gib"], s["peak_gib"]) for s in stages[:MAX_STAGE_BARS]]
            if stages else [("per GPU", mem["breakdown_gib"], peak)])
    for label, breakdown, p in rows:
        out.append("\n")
        out.append(f"{label:<{label_w - 1}} ", "dim")
        out.append_text(memory_bar(breakdown, bar_w, scale, limit, usable))
        out.append(f"{p:6.1f}")
    if len(stages) > MAX_STAGE_BARS:
        out.append(f"\n… {len(stages) - MAX_STAGE_BARS} more stages", "dim")
    out.append("\n")
    out.append_text(legend(mem["breakdown_gib"], width))
    if stages:
        out.append(f"  (legend: {mem['worst_rank']})", "dim")
    for w in est.get("warnings", []):
        out.append("\n")
        out.append(f"! {w}", warn_style(dark))
    return out


class PlanDetail(Widget):
    """The highlighted plan of the ranked table; empty until a sweep has finished."""

    DEFAULT_CSS = "PlanDetail { height: auto; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.info: dict | None = None
        self.placeholder = "computing the first sweep…"

    def show(self, info: dict | None, placeholder: str | None = None) -> None:
        self.info = info
        if placeholder is not None:
            self.placeholder = placeholder
        self.refresh(layout=True)

    def render(self) -> Text:
        if self.info is None:
            return Text(self.placeholder, style="dim")
        dark = getattr(self.app.current_theme, "dark", True)
        return detail_text(self.info, self.content_region.width or self.size.width or 80, dark)


class Panel(VerticalScroll):
    """A scrolling panel that `z` may maximize."""

    ALLOW_MAXIMIZE = True


class CursorTable(DataTable):
    """A DataTable that keeps its cursor row in view when it is resized (the panel below it grows with
    the chosen plan: one bar per pipeline stage)."""

    def on_resize(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.cursor_row, animate=False)
