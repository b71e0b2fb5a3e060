"""The plans table's tools, driven by Textual's Pilot as a person would: labels that keep what tells plans apart at 80
columns, the `/` filter, sort by any column on screen, copying the launch command (OSC 52), and the form taking a
hardware profile file and a downloaded model's folder."""

from __future__ import annotations

import asyncio
import json
import shlex

import yaml
from needs import require_module

require_module("textual")

from textual.widgets import DataTable, Input, Static  # noqa: E402

from meshplan.planner.labels import differences  # noqa: E402
from meshplan.ui.tui import logic  # noqa: E402
from meshplan.ui.tui.app import MeshplanApp  # noqa: E402
from meshplan.ui.tui.screens import ExportScreen, HelpScreen, LaunchScreen  # noqa: E402

# Meta-Llama-3.1-8B's published config.json (architecture keys as released)
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.0",
    "use_cache": True, "vocab_size": 128256,
}


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def cells(table: DataTable, column: int = -1) -> list[str]:
    return [str(table.get_row_at(r)[column]) for r in range(table.row_count)]


def column(table: DataTable, key: str):
    return next(c for k, c in table.columns.items() if k.value == key)


def message(app) -> str:
    return str(app.get_screen_main().query_one("#message", Static).render())


def test_differences_keep_what_tells_plans_apart():
    labels = ["fsdp64 mb2 AC:full fp8:ten +c", "fsdp32 cp2 mb4 AC:full fp8:ten +c",
              "fsdp32 tp2 mb2 AC:full fp8:ten +c +atp", "fsdp8 mb1 AC:sel +c", "fsdp8 mb1 AC:full fp8:mxf"]
    default, cells = differences(labels)
    assert default == ["AC:full", "fp8:ten", "+c"]
    assert cells == ["fsdp64 mb2", "fsdp32 cp2 mb4", "fsdp32 tp2 mb2 +atp", "fsdp8 mb1 AC:sel bf16",
                     "fsdp8 mb1 fp8:mxf -c"]
    assert differences(["fsdp8 mb1"]) == ([], ["fsdp8 mb1"])  # one row: whole
    # most have TP: a plan without it says tp1
    assert differences(["fsdp8 tp8 mb1", "fsdp16 tp4 mb1", "fsdp16 tp4 mb2", "fsdp64 mb1"])[1][-1] == "fsdp64 tp1"


async def _test_labels_fit_80_columns():
    app = MeshplanApp()  # 70B on 8 x 8 H100: every top plan shares AC, fp8 and compile
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.get_screen_main()
        table = screen.query_one("#table", DataTable)
        shown = cells(table)
        full = [screen.result.compact[i] for i in screen.rows]
        assert str(column(table, "config").label).startswith("default: ")
        default = screen.defaults  # the header shows those it has room for (test_config_header_fits_80_columns)
        assert {"AC:full", "+c"} <= set(default)
        markers = {"tp1", "cp1", "ep1", "pp1", "bf16", "-c", "-atp", "-off"}
        for cell, label in zip(shown, full, strict=True):  # a cell holds its label's words less the defaults
            assert set(cell.split()) - markers <= set(label.split())
            assert set(label.split()) <= set(cell.split()) | set(default)
        assert len(set(shown)) == len(set(full))  # labels that differ read differently
        # the top plans' cells are whole on an 80-column screen
        widths = sum(col.get_render_width(table) for col in table.columns.values())
        top = max(len(c) for c in shown[:5])
        assert widths - column(table, "config").get_render_width(table) + top + 2 <= 80


def test_labels_fit_80_columns():
    asyncio.run(_test_labels_fit_80_columns())


