"""Snapshots (pytest-textual-snapshot) of the terminal UI's main screens at 80x24 and 120x40.

Regenerate after an intended change with `pytest tests/ui/test_tui_snapshots.py --snapshot-update` and
look at the SVGs under tests/ui/__snapshots__/test_tui_snapshots/. The profiles are frozen copies
(tests/ui/fixtures/data), so recalibrating the estimator's constants does not change these pictures; a change
to the estimator's code or the UI's layout does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from needs import require_module  # noqa: E402

require_module("pytest_textual_snapshot")

from textual.widgets import DataTable  # noqa: E402

from meshplan.ui.tui.app import MeshplanApp  # noqa: E402

pytestmark = pytest.mark.serial  # screens compared frame by frame: run alone (make test's second part)
SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]
FROZEN = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture(autouse=True)
def frozen_profiles(monkeypatch):
    """Hardware, stack and model profiles from the frozen copies, for every snapshot of this module."""
    from meshplan.estimator import data_files, stack

    monkeypatch.setattr(data_files, "data_dir", lambda kind: FROZEN / kind)
    data_files._names.cache_clear()
    stack._builtin.cache_clear()
    yield
    data_files._names.cache_clear()
    stack._builtin.cache_clear()


async def settle(pilot) -> None:
    """Searches done, layout and scrolling (a scrollbar's thumb glides) finished."""
    for _ in range(3):
        await pilot.app.workers.wait_for_complete()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()


def shot(*steps):
    """run_before for snap_compare: settle, then each step (keys, or a callable taking the main screen)."""

    async def run_before(pilot) -> None:
        await settle(pilot)
        for step in steps:
            if callable(step):
                step(pilot.app.get_screen_main())
            else:
                await pilot.press(*step)
            await settle(pilot)

    return run_before


def _mark_two(screen) -> None:
    table = screen.query_one("#table", DataTable)
    for row in (0, 3):
        table.move_cursor(row=row, animate=False)
        screen.action_mark()
    table.move_cursor(row=0, animate=False)


@pytest.mark.parametrize("size", SIZES)
def test_plans(snap_compare, size):
    assert snap_compare(MeshplanApp(), terminal_size=size, run_before=shot(["down"]))


@pytest.mark.parametrize("size", SIZES)
def test_plans_pipeline_stages(snap_compare, size):
    def pipeline_row(screen):
        res = screen.result.res
        row = next(r for r, i in enumerate(screen.rows) if res.config(i)["pp"] > 1)
        screen.query_one("#table", DataTable).move_cursor(row=row, animate=False)

    assert snap_compare(MeshplanApp({"nodes": "8"}), terminal_size=size, run_before=shot(pipeline_row))


@pytest.mark.parametrize("size", SIZES)
def test_tree_expanded(snap_compare, size):
    assert snap_compare(MeshplanApp(), terminal_size=size, run_before=shot(["t"], ["down", "down", "enter"]))


@pytest.mark.parametrize("size", SIZES)
def test_compare(snap_compare, size):
    assert snap_compare(MeshplanApp(), terminal_size=size, run_before=shot(_mark_two, ["c"]))


@pytest.mark.parametrize("size", SIZES)
def test_hardware(snap_compare, size):
    assert snap_compare(MeshplanApp(), terminal_size=size, run_before=shot(["h"]))


def test_invalid_input_80x24(snap_compare):
    def bad_nodes(screen):
        screen.query_one("#f-nodes").value = "-3"
        screen.submit(force=True)

    assert snap_compare(MeshplanApp(), terminal_size=(80, 24), run_before=shot(bad_nodes))


def test_export_dialog_light_80x24(snap_compare):
    assert snap_compare(MeshplanApp(theme="light"), terminal_size=(80, 24), run_before=shot(["e"]))


def test_help_80x24(snap_compare):
    assert snap_compare(MeshplanApp(), terminal_size=(80, 24), run_before=shot(["question_mark"]))


@pytest.mark.parametrize("size", SIZES)
def test_nodes(snap_compare, size):
    def budget(screen):
        screen.query_one("#cap-deadline").value = "60"
        screen.query_one("#cap-budget").value = "3M"

    assert snap_compare(MeshplanApp({"nodes": "2"}), terminal_size=size, run_before=shot(["n"], budget))
