"""The terminal UI driven by Textual's Pilot: form -> ranked table -> plan -> tree -> compare -> export."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path

from needs import require_module  # noqa: E402

require_module("textual")

from textual.widgets import DataTable, Input, Select, Static, TabbedContent, Tree  # noqa: E402
from tui_pilot import main_screen, settle  # noqa: E402

from meshplan.ui.tui.app import MainScreen, MeshplanApp  # noqa: E402
from meshplan.ui.tui.panes import HardwarePane  # noqa: E402
from meshplan.ui.tui.screens import ExportScreen, HelpScreen, LaunchScreen  # noqa: E402


def text_of(app, selector: str) -> str:
    return str(main_screen(app).query_one(selector, Static).render())


async def set_field(pilot, name: str, value: str, typed: bool = False) -> None:
    """Enter a new value into a form field and press enter. `typed`: reach the field the way a user does
    (f, then tab) and type it key by key; otherwise focus it and set the text (Pilot keys are slow)."""
    screen = main_screen(pilot.app)
    field = screen.query_one(f"#f-{name}", Input)
    if typed:
        await pilot.press("escape", "f")
        order = ["model", "hardware", "objective", "nodes", "gpus_per_node", "seq_len", "batch", "tokens", "margin",
                 "train", "dtype", "offload", "reshard", "lora_rank"]  # the training row, left to right
        for _ in range(order.index(name)):
            await pilot.press("tab")
        assert pilot.app.focused is field
        await pilot.press("ctrl+u", "end", "ctrl+u", *value)  # clears whether or not the text was selected
    else:
        field.focus()
        await pilot.pause()
        field.value = value
    await pilot.press("enter")


async def _test_whole_flow(tmp_path):
    app = MeshplanApp()
    async with app.run_test(size=(100, 32)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        table = screen.query_one("#table", DataTable)
        assert screen.result is not None and table.row_count > 10
        first = screen.result
        assert first.res.model.name == "llama3-70b" and first.world == 64
        assert "llama3-70b" in text_of(app, "#title")

        # change the model and the nodes: the table follows
        await set_field(pilot, "model", "llama3-8b")
        await settle(pilot)
        await set_field(pilot, "nodes", "2", typed=True)
        await settle(pilot)
        res = screen.result.res
        assert res.model.name == "llama3-8b" and res.world == 16
        assert "llama3-8b" in text_of(app, "#title") and "2x8" in text_of(app, "#title")
        assert table.row_count == min(len(res.ranked), 500)
        # the cell shows the label less the defaults the header names (tests/ui/test_tui_table_tools.py)
        assert set(str(table.get_row_at(0)[-1]).split()) <= set(screen.result.compact[int(res.ranked[0])].split())

        # select a plan: the detail follows the cursor
        await pilot.press("escape")
        assert app.focused is table
        await pilot.press("down", "down")
        chosen = screen.selected()
        assert chosen == int(res.ranked[2])
        detail = screen.query_one("#detail")
        assert detail.info["rank"] == 3 and "per GPU" in str(detail.render())

        # sort by memory, then reverse: the chosen plan stays chosen while it is among the rows shown
        await pilot.press("s")
        assert screen.sort_key == "peak"
        assert screen.selected() == chosen if chosen in screen.rows else screen.selected() == screen.rows[0]
        peaks = [float(str(table.get_row_at(r)[1])) for r in range(5)]
        assert peaks == sorted(peaks)
        await pilot.press("r")
        peaks = [float(str(table.get_row_at(r)[1])) for r in range(5)]
        assert peaks == sorted(peaks, reverse=True)
        screen.set_sort("rank", False)

        # the decision tree: a step expands into what it rejected and why
        await pilot.press("t")
        tabs = screen.query_one("#tabs", TabbedContent)
        tree = screen.query_one("#dtree", Tree)
        assert tabs.active == "tree" and app.focused is tree
        steps = tree.root.children
        assert [str(s.label).split(". ", 1)[1].split("  ")[0] for s in steps][:2] == ["FSDP", "+ torch.compile"]
        assert all(not s.is_expanded for s in steps)
        await pilot.press("enter")
        node = tree.cursor_node
        assert node.is_expanded and len(node.children) >= 2
        assert str(node.children[0].label).startswith("→ ")
        rejected = [c for c in steps for c in c.children if str(c.label).startswith("✗ ")]
        assert rejected, "some step lists the alternatives it rejected"
        assert "does not fit" in rejected[0].data
        await pilot.press("down")
        assert "why" in text_of(app, "#tree-info") or "→" in text_of(app, "#tree-info")

        # compare: mark two plans
        await pilot.press("p")
        await pilot.press("ctrl+home", "space", "down", "space")  # the DataTable's first row (home scrolls sideways)
        assert len(screen.marked) == 2
        await pilot.press("c")
        note = text_of(app, "#compare-note")
        assert "2 marked plans" in note
        rows = {label: cells for label, cells, _ in screen.compared}
        assert rows["rank"] == ["1", "2"] and len(rows["tok/s/GPU"]) == 2 and "peak GiB" in rows

        # export the chosen plan: the files land in the directory
        await pilot.press("p")
        out = tmp_path / "export" / "nested"
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        assert app.focused is app.screen.query_one("#export-dir", Input)
        app.focused.value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        names = sorted(p.name for p in out.iterdir())
        plan = screen.result.res.model.name
        assert len(names) == 6 and f"{plan}-16gpu.yaml" in names
        assert {n.split("16gpu")[1] for n in names} == {".yaml", ".toml", "-torchtitan.sh", "-torchrun.sh",
                                                        ".sbatch", "-mpirun.sh"}
        assert os.stat(out / f"{plan}-16gpu-torchrun.sh").st_mode & stat.S_IXUSR
        assert "✓ wrote 6 files" in str(app.screen.query_one("#export-msg", Static).render())
        from meshplan.planner.plan_file import load_plan

        loaded = load_plan(out / f"{plan}-16gpu.yaml")
        cfg = screen.result.res.config(screen.selected())
        assert loaded.cluster.gpus == 16 and loaded.parallel.tp == cfg["tp"] and loaded.parallel.pp == cfg["pp"]
        assert loaded.training.tokens == 2 * 10**12
        assert str((out / f"{plan}-16gpu.yaml").resolve()) in (out / f"{plan}-16gpu-torchrun.sh").read_text()
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)

        # preview the launch: the dry run names the exported plan
        await pilot.press("l")
        assert isinstance(app.screen, LaunchScreen)
        head = str(app.screen.query_one("#launch-cmd", Static).render())
        assert f"meshplan launch {out}/{plan}-16gpu.yaml --backend torchrun --dry-run" in head
        body = str(app.screen.query_one("#launch-text", Static).render())
        assert "torchrun" in body and "meshplan.launcher.run_plan" in body
        await pilot.press("2")
        assert "sbatch" in str(app.screen.query_one("#launch-text", Static).render())
        await pilot.press("escape")
        # another plan: the preview must not name the file exported for the first one
        await pilot.press("down")
        await pilot.press("l")
        head = str(app.screen.query_one("#launch-cmd", Static).render())
        assert str(out) not in head and "not exported yet" in head, head
        await pilot.press("escape")

        # zoom and back: the arrow keys move the selection again
        table = screen.query_one("#table", DataTable)
        before = table.cursor_row
        await pilot.press("z")
        await pilot.press("z")
        await pilot.press("down")
        assert table.cursor_row == before + 1 and app.focused is table

        # help, theme, quit
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert app.theme == "textual-dark"
        await pilot.press("d")
        assert app.theme == "textual-light"
        await pilot.press("q")
    assert not app.is_running


async def _test_invalid_input_shows_inline_error_and_keeps_results():
    app = MeshplanApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        before, title = screen.result, text_of(app, "#title")
        rows = screen.query_one("#table", DataTable).row_count

        await set_field(pilot, "nodes", "0x", typed=True)
        await settle(pilot)
        nodes = screen.query_one("#f-nodes", Input)
        assert nodes.has_class("error")
        message = text_of(app, "#message")
        assert "nodes: '0x' is not a number" in message and "previous results kept" in message
        assert screen.result is before and text_of(app, "#title") == title
        assert screen.query_one("#table", DataTable).row_count == rows

        # fixing the value clears the mark as it is typed
        await pilot.press("ctrl+u", "8")
        assert not nodes.has_class("error")

        # an unknown model: the error comes back from the loader, named after its field
        await set_field(pilot, "model", "gpt-17")
        await settle(pilot)
        assert screen.query_one("#f-model", Input).has_class("error")
        assert "unknown model 'gpt-17'" in text_of(app, "#message")
        assert screen.result is before

        # nothing fits: explained, results kept
        await set_field(pilot, "model", "llama3-405b")
        await settle(pilot)
        await set_field(pilot, "nodes", "1")
        await settle(pilot)
        assert "no configuration of llama3-405b fits" in text_of(app, "#message")
        assert screen.result is before

        # a batch in tokens that is not whole sequences
        await set_field(pilot, "batch", "1000 tok")
        await settle(pilot)
        assert screen.query_one("#f-batch", Input).has_class("error")
        assert "not a whole number of 8,192-token sequences" in text_of(app, "#message")


async def _test_pipeline_plan_shows_a_bar_per_stage():
    app = MeshplanApp({"model": "llama3-70b", "nodes": "8"})
    async with app.run_test(size=(80, 40)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        res = screen.result.res
        pp_rows = [r for r, i in enumerate(screen.rows) if res.config(i)["pp"] > 1]
        assert pp_rows
        screen.query_one("#table", DataTable).move_cursor(row=pp_rows[0])
        await pilot.pause()
        text = str(screen.query_one("#detail").render())
        pp = res.config(screen.selected())["pp"]
        assert all(f"stage {k}" in text for k in range(pp)) and "per GPU" not in text
        assert "│" in text and "┃" in text  # the limit and usable HBM
        await pilot.press("z")
        assert screen.maximized is screen.query_one("#detail-box")
        await pilot.press("escape")
        assert screen.maximized is None


async def _test_hardware_comparison_switches_hardware():
    app = MeshplanApp({"model": "llama3-8b", "nodes": "1", "tokens": ""})
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        await pilot.press("h")
        await settle(pilot)
        table = screen.query_one("#hw-table", DataTable)
        ids = [r["hardware"] for r in screen.query_one(HardwarePane).rows]
        assert ids[:3] == ["h100-sxm", "h200-sxm", "b200"] and table.row_count == len(ids)
        assert [r["hardware"] for r in screen.query_one(HardwarePane).rows if r["current"]] == ["h100-sxm"]
        assert "train" not in [str(c.label) for c in table.columns.values()]  # no token budget: no time
        table.move_cursor(row=ids.index("h200-sxm"))
        await pilot.press("enter")
        await settle(pilot)
        assert screen.query_one("#f-hardware", Input).value == "h200-sxm"
        assert screen.result.res.hw.id == "h200-sxm"
        assert screen.query_one("#tabs", TabbedContent).active == "plans"



async def _test_unreadable_model_file_is_an_inline_error(tmp_path, monkeypatch):
    """A binary --model file, and any ValueError / OverflowError a search may still raise: the form shows
    the error inline and keeps the previous results; the app does not crash."""
    from meshplan.ui.tui import logic

    binary = tmp_path / "bin.json"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    real_run = logic.run

    def run(inp):
        if inp.nodes == 3:
            raise OverflowError("Python int too large to convert to C long")
        if inp.nodes == 5:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real_run(inp)

    monkeypatch.setattr(logic, "run", run)
    app = MeshplanApp({"model": "llama3-8b", "nodes": "1", "tokens": ""})
    async with app.run_test(size=(100, 32)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        before, title = screen.result, text_of(app, "#title")
        assert before is not None

        await set_field(pilot, "model", str(binary))
        await settle(pilot)
        message = text_of(app, "#message")
        assert "is not UTF-8 text" in message and "previous results kept" in message, message
        assert screen.query_one("#f-model", Input).has_class("error")
        assert screen.result is before and text_of(app, "#title") == title

        await set_field(pilot, "model", "llama3-8b")
        await settle(pilot)
        before = screen.result
        for nodes, needle in (("3", "OverflowError"), ("5", "UnicodeDecodeError")):
            await set_field(pilot, "nodes", nodes)
            await settle(pilot)
            message = text_of(app, "#message")
            assert needle in message and "previous results kept" in message, message
            assert screen.result is before
        assert app.is_running and app.return_code in (None, 0)


def test_unreadable_model_file_is_an_inline_error(tmp_path, monkeypatch):
    asyncio.run(_test_unreadable_model_file_is_an_inline_error(tmp_path, monkeypatch))


def test_whole_flow(tmp_path):
    asyncio.run(_test_whole_flow(tmp_path))


def test_invalid_input_shows_inline_error_and_keeps_results():
    asyncio.run(_test_invalid_input_shows_inline_error_and_keeps_results())


def test_pipeline_plan_shows_a_bar_per_stage():
    asyncio.run(_test_pipeline_plan_shows_a_bar_per_stage())


def test_hardware_comparison_switches_hardware():
    asyncio.run(_test_hardware_comparison_switches_hardware())


CHECK_IMPORTS = """
import asyncio, sys
from meshplan.ui.tui.app import MeshplanApp

