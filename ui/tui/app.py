"""meshplan in the terminal: the form, the ranked plans, memory bars, the decision tree, compare views,
export and the launch preview. Started with `meshplan tui` (or `python -m ui.tui`).

Start-up stays light: this module imports Textual only; numpy, the estimator and the planner load in
the worker thread that runs the first sweep, after the first frame is on screen.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Select, Static, TabbedContent, TabPane
from textual.worker import get_current_worker

from meshplan.estimator.config import EP_COMM_BACKENDS
from meshplan.ui.tui.form import (
    DEFAULTS,
    FIELDS,
    SORTS,
    FieldError,
    Inputs,
    fmt_days,
    fmt_money,
    parse_form,
)
from meshplan.ui.tui.panes import CapacityPane, ComparePane, FormPane, HardwarePane, TreePane
from meshplan.ui.tui.plan_actions import PlanActions
from meshplan.ui.tui.widgets import CursorTable, Panel, PlanDetail, cell, column_widths, fill

TABS = ("plans", "tree", "compare", "hardware", "capacity")
THEMES = {"dark": "textual-dark", "light": "textual-light"}
HINT = "f edits the form · enter applies it · esc back to the results · ? help"


class MainScreen(PlanActions, Screen):
    BINDINGS = [
        Binding("escape", "results", "results"),
        Binding("f", "form", "form"),
        Binding("s", "sort", "sort"),
        Binding("r", "reverse", "reverse", show=False),
        Binding("space", "mark", "mark"),
        Binding("e", "export", "export"),
        Binding("l", "launch", "launch"),
        Binding("z", "zoom", "zoom", show=False),
        Binding("slash", "filter", "filter"),
        Binding("y", "copy", "copy cmd", show=False),
        Binding("p", "tab('plans')", "plans", show=False),
        Binding("t", "tab('tree')", "tree", show=False),
        Binding("c", "tab('compare')", "compare", show=False),
        Binding("h", "tab('hardware')", "hardware", show=False),
        Binding("n", "tab('capacity')", "nodes", show=False),
        Binding("d", "toggle_theme", "light/dark", show=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
    ]
    LETTER_ACTIONS = {"form", "sort", "reverse", "mark", "export", "launch", "zoom", "tab", "toggle_theme", "help",
                      "quit", "filter", "copy"}
    ZOOM = {"plans": "#detail-box", "tree": "#dtree", "compare": "#compare-box", "hardware": "#hw-table",
            "capacity": "#cap-table"}

    def __init__(self, values: dict[str, str], stack: str = "torchtitan", ep_backend: str = "standard",
                 document_tokens: int | None = None):
        super().__init__()
        self.values = values
        self.stack = stack  # every search's stack profile (`meshplan tui --stack`)
        self.ep_backend = ep_backend  # the experts' dispatch where EP runs (`meshplan tui --ep-comm-backend`)
        self.document_tokens = document_tokens  # mean tokens of a packed document (`meshplan tui --document-tokens`)
        self.result = None  # logic.Result on screen
        self.attempted: Inputs | None = None  # the inputs of the last search started
        self.sort_key, self.sort_reverse = "rank", False
        self.marked: list[int] = []
        self.rows: list[int] = []  # sweep indices in table order
        self.exported: dict[tuple, str] = {}  # (search inputs, sweep index) -> the plan file written for it
        self.status: tuple = ("searching…", "busy", None)
        self.sort_keys: list[str] = list(SORTS)
        self.query_text = ""  # the plans filter (/): words every shown configuration contains
        self.matched = 0  # fitting plans that pass the filter
        self.defaults: list[str] = []  # the words most plans in the table share
        self.defaults_left: list[str] = []  # those the configuration header has no room for (the detail lists them)
        self.others_width = 0  # cells the table's columns left of the configuration take

    # ---- layout ------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static("[b]meshplan[/b]  loading…", id="title")
        yield FormPane(self.values, id="form")
        yield Static("", id="message")
        with TabbedContent(id="tabs", initial="plans"):
            with TabPane("[u]P[/u]lans", id="plans"):
                yield Input(placeholder="filter: words every plan shows contain (tp2 +atp, pp, fp8:row); esc clears",
                            id="filter", compact=True)
                yield CursorTable(id="table", cursor_type="row", zebra_stripes=True)
                with Panel(id="detail-box"):
                    yield PlanDetail(id="detail")
            with TabPane("[u]T[/u]ree", id="tree"):
                yield TreePane()
            with TabPane("[u]C[/u]ompare", id="compare"):
                yield ComparePane(id="compare-box")
            with TabPane("[u]H[/u]ardware", id="hardware"):
                yield HardwarePane()
            with TabPane("[u]N[/u]odes", id="capacity"):
                yield CapacityPane()
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#table", DataTable).focus()
        self.set_message(*self.status[:2])
        self.submit(force=True)

    # ---- the form ----------------------------------------------------------------------------------

    def form_values(self) -> dict[str, str]:
        return self.query_one(FormPane).values()

    def set_field_errors(self, errors: dict[str, str]) -> None:
        self.query_one(FormPane).set_errors(errors)

    def set_message(self, text: str | Text, kind: str = "info") -> None:
        msg = self.query_one("#message", Static)
        for k in ("info", "busy", "error", "ok"):
            msg.set_class(k == kind, k)
        msg.update(text)

    def submit(self, force: bool = False) -> bool:
        """Parse the form; show errors inline (False), or start a search if the inputs changed (or `force`)."""
        inp, errors = parse_form(self.form_values())
        if errors:
            self.set_field_errors(errors)
            kept = " — previous results kept" if self.result is not None else ""
            self.set_message(Text("✗ " + "; ".join(errors.values()) + kept), "error")
            return False
        inp = dataclasses.replace(inp, stack=self.stack, ep_backend=self.ep_backend,
                                  document_tokens=self.document_tokens)
        if inp == self.attempted and not force:
            self.set_status(*self.status)  # back to what the last search said (the form may have shown an error)
            return True
        self.attempted = inp
        self.set_status(f"searching {inp.model} on {inp.nodes} nodes of {inp.hardware}…", "busy")
        self.search(inp)
        return True

    @on(Input.Submitted, ".field")
    def _submitted(self) -> None:
        """Enter applies the form and goes to the results; on a bad value it stays in the form."""
        if self.submit(force=True):
            self.action_results()

    @on(Input.Blurred, ".field")
    def _blurred(self) -> None:
        self.submit()

    @on(Input.Changed, ".field")
    def _changed(self, event: Input.Changed) -> None:
        name = event.input.id.removeprefix("f-")
        if name == "hardware":
            self.update_gpn_placeholder()
        if event.input.has_class("error"):  # clear the mark as soon as the value parses
            _, errors = parse_form({**self.form_values()})
            if name not in errors:
                event.input.set_class(False, "error")

    @on(Select.Changed, ".field")
    def _select_changed(self, event: Select.Changed) -> None:
        if self.is_mounted and self.attempted is not None:
            self.submit()

    def update_gpn_placeholder(self) -> None:
        self.query_one(FormPane).update_gpn_placeholder()

    @property
    def names(self) -> tuple[list[str], list[str]]:
        """Model presets and hardware profiles (for the help screen), once loaded."""
        return self.query_one(FormPane).names

    # ---- the search --------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="search")
    def search(self, inp: Inputs) -> None:
        from meshplan.estimator.errors import MeshplanError
        from meshplan.ui.tui import logic

        worker = get_current_worker()
        try:
            result = logic.run(inp)
        except FieldError as exc:
            if not worker.is_cancelled:
                self.app.call_from_thread(self.search_failed, inp, str(exc), exc.field)
            return
        except (MeshplanError, ValueError, ArithmeticError, OSError) as exc:
            # MeshplanError is the expected one; ValueError (UnicodeDecodeError among them), OverflowError
            # and OSError are what a reader or the numerics may still raise: an inline error, never a crash
            if not worker.is_cancelled:
                message = str(exc) if isinstance(exc, MeshplanError) else f"{type(exc).__name__}: {exc}"
                self.app.call_from_thread(self.search_failed, inp, " ".join(message.split()), None)
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self.show_result, result)

    def search_failed(self, inp: Inputs, message: str, field: str | None) -> None:
        if inp != self.attempted:
            return
        kept = " — previous results kept" if self.result is not None else ""
        self.set_status(Text(f"✗ {message}{kept}"), "error", field)
        if field is None and self.query_one("#tabs", TabbedContent).active == "capacity":
            self.query_one(CapacityPane).scan(inp, None)  # nothing fits: the scan says where it starts to

    def set_status(self, message: str | Text, kind: str, field: str | None = None) -> None:
        """The outcome of the last search: the message under the form and the field it blames."""
        self.status = (message, kind, field)
        self.set_field_errors({field: message} if field else {})
        self.set_message(message, kind)

    def show_result(self, result) -> None:
        if result.inputs != self.attempted:
            return
        self.result = result
        self.marked = []
        self.query_one("#title", Static).update(Text.assemble(("meshplan", "bold"), "  ", result.describe()))
        self.set_status(HINT, "info")
        self.fill_table()
        self.query_one(TreePane).show(result)
        self.fill_compare()
        self.query_one(HardwarePane).reset()
        if self.query_one("#tabs", TabbedContent).active == "hardware":
            self.compare_hardware()
        if self.query_one("#tabs", TabbedContent).active == "capacity":
            self.query_one(CapacityPane).scan(result.inputs, result)

    # ---- the ranked table --------------------------------------------------------------------------

    def fill_table(self, keep: int | None = None) -> None:
        from meshplan.planner.labels import differences
        from meshplan.ui.tui import logic

        result = self.result
        money = result.inputs.tokens is not None
        keys = ["rank", "peak", "tps", "mfu", "step"]
        if money:
            keys.append("days")
            if result.price is not None:
                keys.append("cost")
        shown = logic.matching(result, self.query_text)
        self.matched = len(shown)  # the table holds the first TABLE_ROWS of them
        self.rows = logic.sorted_indices(result, self.sort_key, self.sort_reverse, ranked=shown)
        data = [logic.row(result, i) for i in self.rows]
        # the words most plans share go to the header once, so the cells keep what tells plans apart
        common, labels = differences([r["config"] for r in data])
        rows = []
        for i, r, label in zip(self.rows, data, labels, strict=True):
            cells = [self._rank_cell(i, r["rank"]), cell(f"{r['peak_gib']:.1f}"), cell(f"{r['tps']:,.0f}"),
                     cell(f"{r['mfu']:.1%}"), cell(f"{r['step_s']:.2f}")]
            if money:
                cells.append(cell(fmt_days(r["days"])))
                if result.price is not None:
                    cells.append(cell(fmt_money(r["cost_usd"])))
            cells.append(Text(label))
            rows.append((str(i), cells))
        self.sort_keys = [*keys, "config"]  # s cycles through the columns on screen
        columns = [(key, Text(self._sort_label(key), justify="right")) for key in keys]
        table = self.query_one("#table", DataTable)
        extra = {"rank": 1}  # room for the compare mark
        # the columns left of the configuration, padding included: the header has the rest of the line
        self.others_width = sum(w + 2 * table.cell_padding for w in column_widths(columns, rows, extra))
        self.defaults = common
        head, self.defaults_left = logic.config_header(common, self.config_room(), self.query_text)
        columns.append(("config", Text(self._sort_label("config", head))))
        fill(table, columns, rows, extra)
        if keep is not None and keep in self.rows:
            table.move_cursor(row=self.rows.index(keep), animate=False)
        self.update_filter_note()
        self.update_detail()

    def config_room(self) -> int:
        """Cells the configuration column's header has on screen, right of the other columns."""
        table = self.query_one("#table", DataTable)
        arrow = 2 if self.sort_key == "config" else 0  # " ↑"
        width = (table.size.width or self.app.size.width) - table.styles.scrollbar_size_vertical
        return width - self.others_width - 2 * table.cell_padding - arrow

    def on_resize(self) -> None:
        """A wider or narrower terminal: the configuration header takes the room it has now."""
        self.call_after_refresh(self._refit_header)

    def _refit_header(self) -> None:
        """Refill the table when the configuration header at the current width would show other words."""
        from meshplan.ui.tui import logic

        if self.result is not None and self.rows:
            if logic.config_header(self.defaults, self.config_room(), self.query_text)[1] != self.defaults_left:
                self.fill_table(keep=self.selected())

    def _sort_label(self, key: str, label: str | None = None) -> str:
        label = label or SORTS[key][0]
        if key != self.sort_key:
            return label
        return label + (" ↑" if SORTS[key][1] != self.sort_reverse else " ↓")

    def _rank_cell(self, i: int, rank: int) -> Text:
        if i in self.marked:
            return cell(f"●{rank}", "bold magenta")
        return cell(str(rank))

    def selected(self) -> int | None:
        if self.result is None or not self.rows:
            return None
        row = self.query_one("#table", DataTable).cursor_row
        return self.rows[row] if 0 <= row < len(self.rows) else None

    @on(DataTable.RowHighlighted, "#table")
    def update_detail(self) -> None:
        from meshplan.planner.search import short_config
        from meshplan.ui.tui import logic

        i = self.selected()
        detail = self.query_one("#detail", PlanDetail)
        if i is None:
            detail.show(None)
            return
        result = self.result
        res = result.res
        rank = int(logic.row(result, i)["rank"])
        detail.show({
            "rank": rank, "summary": short_config(res.config(i)), "estimate": logic.estimate_of(result, i),
            "train": logic.train(result, i), "tokens": result.inputs.tokens, "price": result.price,
            "limit_gib": res.limit_gib, "margin": res.memory_margin, "host_limit_gib": res.hw.host_ram_gib_per_node,
            "defaults_left": self.defaults_left,
        })

    @on(DataTable.RowSelected, "#table")
    def _row_selected(self) -> None:
        from meshplan.ui.tui import logic

        i = self.selected()
        if i is not None:
            rank = logic.row(self.result, i)["rank"]
            self.notify(f"plan #{rank} chosen: e exports it, l previews its launch, space marks it", timeout=3)

    @on(DataTable.HeaderSelected, "#table")
    def _header(self, event: DataTable.HeaderSelected) -> None:
        key = event.column_key.value
        if key in SORTS:
            self.set_sort(key, not self.sort_reverse if key == self.sort_key else False)

    def set_sort(self, key: str, reverse: bool) -> None:
        if self.result is None:
            return
        self.sort_key, self.sort_reverse = key, reverse
        self.fill_table(keep=self.selected())

    def action_sort(self) -> None:
        keys = self.sort_keys
        self.set_sort(keys[(keys.index(self.sort_key) + 1) % len(keys)], False)

    def action_reverse(self) -> None:
        self.set_sort(self.sort_key, not self.sort_reverse)

    def action_mark(self) -> None:
        """Mark / unmark the chosen plan for Compare (3 at most: a 4th mark drops the oldest)."""
        from meshplan.ui.tui import logic

        i = self.selected()
        if i is None:
            return
        before = set(self.marked)
        if i in self.marked:
            self.marked.remove(i)
        else:
            self.marked.append(i)
            if len(self.marked) > 3:
                self.marked.pop(0)
        table = self.query_one("#table", DataTable)
        for j in before ^ set(self.marked):
            if str(j) in table.rows:
                table.update_cell(str(j), "rank", self._rank_cell(j, logic.row(self.result, j)["rank"]))
        self.fill_compare()

    # ---- tree, compare, hardware (the panes) ------------------------------------------------------

    def fill_compare(self) -> None:
        self.query_one(ComparePane).show(self.result, self.marked)

    @property
    def compared(self) -> list:
        return self.query_one(ComparePane).compared

    def compare_hardware(self) -> None:
        self.query_one(HardwarePane).compare(self.result)

    @on(HardwarePane.Chosen)
    def _hardware_chosen(self, event: HardwarePane.Chosen) -> None:
        """Switch the form to the accelerator picked in the hardware comparison and search again."""
        self.query_one(FormPane).choose_hardware(event.hardware, event.nodes)
        self.action_tab("plans")
        self.submit(force=True)

    @on(TabbedContent.TabActivated, "#tabs")
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "hardware":
            self.compare_hardware()
        if event.pane.id == "capacity":
            self.query_one(CapacityPane).scan(self.attempted, self.result)
        self.refresh_bindings()

    # ---- actions -----------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        in_form = isinstance(self.focused, Input | Select) and (self.focused.has_class("field")
                                                                 or self.focused.has_class("cap-field")
                                                                 or self.focused.id == "filter")
        if action == "results":
            return in_form or self.maximized is not None or bool(self.query_text)  # in_form: the filter box too
        if in_form and action in self.LETTER_ACTIONS:
            return False
        if action in ("sort", "reverse", "mark", "copy"):
            return self.query_one("#tabs", TabbedContent).active == "plans"
        return True

    def on_descendant_focus(self) -> None:
        self.refresh_bindings()

    def action_results(self) -> None:
        if self.focused is self.query_one("#filter", Input) or (self.query_text and self.maximized is None
                                                                and self.focused is self.query_one("#table")):
            self.clear_filter()
            return
        if self.maximized is not None:
            self.minimize()
        self.set_focus(self._main_widget(self.query_one("#tabs", TabbedContent).active))

    def action_zoom(self) -> None:
        """Give the current view's main panel the whole screen (z or esc restores)."""
        if self.maximized is not None:
            self.minimize()
            # back to the view's main widget (the plans table), so the arrow keys move the selection again
            self.set_focus(self._main_widget(self.query_one("#tabs", TabbedContent).active))
            return
        widget = self.query_one(self.ZOOM[self.query_one("#tabs", TabbedContent).active])
        self.maximize(widget, container=False)
        widget.focus()
        self.refresh_bindings()

    def action_form(self) -> None:
        self.query_one("#f-model", Input).focus()

    def _main_widget(self, tab: str):
        return self.query_one({"plans": "#table", "tree": "#dtree", "compare": "#compare-box", "capacity": "#cap-table",
                               "hardware": "#hw-table"}[tab])

    def action_tab(self, tab: str) -> None:
        tabs = self.query_one("#tabs", TabbedContent)
        tabs.active = tab
        self.set_focus(self._main_widget(tab))
        if tab == "hardware":
            self.compare_hardware()
        if tab == "capacity":
            self.query_one(CapacityPane).scan(self.attempted, self.result)

    def action_help(self) -> None:
        self.app.action_help()

    def action_toggle_theme(self) -> None:
        self.app.action_toggle_theme()

    async def action_quit(self) -> None:
        self.app.exit()

    # ---- the plans filter --------------------------------------------------------------------------

    def action_filter(self) -> None:
        """Show the plans filter and type into it (the Plans view)."""
        if self.result is None:
            return
        self.action_tab("plans")
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_text = event.value.strip()
        if self.result is not None:
            self.fill_table(keep=self.selected())

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = bool(self.query_text)  # stays on screen while it filters
        self.query_one("#table", DataTable).focus()

    def clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""  # Changed refills the table
        box.display = False
        self.query_one("#table", DataTable).focus()

    def update_filter_note(self) -> None:
        if not self.query_text or self.result is None:
            return
        matched, total = self.matched, len(self.result.res.ranked)
        if matched:
            self.set_message(f"{matched:,} of {total:,} fitting plans contain “{self.query_text}” · esc clears the "
                             "filter", "info")
        else:
            self.set_message(Text(f"✗ no fitting plan contains “{self.query_text}” (words match the configuration "
                                  "column or the detail's text, e.g. tp2, pp4, fp8:row, +atp) · esc clears"), "error")