def test_config_header_keeps_whole_words_in_its_room():
    words = ["tp2", "cp2", "mb4", "AC:full", "fp8:ten", "+c", "+atp"]
    assert logic.config_header(words, 80) == ("default: tp2 cp2 mb4 AC:full fp8:ten +c +atp", [])
    # no room for all: the last words (the flags before the layout) leave, and … says some did
    assert logic.config_header(words, 27) == ("default: tp2 cp2 mb4 …", ["AC:full", "fp8:ten", "+c", "+atp"])
    # the words the filter names leave first: every plan shown has them, and the filter box says so
    assert logic.config_header(words, 40, "TP2 +atp") == ("default: cp2 mb4 AC:full fp8:ten +c", [])
    assert logic.config_header(words, 12) == ("configuration", words)
    assert logic.config_header([], 27) == ("configuration", [])


def check_config_header(screen, table: DataTable) -> None:
    """The configuration header is whole on screen: default words only, the rest named by the filter or listed in
    the detail."""
    from meshplan.ui.tui.widgets import PlanDetail

    header = str(column(table, "config").label).removesuffix(" ↑").removesuffix(" ↓")
    left = sum(c.get_render_width(table) for k, c in table.columns.items() if k.value != "config")
    assert left + table.cell_padding + len(header) <= table.scrollable_content_region.width, header
    shown = header.removeprefix("default: ").removesuffix(" …").split() if header.startswith("default: ") else []
    named = screen.query_text.lower().split()
    # the defaults the filter does not name, in order: those the header shows, then those the detail lists
    assert shown + screen.defaults_left == [w for w in screen.defaults if w.lower() not in named]
    assert header.endswith(" …") == bool(screen.defaults_left) or header == "configuration"
    detail = str(screen.query_one("#detail", PlanDetail).render())
    if screen.defaults_left:
        assert f"header …: {' '.join(screen.defaults_left)}" in detail
    else:
        assert "header …:" not in detail


async def _test_config_header_fits_80_columns():
    app = MeshplanApp()  # 70B on 8 x 8 H100
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.get_screen_main()
        table = screen.query_one("#table", DataTable)
        check_config_header(screen, table)
        # 76 columns: the top plans share more words than the header holds beside the numbers
        await pilot.resize_terminal(76, 24)
        await settle(pilot)
        check_config_header(screen, table)
        assert screen.defaults_left
        await pilot.press("slash")
        for query in ("tp2 +atp", "cp2 mb4", "+c"):
            screen.query_one("#filter", Input).value = query
            await settle(pilot)
            assert screen.query_text == query
            check_config_header(screen, table)
            assert not {w.lower() for w in str(column(table, "config").label).split()} & set(query.lower().split())
        await pilot.press("enter")
        # a wider terminal gives the header room for every word; back at 76 columns they leave again
        await pilot.resize_terminal(160, 40)
        await settle(pilot)
        check_config_header(screen, table)
        assert not screen.defaults_left
        await pilot.resize_terminal(76, 24)
        await settle(pilot)
        check_config_header(screen, table)
        assert screen.defaults_left


def test_config_header_fits_80_columns():
    asyncio.run(_test_config_header_fits_80_columns())


