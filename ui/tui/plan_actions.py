"""The chosen plan's actions on the main screen: copy its launch command (y), export its files (e), preview its
launch (l). A mixin of `ui.tui.app.MainScreen`, which holds the search result, the selection and the plans
exported so far."""

from __future__ import annotations

import os
from pathlib import Path


class PlanActions:
    """`action_copy`, `action_export` and `action_launch` of a screen with `result` (logic.Result or None),
    `selected()` (the chosen sweep index or None) and `exported` ((search inputs, sweep index) -> plan file)."""

    def action_copy(self) -> None:
        """Copy the chosen plan's launch command to the terminal's clipboard (OSC 52: works over ssh where the
        terminal allows it)."""
        from meshplan.ui.tui import logic

        i = self.selected()
        if i is None:
            self.notify("no plan to copy yet", severity="warning")
            return
        exported = self.exported.get((self.result.inputs, i))
        if exported is None:
            rank = logic.row(self.result, i)["rank"]
            self.notify(f"plan #{rank} is not exported yet: e writes its files, then y copies its launch command",
                        severity="warning", timeout=4)
            return
        command = logic.launch_command(exported, "torchrun")
        self.app.copy_to_clipboard(command)
        self.notify(f"copied: {command}", timeout=4)

    def action_export(self) -> None:
        from meshplan.ui.tui.screens import ExportScreen

        i = self.selected()
        if i is None:
            self.notify("no plan to export yet", severity="warning")
            return
        from meshplan.planner.plan_file import plan_fingerprint
        from meshplan.planner.search import short_config
        from meshplan.ui.tui import logic

        plan = logic.build_plan(self.result, i)
        summary = f"{plan.name}: {short_config(self.result.res.config(i))}"

        def writer(directory: str, partition: str, time: str) -> tuple[list[Path], dict[str, str]]:
            skipped: dict[str, str] = {}
            paths = logic.export_files(self.result, i, directory, partition, time, skipped)
            self.exported[(self.result.inputs, i)] = str(paths[0])
            return paths, skipped

        def done(paths):
            if paths:
                self.notify(f"exported {len(paths)} files to {paths[0].parent}", timeout=4)

        folder = os.path.join(".", "plans", f"{plan.name}-{plan_fingerprint(plan)[:8]}")  # one folder per plan
        self.app.push_screen(ExportScreen(summary, folder, writer), done)

    def action_launch(self) -> None:
        from meshplan.ui.tui.screens import LaunchScreen

        i = self.selected()
        if i is None:
            self.notify("no plan to launch yet", severity="warning")
            return
        from meshplan.ui.tui import logic

        result = self.result
        exported = self.exported.get((result.inputs, i))  # only this plan's own file, if it was exported
        self.app.push_screen(LaunchScreen(lambda b: logic.launch_preview(result, i, b, exported), plan_file=exported))