class MeshplanApp(App):
    """The meshplan terminal UI. `values`: initial form text by field (see ui.tui.form.FIELDS)."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "meshplan"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("ctrl+q", "quit", "quit", show=False, priority=True),
        Binding("f1", "help", "help", show=False),
    ]

    def __init__(self, values: dict[str, str] | None = None, theme: str = "dark", stack: str = "torchtitan",
                 ep_backend: str = "standard", document_tokens: int | None = None):
        super().__init__()
        self.initial = {**DEFAULTS, **{k: str(v) for k, v in (values or {}).items() if v is not None}}
        self.initial_theme = THEMES.get(theme, theme)
        self.stack = stack
        self.ep_backend = ep_backend
        self.document_tokens = document_tokens

    def get_default_screen(self) -> Screen:
        return MainScreen(self.initial, self.stack, self.ep_backend, self.document_tokens)

    def on_mount(self) -> None:
        self.theme = self.initial_theme

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"
        main = self.get_screen_main()
        if main is not None and main.result is not None:  # colours chosen per theme
            main.fill_compare()
            main.query_one("#detail", PlanDetail).refresh()

    def action_help(self) -> None:
        from meshplan.ui.tui.screens import HelpScreen

        if isinstance(self.screen, HelpScreen):
            return
        main = self.get_screen_main()
        models, hardware = main.names if main else ([], [])
        self.push_screen(HelpScreen(models, hardware))

    def get_screen_main(self) -> MainScreen | None:
        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                return screen
        return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ui.tui", description="meshplan's terminal UI")
    for name in FIELDS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=f"{FIELDS[name][0]} "
                       f"[default: {DEFAULTS[name] or 'the profile'}]")
    p.add_argument("--theme", choices=tuple(THEMES), default="dark")
    p.add_argument("--stack", default="torchtitan", help="stack profile id or YAML path [default: torchtitan]")
    p.add_argument("--ep-comm-backend", dest="ep_backend", choices=EP_COMM_BACKENDS, default="standard",
                   help="the experts' dispatch where EP runs [default: standard]")
    p.add_argument("--document-tokens", dest="document_tokens", type=_positive, default=None,
                   help="mean tokens of a packed document (FlexAttention) [default: one a sequence]")
    return p


def _positive(text: str) -> int:
    """A whole number of 1 or more (argparse's type for --document-tokens)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of 1 or more, not {text!r}")
    return value


def main(argv: list[str] | None = None) -> None:
    args = vars(parser().parse_args(argv))
    theme, stack, ep_backend = args.pop("theme"), args.pop("stack"), args.pop("ep_backend")
    app = MeshplanApp(args, theme=theme, stack=stack, ep_backend=ep_backend, document_tokens=args.pop("document_tokens"))
    app.run()
    raise SystemExit(app.return_code or 0)  # non-zero when the app crashed
