"""The terminal UI's panes, one widget each with its own state, like Textual's example apps: the form, the
decision tree, the side-by-side comparison and the hardware comparison. The screen (app.py) hands each the current
search result; a pane reports what the user chose with a message (HardwarePane.Chosen), never by reaching
into other widgets.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widgets import DataTable, Input, Label, Select, Static, Tree
from textual.worker import get_current_worker

from meshplan.planner.labels import OBJECTIVES
from meshplan.ui.tui.form import (
    DEFAULTS,
    FIELDS,
    OFFLOAD_CHOICES,
    RESHARD_POLICIES,
    TRAIN_MODES,
    TRAINING_DTYPES,
    Inputs,
    fmt_days,
    fmt_money,
    fmt_tokens,
)
from meshplan.ui.tui.widgets import CursorTable, Panel, cell, fill, warn_style


def _step_label(k: int, s: dict) -> Text:
    best, own = s["best"], s.get("feature_best")
    mark, style = ("✓", "green") if best and s.get("taken") else ("·", "yellow") if best else ("✗", "red")
    label = Text.assemble((f"{mark} ", style), (f"{k}. {s['label']}", "bold"))
    if best and not s.get("taken") and own:
        label.append(f"  with it: {own['peak_gib']:.1f} GiB · {own['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU")
    elif best:
        label.append(f"  {best['peak_gib']:.1f} GiB · {best['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU")
    return label


def _figures(b: dict) -> str:
    return f"{b['peak_gib']:.1f} GiB, {b['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU, MFU {b['mfu']:.1%}"


class TreePane(Vertical):
    """The decision tree: one node per step (why it is taken or not), its best plan and what it rejected."""

    def compose(self) -> ComposeResult:
        yield Tree("decision tree", id="dtree")
        yield Static("", id="tree-info")

    def on_mount(self) -> None:
        self.query_one("#dtree", Tree).show_root = False

    def show(self, result) -> None:
        """Fill the tree from a search result (logic.Result)."""
        tree = self.query_one("#dtree", Tree)
        res = result.res
        tree.clear()
        tree.root.set_label(f"{res.model.name} on {result.nodes}x{res.gpus_per_node} {res.hw.id}")
        for k, s in enumerate(result.tree, 1):
            best, own = s["best"], s.get("feature_best")
            info = f"{k}. {s['label']}: {s['adds']}\n→ {s['reason']}"
            if best:
                info += f"\nbest: {best['summary']} | {_figures(best)}"
            node = tree.root.add(_step_label(k, s), data=info, expand=False)
            node.add_leaf(Text(f"→ {s['reason']}", style="italic"), data=f"why: {s['reason']}")
            if best:
                node.add_leaf(Text(f"best: {best['summary']}"),
                              data=f"best at this step: {best['summary']}\n{_figures(best)}")
            if own and not s.get("taken"):
                node.add_leaf(Text(f"best with it: {own['summary']}", style="yellow"),
                              data=f"best using this step: {own['summary']}\n{_figures(own)}")
            for rej in s["rejected"]:
                node.add_leaf(Text.assemble(("✗ ", "red"), f"{rej['summary']} · {rej['peak_gib']:.1f} GiB"),
                              data=f"rejected: {rej['summary']}\n{rej['reason']}")
            if not s["rejected"]:
                node.add_leaf(Text("no alternative rejected for memory", style="dim"),
                              data="every configuration this step opens either fits or breaks a rule")
        tree.root.expand()
        tree.move_cursor(tree.root.children[0] if tree.root.children else tree.root)

    @on(Tree.NodeHighlighted, "#dtree")
    @on(Tree.NodeExpanded, "#dtree")
    @on(Tree.NodeCollapsed, "#dtree")
    def _node(self) -> None:
        node = self.query_one("#dtree", Tree).cursor_node
        if node is not None and node.data:
            text = Text(node.data)
            if node.children and not node.is_expanded:
                text.append("\nenter expands it: its reason, best configuration and the alternatives it rejected",
                            style="dim")
            self.query_one("#tree-info", Static).update(text)


class ComparePane(Panel):
    """Two or three plans side by side (the marked ones, else the top three); best in green."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.compared: list = []  # (label, cells, best column) of the table on screen

    def compose(self) -> ComposeResult:
        yield Static("", id="compare-note")
        yield Static("", id="compare-table")

    def show(self, result, marked: list[int]) -> None:
        from meshplan.ui.tui import logic

        if result is None:
            return
        indices = list(marked)
        if len(indices) < 2:
            note = "the top 3 plans; mark 2 or 3 rows in Plans with space to compare those"
            indices = [int(i) for i in result.res.ranked[:3]]
        else:
            note = f"the {len(indices)} marked plans (space in Plans marks / unmarks)"
        table = Table(box=None, show_header=False, pad_edge=False, expand=False)
        table.add_column("", style="dim", no_wrap=True)
        for _ in indices:
            table.add_column("", ratio=1)
        dark = getattr(self.app.current_theme, "dark", True)
        good, warn = ("bold green" if dark else "bold #1a7f37"), warn_style(dark)
        self.compared = logic.compare_rows(result, indices)
        for label, cells, best in self.compared:
            styled = [Text(c, style=good if best == n else warn if best == -1 else
                           ("bold" if label in ("rank", "configuration") else "")) for n, c in enumerate(cells)]
            table.add_row(label, *styled)
        self.query_one("#compare-note", Static).update(Text(f"Comparing {note}; best in green, differences in yellow.",
                                                            style="italic"))
        self.query_one("#compare-table", Static).update(table)


