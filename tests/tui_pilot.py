"""Helpers for driving the terminal UI with Textual's Pilot (importable from any test folder, as needs.py is)."""

from __future__ import annotations

from meshplan.ui.tui.app import MainScreen


async def settle(pilot) -> None:
    """Wait for the sweep (and any other worker) and the screen updates it posts."""
    for _ in range(3):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def main_screen(app) -> MainScreen:
    return app.get_screen_main()
