"""The terminal UI's Nodes tab (the capacity question) driven by Textual's Pilot: the scan over node counts, the
deadline and budget answers, 'add nodes' when the form's cluster is too small, enter switches the form."""

from __future__ import annotations

import asyncio

from needs import require_module

require_module("textual")

from textual.widgets import DataTable, Input, Static, TabbedContent  # noqa: E402

from meshplan.ui.tui.app import MeshplanApp  # noqa: E402
from meshplan.ui.tui.logic import parse_limit  # noqa: E402


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


async def _test_nodes_tab_answers_the_capacity_question():
    app = MeshplanApp({"model": "llama3-70b", "nodes": "2"})
    async with app.run_test(size=(100, 32)) as pilot:
        await settle(pilot)
        screen = app.get_screen_main()
        assert screen.result is None  # 70B does not fit on 2 nodes
        message = str(screen.query_one("#message", Static).render())
        assert "it fits from 3 nodes (24 GPUs)" in message and "n: the Nodes tab" in message
        await pilot.press("n")
        await settle(pilot)
        assert screen.query_one("#tabs", TabbedContent).active == "capacity"
        answers = str(screen.query_one("#cap-answers", Static).render())
        assert "add nodes: llama3-70b does not fit on 2; it fits from 3 nodes (24 GPUs)" in answers
        assert "cheapest: " in answers and "fastest: 64 nodes" in answers
        table = screen.query_one("#cap-table", DataTable)
        assert table.row_count == 12  # 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64
        assert "does not fit" in str(table.get_row("2")[-1]) and str(table.get_row("2")[0]).startswith("★")
        # a deadline and a budget: answered without a new search
        screen.query_one("#cap-deadline", Input).value = "60"
        screen.query_one("#cap-budget", Input).value = "3M"
        await settle(pilot)
        answers = str(screen.query_one("#cap-answers", Static).render())
        assert "cheapest within 60 days: 64 nodes" in answers and "fastest within $3.00M: 64 nodes" in answers
        screen.query_one("#cap-deadline", Input).value = "soon"
        await settle(pilot)
        answers = str(screen.query_one("#cap-answers", Static).render())
        assert "deadline: 'soon' is not a number" in answers and screen.query_one("#cap-deadline").has_class("error")
        # enter on the 6-node row switches the form to 6 nodes and searches: now it fits
        table.focus()
        table.move_cursor(row=table.get_row_index("6"))
        await pilot.press("enter")
        await settle(pilot)
        assert screen.query_one("#f-nodes", Input).value == "6"
        assert screen.result is not None and screen.result.world == 48


def test_nodes_tab_answers_the_capacity_question():
    asyncio.run(_test_nodes_tab_answers_the_capacity_question())


def test_parse_limit():
    assert parse_limit("", "budget") is None and parse_limit("0", "budget") is None
    assert parse_limit("$2M", "budget") == 2e6 and parse_limit("1,500k", "budget") == 1.5e6
    assert parse_limit("30", "deadline") == 30
    for bad in ("-5", "soon", "inf"):
        try:
            parse_limit(bad, "deadline")
        except ValueError as exc:
            assert str(exc).startswith("deadline: ")
        else:
            raise AssertionError(bad)