async def main():
    app = MeshplanApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.get_screen_main().result is not None
    heavy = sorted(m for m in ("torch", "streamlit", "plotly", "pandas") if m in sys.modules)
    print("heavy:", heavy)

asyncio.run(main())
"""


def test_tui_does_not_import_torch_or_streamlit():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", CHECK_IMPORTS], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "heavy: []" in out.stdout


async def _test_fine_tuning_from_the_form(tmp_path):
    app = MeshplanApp({"model": "llama3-70b", "nodes": "2", "seq_len": "4096", "batch": "32", "tokens": ""})
    async with app.run_test(size=(100, 34)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        assert "LoRA" not in text_of(app, "#title")
        # the train field, chosen as a user would: f into the form, tab through it, the select's own keys
        await pilot.press("escape", "f")
        for _ in range(9):
            await pilot.press("tab")
        train = screen.query_one("#f-train", Select)
        assert app.focused is train
        await pilot.press("enter", "down", "down", "enter")  # pretrain -> full -> lora
        await settle(pilot)
        assert train.value == "lora" and "LoRA r16" in text_of(app, "#title")
        res = screen.result.res
        assert res.config(int(res.ranked[0]))["finetune"] == "lora"
        detail = str(main_screen(app).query_one("#detail").render())
        assert "host RAM" in detail and "GiB/node of 2,048" in detail and "frozen" in detail, detail
        # offload pinned on from the form: every ranked plan offloads; the detail says what went to the host
        screen.query_one("#f-offload", Select).value = "on"
        await settle(pilot)
        res = screen.result.res
        assert all(res.config(int(i))["cpu_offload"] for i in res.ranked[:20])
        assert "offloaded state (FSDP CPU offload)" in str(main_screen(app).query_one("#detail").render())
        await pilot.press("escape", "t")
        first = main_screen(app).query_one("#dtree", Tree).root.children[0]
        assert "Fine-tuning mode" in str(first.label)
        # export: the plan, the launch scripts and torchtitan 0.3.0's config module (its LoRAConverter) are written;
        # torchtitan 0.2.2's TOML cannot carry LoRA and the dialog says so instead of writing a config without the
        # adapters
        await pilot.press("p", "e")
        out = tmp_path / "lora"
        app.focused.value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        names = sorted(p.name for p in out.iterdir())
        assert len(names) == 6 and not any(n.endswith(".toml") for n in names), names
        assert "LoRAConverter.Config(" in (out / "meshplan_job.py").read_text()
        said = str(app.screen.query_one("#export-msg", Static).render())
        assert "not written: torchtitan-toml" in said and "0.2.2 has no LoRA" in said
        # 0.3.0's command line cannot set a model converter: its script stops in one line unless TT_CONFIG is set
        assert "STOPS unless TT_CONFIG is set" in next(out.glob("*-torchtitan.sh")).read_text()
        from meshplan.planner.plan_file import load_plan

        plan = load_plan(next(out.glob("*.yaml")))
        assert plan.finetune.mode == "lora" and plan.finetune.lora_rank == 16 and plan.parallel.cpu_offload


def test_fine_tuning_from_the_form(tmp_path):
    asyncio.run(_test_fine_tuning_from_the_form(tmp_path))


async def _test_training_dtype_and_reshard_policy_from_the_form(tmp_path):
    app = MeshplanApp({"model": "llama3-8b", "nodes": "1", "seq_len": "4096", "batch": "32", "tokens": ""})
    async with app.run_test(size=(100, 34)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        fp32 = screen.result.res
        fp32_peak = float(fp32.peak_gib[fp32.ranked].min())
        # the dtype field, reached as a user would: f into the form, tab past the training mode, the select's keys
        await pilot.press("escape", "f")
        for _ in range(10):
            await pilot.press("tab")
        dtype = screen.query_one("#f-dtype", Select)
        assert app.focused is dtype
        await pilot.press("enter", "down", "enter")  # float32 -> bfloat16
        await settle(pilot)
        res = screen.result.res
        assert dtype.value == "bfloat16"
        assert all(res.config(int(i)).get("dtype") == "bfloat16" for i in res.ranked[:20])
        assert float(res.peak_gib[res.ranked].min()) < fp32_peak  # 8 bytes of state a parameter instead of 16
        screen.query_one("#f-reshard", Select).value = "never"
        await settle(pilot)
        res = screen.result.res
        assert all(res.config(int(i)).get("fsdp_reshard_after_forward") == "never" for i in res.ranked[:20])
        table = screen.query_one("#table", DataTable)  # what every row shares goes to the column's header once
        header = " ".join(str(c.label) for c in table.columns.values())
        assert "dt:b16" in header and "rs:never" in header, header
        await pilot.press("escape", "p", "e")
        out = tmp_path / "bf16"
        app.focused.value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        from meshplan.planner.plan_file import load_plan

        plan = load_plan(next(out.glob("*.yaml")))
        assert plan.training.dtype == "bfloat16" and plan.parallel.fsdp_reshard_after_forward == "never"
        assert 'fsdp_reshard_after_forward = "never"' in next(out.glob("*.toml")).read_text()


def test_training_dtype_and_reshard_policy_from_the_form(tmp_path):
    asyncio.run(_test_training_dtype_and_reshard_policy_from_the_form(tmp_path))