class HardwarePane(Vertical):
    """The same model at the same GPU count on every accelerator: the best plan on each, or why none fits."""

    class Chosen(Message):
        """The user picked another accelerator (enter on its row): switch the form to it."""

        def __init__(self, hardware: str, nodes: int):
            super().__init__()
            self.hardware, self.nodes = hardware, nodes

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.key: tuple | None = None  # the inputs of the comparison on screen (or running)
        self.rows: list[dict] = []
        self.world = 0

    def compose(self) -> ComposeResult:
        yield Static("", id="hw-note")
        yield CursorTable(id="hw-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="hw-info")

    def compare(self, result) -> None:
        """Start the comparison for a search result, unless it is already on screen."""
        if result is None or (result.inputs,) == self.key:
            return
        self.key, self.world = (result.inputs,), result.world
        self.query_one("#hw-note", Static).update(Text(
            f"comparing {result.inputs.model} at {result.world} GPUs across accelerators…", style="italic"))
        self.worker(result.inputs, result.res.hw.id)

    def reset(self) -> None:
        self.key = None

    @work(thread=True, exclusive=True, group="hardware")
    def worker(self, inp: Inputs, current: str) -> None:
        from meshplan.estimator.errors import MeshplanError
        from meshplan.ui.tui import logic

        worker = get_current_worker()
        try:
            rows = logic.hardware_rows(inp, logic.hardware_ids(current))
        except (MeshplanError, ValueError, ArithmeticError, OSError) as exc:
            rows, error = [], str(exc) if isinstance(exc, MeshplanError) else f"{type(exc).__name__}: {exc}"
        else:
            error = None
        if not worker.is_cancelled:
            self.app.call_from_thread(self.show, inp, rows, error)

    def show(self, inp: Inputs, rows: list[dict], error: str | None) -> None:
        if self.key != (inp,):
            return
        note = self.query_one("#hw-note", Static)
        if error:
            note.update(Text(f"✗ {error}", style="red"))
            return
        self.rows = rows
        money = inp.tokens is not None
        note.update(Text(f"{inp.model}: the best plan at ~{self.world} GPUs on each accelerator"
                         + (f", {fmt_tokens(inp.tokens)} tokens" if money else "") + "; enter switches to it",
                         style="italic"))
        labels = ("hardware", "nodes", "GiB/usable", "tok/s/GPU", "MFU", *(("train", "cost") if money else ()),
                  "$/GPU-h", "best configuration")
        columns = [(label, Text(label, justify="left" if label in ("hardware", "best configuration") else "right"))
                   for label in labels]
        fill(self.query_one("#hw-table", DataTable), columns, [(r["hardware"], self._cells(r, money)) for r in rows])

    @staticmethod
    def _cells(r: dict, money: bool) -> list[Text]:
        name = Text(("★ " if r["current"] else "  ") + r["hardware"], style="bold" if r["current"] else "")
        cells = [name, cell(f"{r['nodes']}x{r['gpus_per_node']}")]
        if r["fits"]:
            cells += [cell(f"{r['peak_gib']:.1f}/{r['usable_gib']:.0f}"), cell(f"{r['tokens_per_sec_per_gpu']:,.0f}"),
                      cell(f"{r['mfu']:.1%}")]
            if money:
                cells += [cell(fmt_days(r["days"])), cell(fmt_money(r["cost_usd"]))]
        else:
            cells += [cell(f"-/{r['usable_gib']:.0f}"), cell("-"), cell("-")]
            if money:
                cells += [cell("-"), cell("-")]
        cells.append(cell(f"${r['usd_per_gpu_hour']:.2f}" if r["usd_per_gpu_hour"] else "-"))
        cells.append(Text(r["compact"]) if r["fits"] else Text("does not fit: " + r["why_not"], style="red"))
        return cells

    def _row(self, key: str) -> dict | None:
        return next((r for r in self.rows if r["hardware"] == key), None)

    @on(DataTable.RowHighlighted, "#hw-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        row = self._row(event.row_key.value)
        if row is None:
            return
        if row["fits"]:
            text = Text.assemble((row["hardware"], "bold"), f": {row['compact']}")
        else:
            text = Text.assemble((row["hardware"], "bold"), (f" does not fit: {row['why_not']}", "red"))
        self.query_one("#hw-info", Static).update(text)

    @on(DataTable.RowSelected, "#hw-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        row = self._row(event.row_key.value)
        if row is not None and not row["current"]:
            self.post_message(self.Chosen(row["hardware"], row["nodes"]))


class FormPane(Vertical):
    """The form: model, hardware, nodes, ... in three columns (FIELDS); it parses nothing itself (the screen
    runs parse_form on `values()`) and loads the preset and profile names in a thread after the first frame."""

    # FIELDS by block and column: the planning inputs in three columns, then the training row (train, dtype,
    # offload, reshard, LoRA r: tab goes through the first block column by column, then along the training row)
    BLOCKS = (((0, 1, 2), (3, 4, 5), (6, 7, 8)), ((9,), (12,), (10,), (13,), (11,)))

    def __init__(self, initial: dict[str, str], **kwargs):
        super().__init__(**kwargs)
        self.initial = initial
        self.names: tuple[list[str], list[str]] = ([], [])  # model presets, hardware profiles
        self.hw_gpn: dict[str, int] = {}

    def compose(self) -> ComposeResult:
        keys = list(FIELDS)
        for b, block in enumerate(self.BLOCKS):
            with Horizontal(classes=f"block block{b}"):
                for n, col in enumerate(block):
                    with Vertical(classes=f"col col{n}"):
                        for k in col:
                            name = keys[k]
                            with Horizontal(classes="row"):
                                yield Label(FIELDS[name][0], classes="label")
                                yield self._field(name)

    def on_mount(self) -> None:
        self.load_names()

    def _field(self, name: str):
        value = self.initial.get(name, DEFAULTS[name])
        choices = {"objective": OBJECTIVES, "train": tuple(TRAIN_MODES), "offload": OFFLOAD_CHOICES,
                   "dtype": TRAINING_DTYPES, "reshard": RESHARD_POLICIES}.get(name)
        if choices:
            shown = {"float32": "fp32", "bfloat16": "bf16"}  # dtype's short forms, to fit the training row at 80
            return Select([(shown.get(o, o), o) for o in choices], value=value if value in choices else choices[0],
                          allow_blank=False, id=f"f-{name}", compact=True, classes="field")
        placeholder = {"gpus_per_node": "profile's", "tokens": "none", "batch": "sequences"}.get(name, "")
        return Input(value, placeholder=placeholder, id=f"f-{name}", compact=True, classes="field")

    def values(self) -> dict[str, str]:
        """The form's text by field."""
        out = {}
        for name in FIELDS:
            w = self.query_one(f"#f-{name}")
            out[name] = str(w.value) if isinstance(w, Select) else w.value
        return out

    def set_errors(self, errors: dict[str, str]) -> None:
        """Mark the fields named in `errors`, clear the others."""
        for name in FIELDS:
            self.query_one(f"#f-{name}").set_class(name in errors, "error")

    def choose_hardware(self, hardware: str, nodes: int) -> None:
        """Put another accelerator (and its node count) in the form without triggering a search."""
        self.query_one("#f-hardware", Input).value = hardware
        self.query_one("#f-nodes", Input).value = str(nodes)
        self.query_one("#f-gpus_per_node", Input).value = ""
        self.update_gpn_placeholder()

    def update_gpn_placeholder(self) -> None:
        hw = self.query_one("#f-hardware", Input).value.strip()
        gpn = self.hw_gpn.get(hw)  # a profile file of your own: its value shows once the search loads it
        self.query_one("#f-gpus_per_node", Input).placeholder = f"{gpn} (profile)" if gpn else "profile's"

    @work(thread=True, group="names")
    def load_names(self) -> None:
        from meshplan.ui.tui import logic

        models, hardware = logic.names()
        gpn = logic.gpus_per_node(hardware)
        self.app.call_from_thread(self._set_names, models, hardware, gpn)

    def _set_names(self, models: list[str], hardware: list[str], gpn: dict[str, int]) -> None:
        self.names = (models, hardware)
        self.hw_gpn = gpn
        self.query_one("#f-model", Input).suggester = SuggestFromList(models, case_sensitive=False)
        self.query_one("#f-hardware", Input).suggester = SuggestFromList(hardware, case_sensitive=False)
        self.update_gpn_placeholder()



class CapacityPane(Vertical):
    """The capacity question: the same job on its accelerator at every node count, the cheapest cluster within a
    deadline, the fastest within a budget, and how many nodes it takes to fit (planner.views.node_scan and
    scan_answers, the numbers of the web app's Capacity view)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.key: tuple | None = None
        self.rows: list[dict] = []
        self.inputs: Inputs | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(classes="cap-limits"):
            yield Label("deadline days", classes="label")
            yield Input("", placeholder="none", id="cap-deadline", compact=True, classes="cap-field")
            yield Label("budget $", classes="label")
            yield Input("", placeholder="none", id="cap-budget", compact=True, classes="cap-field")
        yield Static("", id="cap-answers")
        yield CursorTable(id="cap-table", cursor_type="row", zebra_stripes=True)

    def scan(self, inp: Inputs | None, result) -> None:
        """Start the node scan for the form's inputs (`result`: their sweep, or None when nothing fit), unless it is
        already on screen."""
        if inp is None or (inp,) == self.key:
            return
        self.key, self.inputs = (inp,), inp
        self.query_one("#cap-answers", Static).update(Text(
            f"scanning {inp.model} on 1..64 nodes of {inp.hardware}…", style="italic"))
        self.worker(inp, result)

    @work(thread=True, exclusive=True, group="capacity")
    def worker(self, inp: Inputs, result) -> None:
        from meshplan.estimator.errors import MeshplanError
        from meshplan.ui.tui import logic

        worker = get_current_worker()
        try:
            rows, error = logic.capacity_rows(inp, result), None
        except (MeshplanError, ValueError, ArithmeticError, OSError) as exc:
            rows, error = [], str(exc) if isinstance(exc, MeshplanError) else f"{type(exc).__name__}: {exc}"
        if not worker.is_cancelled:
            self.app.call_from_thread(self.show, inp, rows, error)

    def limits(self) -> tuple[float | None, float | None, str | None]:
        """(deadline days, budget US$, one-line error or None) from the two inputs."""
        from meshplan.ui.tui.logic import parse_limit

        try:
            return (parse_limit(self.query_one("#cap-deadline", Input).value, "deadline"),
                    parse_limit(self.query_one("#cap-budget", Input).value, "budget"), None)
        except ValueError as exc:
            return None, None, str(exc)

    def show(self, inp: Inputs, rows: list[dict], error: str | None) -> None:
        if self.key != (inp,):
            return
        if error:
            self.query_one("#cap-answers", Static).update(Text(f"✗ {error}", style="red"))
            return
        self.rows = rows
        self.answer()

    @on(Input.Changed, ".cap-field")
    def _limits_changed(self) -> None:
        if self.rows:
            self.answer()

    def answer(self) -> None:
        """The answers and the table for the current deadline and budget (no new search)."""
        from meshplan.planner.views import scan_answers

        deadline, budget, error = self.limits()
        for name in ("deadline", "budget"):
            self.query_one(f"#cap-{name}", Input).set_class(bool(error and error.startswith(name)), "error")
        inp, rows = self.inputs, self.rows
        current = next((r for r in rows if r["current"]), None)
        ans = scan_answers(rows, deadline, budget, current["nodes"] if current else None,
                           current["hardware"] if current else None)
        money = inp.tokens is not None
        lines = [Text(f"✗ {error} — previous answers kept", style="red")] if error else []

        def cluster(r: dict) -> str:
            extra = f", {fmt_days(r['days'])}, {fmt_money(r['cost_usd'])}" if money else ""
            return f"{r['nodes']} nodes ({r['gpus']} GPUs){extra}, {r['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU"

        if ans["add_nodes"]:
            lines.append(Text(f"add nodes: {inp.model} does not fit on {inp.nodes}; it fits from "
                              + cluster(ans["add_nodes"]), style="bold yellow"))
        if not money:
            lines.append(Text("no token budget in the form (tokens): days and cost need one", style="italic"))
        else:
            if deadline:
                r = ans["cheapest_within_deadline"]
                lines.append(Text(f"cheapest within {deadline:g} days: " + (cluster(r) if r else "none scanned")))
            elif ans.get("cheapest"):
                lines.append(Text("cheapest: " + cluster(ans["cheapest"])))
            if budget:
                r = ans["fastest_within_budget"]
                lines.append(Text(f"fastest within {fmt_money(budget)}: " + (cluster(r) if r else "none scanned")))
            elif ans.get("fastest"):
                lines.append(Text("fastest: " + cluster(ans["fastest"])))
        self.query_one("#cap-answers", Static).update(Text("\n").join(lines))
        longest = max((r["days"] for r in rows if r["fits"] and r["days"]), default=0.0)
        labels = ("nodes", "GPUs", "GiB", "tok/s/GPU", *(("days", "cost", "time") if money else ()), "best configuration")
        columns = [(label, Text(label, justify="left" if label in ("time", "best configuration") else "right"))
                   for label in labels]
        fill(self.query_one("#cap-table", DataTable), columns,
             [(str(r["nodes"]), self._cells(r, money, deadline, budget, longest)) for r in rows])

    @staticmethod
    def _cells(r: dict, money: bool, deadline: float | None, budget: float | None, longest: float) -> list[Text]:
        cells = [Text(("★ " if r["current"] else "") + str(r["nodes"]), style="bold" if r["current"] else "",
                      justify="right"), cell(str(r["gpus"]))]
        if not r["fits"]:
            cells += [cell("-"), cell("-"), *((cell("-"), cell("-"), Text("")) if money else ())]
            return [*cells, Text("does not fit: " + r["why_not"], style="red")]
        cells += [cell(f"{r['peak_gib']:.1f}"), cell(f"{r['tokens_per_sec_per_gpu']:,.0f}")]
        if money:
            late = deadline is not None and r["days"] > deadline
            dear = budget is not None and r["cost_usd"] is not None and r["cost_usd"] > budget
            cells += [Text(fmt_days(r["days"]), style="red" if late else "", justify="right"),
                      Text(fmt_money(r["cost_usd"]), style="red" if dear else "", justify="right"),
                      Text("█" * max(1, round(12 * r["days"] / longest)) if longest else "", style="cyan")]
        return [*cells, Text(r["compact"])]

    @on(DataTable.RowSelected, "#cap-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        row = next((r for r in self.rows if str(r["nodes"]) == event.row_key.value), None)
        if row is not None and not row["current"]:
            self.post_message(HardwarePane.Chosen(row["hardware"], row["nodes"]))