async def _test_filter_sort_and_copy(tmp_path):
    app = MeshplanApp({"model": "llama3-8b", "nodes": "2"})
    async with app.run_test(size=(110, 34)) as pilot:
        await settle(pilot)
        screen = app.get_screen_main()
        table = screen.query_one("#table", DataTable)
        total = len(screen.result.res.ranked)

        # / filters: every row left holds every word; the message counts them; esc clears
        await pilot.press("slash")
        box = screen.query_one("#filter", Input)
        assert box.display and app.focused is box
        await pilot.press(*"tp2 +atp")
        await pilot.pause()
        matching = [int(i) for i in screen.result.res.ranked  # the words checked here, one plan at a time
                    if all(w in logic.searchable(screen.result, int(i)) for w in ("tp2", "+atp"))]
        assert 0 < len(matching) < total and table.row_count == min(len(matching), 500)
        assert screen.rows == matching[:500]  # in rank order
        assert f"{len(matching):,} of {total:,} fitting plans contain “tp2 +atp”" in message(app)
        await pilot.press("enter")  # keeps the filter, back to the table: arrows move the selection
        assert app.focused is table and box.display
        before = screen.selected()
        await pilot.press("down")
        assert screen.selected() != before
        await pilot.press("escape")
        assert not box.display and screen.query_text == ""
        assert table.row_count == min(total, 500)

        await pilot.press("slash", *"pp99")
        await pilot.pause()
        assert table.row_count == 0 and "no fitting plan contains “pp99”" in message(app)
        await pilot.press("escape")
        assert table.row_count == min(total, 500)

        # s walks the columns on screen, train days included (the token budget is set)
        seen = []
        for _ in range(len(screen.sort_keys)):
            await pilot.press("s")
            seen.append(screen.sort_key)
        assert set(seen) == {"rank", "peak", "tps", "mfu", "step", "days", "cost", "config"}
        screen.set_sort("days", False)
        days = [logic.row(screen.result, i)["days"] for i in screen.rows]
        assert days == sorted(days)
        assert "↑" in str(column(table, "days").label)
        screen.set_sort("rank", False)

        # y before export says what to do; after export it copies the launch command
        await pilot.press("home", "y")
        await pilot.pause()
        assert app.clipboard == ""
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        out = tmp_path / "my plans"  # a space: the copied command quotes it
        app.focused.value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("escape")
        plan_file = next(out.glob("*.yaml"))
        await pilot.press("y")
        assert app.clipboard == f"meshplan launch {shlex.quote(str(plan_file))} --backend torchrun"
        assert shlex.split(app.clipboard)[2] == str(plan_file)
        await pilot.press("l")
        assert isinstance(app.screen, LaunchScreen)
        await pilot.press("2", "y")
        assert app.clipboard.endswith("--backend slurm") and str(plan_file) in shlex.split(app.clipboard)
        await pilot.press("escape")

        # the help explains the labels and the ranking rule
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
    from rich.console import Console

    from meshplan.ui.tui.screens import help_renderable

    console = Console(width=100, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(help_renderable(["llama3-8b"], ["h100-sxm"]))
    text = console.export_text()
    for word in ("1 % bands", "fsdp64", "hsdp2x32", "i1f1bv2", "AC:", "ten = tensorwise", "+atp", "OSC 52", "/"):
        assert word in text, word


def test_filter_sort_and_copy(tmp_path):
    asyncio.run(_test_filter_sort_and_copy(tmp_path))


async def _test_own_hardware_file_and_model_folder(tmp_path):
    profile = yaml.safe_load(open("data/hardware_profiles/h100-sxm.yaml"))
    profile["id"] = "our-h100"
    profile["name"] = "our H100 nodes"
    (tmp_path / "our-h100.yaml").write_text(yaml.safe_dump(profile))
    folder = tmp_path / "Meta-Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA31_8B))
    app = MeshplanApp({"model": "llama3-8b", "nodes": "1"})
    async with app.run_test(size=(110, 34)) as pilot:
        await settle(pilot)
        screen = app.get_screen_main()
        hw = screen.query_one("#f-hardware", Input)
        hw.focus()
        hw.value = str(tmp_path / "our-h100.yaml")
        model = screen.query_one("#f-model", Input)
        model.value = str(folder)
        await pilot.press("enter")
        await settle(pilot)
        res = screen.result.res
        assert res.hw.id == "our-h100" and res.model.name == "Meta-Llama-3.1-8B"
        assert abs(res.model.params - 8.03e9) < 0.01e9
        title = str(screen.query_one("#title", Static).render())
        assert "Meta-Llama-3.1-8B" in title and "our-h100" in title

        hw.focus()
        hw.value = str(tmp_path / "missing.yaml")
        await pilot.press("enter")
        await settle(pilot)
        assert hw.has_class("error") and "hardware" in message(app)
        assert screen.result.res.hw.id == "our-h100"  # the previous results stay


def test_own_hardware_file_and_model_folder(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    asyncio.run(_test_own_hardware_file_and_model_folder(tmp_path))
