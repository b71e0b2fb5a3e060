"""`meshplan tui` (meshplan/commands/tui.py) and the pure parts of the TUI: form parsing, formatting,
memory bars, exports."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from meshplan.commands import tui
from meshplan.estimator.errors import MeshplanError
from meshplan.planner.labels import compact_config
from meshplan.ui.tui.form import DEFAULTS, fmt_days, fmt_money, parse_form, parse_number


def test_form_defaults_parse():
    inp, errors = parse_form(DEFAULTS)
    assert errors == {}
    assert (inp.model, inp.hardware, inp.nodes, inp.gpus_per_node, inp.seq_len) == ("llama3-70b", "h100-sxm", 8,
                                                                                     None, 8192)
    assert inp.sequences() == 512 and inp.tokens == 2e12 and inp.margin == 0.9


@pytest.mark.parametrize("text,value", [("512", 512), ("2e12", 2e12), ("2T", 2e12), ("4Mi", 4 * 2**20),
                                        ("1,000", 1000), ("1.5k", 1500), ("500B", 5e11)])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("field,text,message", [
    ("nodes", "0", "nodes: must be in 1..100,000, got 0"),
    ("nodes", "2.5", "nodes: must be a whole number"),
    ("nodes", "eight", "nodes: 'eight' is not a number"),
    ("gpus_per_node", "-1", "GPUs/node: must be in 1..1,024"),
    ("seq_len", "", "seq len: '' is not a number"),
    ("batch", "1000 tok", "not a whole number of 8,192-token sequences"),
    ("tokens", "lots", "tokens: 'lots' is not a token count"),
    ("margin", "1.5", "margin: must be in (0, 1]"),
    ("margin", "150%", "margin: must be in (0, 1]"),
    ("model", " ", "model: give a preset name or a path"),
])
def test_form_errors_name_their_field(field, text, message):
    inp, errors = parse_form({**DEFAULTS, field: text})
    assert inp is None and list(errors) == [field] and message in errors[field]


def test_form_units():
    inp, _ = parse_form({**DEFAULTS, "batch": "256", "tokens": "", "margin": "85%", "gpus_per_node": "4"})
    assert inp.sequences() == 256 and inp.tokens is None and inp.margin == 0.85 and inp.gpus_per_node == 4
    inp, _ = parse_form({**DEFAULTS, "batch": "2097152 tokens", "seq_len": "4096"})
    assert inp.sequences() == 512


def test_formatting():
    cfg = dict(dp_replicate=1, dp_shard=8, tp=4, cp=1, pp=2, pp_schedule="Interleaved1F1B", vpp=2,
               micro_batch_size=1, ac="selective", float8="rowwise", compile=True, async_tp=True)
    assert compact_config(cfg) == "fsdp8 tp4 pp2/i1f1bv2 mb1 AC:sel fp8:row +c +atp"
    assert compact_config({**cfg, "dp_replicate": 2, "pp": 1, "tp": 1, "compile": False, "async_tp": False,
                           "float8": "none", "ac": "full"}) == "hsdp2x8 mb1 AC:full"
    assert fmt_days(0.5) == "12.0 h" and fmt_days(12.34) == "12.3 d" and fmt_days(1234) == "1,234 d"
    assert fmt_money(2_100_000) == "$2.10M" and fmt_money(950) == "$950" and fmt_money(None) == "-"


def test_memory_bar_marks_limit_and_usable():
    from meshplan.ui.tui.widgets import LIMIT_MARK, USABLE_MARK, memory_bar

    bar = memory_bar({"params_fp32": 20.0, "activations": 20.0}, 80, 80.0, 72.0, 79.0).plain
    assert len(bar) == 80 and bar[:40] == "█" * 40
    assert bar[72] == LIMIT_MARK and bar[79] == USABLE_MARK and set(bar[40:72]) == {"·"}
    over = memory_bar({"activations": 76.0}, 80, 80.0, 72.0, 79.0)
    assert over.plain[72] == LIMIT_MARK
    assert any(s.start <= 72 < s.end and "red" in str(s.style) for s in over.spans)  # over the limit: red


def test_export_files_and_launch_preview(tmp_path):
    from meshplan.planner.plan_file import load_plan
    from meshplan.ui.tui import logic

    inp, _ = parse_form({**DEFAULTS, "model": "llama3-8b", "nodes": "1"})
    result = logic.run(inp)
    best = int(result.res.ranked[0])
    paths = logic.export_files(result, best, tmp_path / "a" / "b", partition="train", time="1:00:00")
    assert [p.name for p in paths] == ["llama3-8b-8gpu.yaml", "llama3-8b-8gpu.toml", "llama3-8b-8gpu-torchtitan.sh",
                                       "llama3-8b-8gpu-torchrun.sh", "llama3-8b-8gpu.sbatch",
                                       "llama3-8b-8gpu-mpirun.sh"]
    assert "#SBATCH --partition=train" in (tmp_path / "a" / "b" / "llama3-8b-8gpu.sbatch").read_text()
    plan = load_plan(paths[0])
    assert plan.parallel.dp_shard == result.res.config(best)["dp_shard"] and plan.estimate is not None
    with pytest.raises(MeshplanError, match="not a directory"):
        logic.export_files(result, best, paths[0])
    cmd, text = logic.launch_preview(result, best, "torchrun")  # not exported: the preview says so
    assert cmd == "meshplan launch llama3-8b-8gpu.yaml --backend torchrun --dry-run   # this plan is not exported yet: e writes it"
    cmd, _ = logic.launch_preview(result, best, "torchrun", str(paths[0]))  # exported: its own file
    assert cmd == f"meshplan launch {paths[0]} --backend torchrun --dry-run"
    first, command = text.splitlines()[:2]
    assert first.startswith("# resolved run: world 8 on 1 node(s); device cuda (nccl); run dir /")
    assert command.startswith("bash /") and "/runs/llama3-8b-8gpu-" in command and command.endswith("/launch.sh")
    assert '--device "$device"' in text and "meshplan.launcher.run_plan" in text
    assert not (tmp_path / "runs").exists()


def test_export_with_a_bad_partition_writes_nothing(tmp_path):
    """Shell characters in the Slurm partition: an error, and not one file written (all formats are
    rendered before the first write), not even the folder."""
    from meshplan.ui.tui import logic

    inp, _ = parse_form({**DEFAULTS, "model": "llama3-8b", "nodes": "1"})
    result = logic.run(inp)
    best = int(result.res.ranked[0])
    folder = tmp_path / "plans" / "x"
    with pytest.raises(MeshplanError, match="partition"):
        logic.export_files(result, best, folder, partition="gpu;$(touch PWN3)")
    assert not folder.exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(MeshplanError, match="partition"):
        logic.export_files(result, best, existing, partition="gpu;$(touch PWN3)")
    assert list(existing.iterdir()) == []
    assert not list(tmp_path.rglob("PWN3"))


def test_tui_cmd_exit_status_follows_the_app(monkeypatch):
    """A crash inside the app (Textual sets return_code 1 and prints its traceback) is a non-zero exit."""

    def crashed_run(self):
        self._return_code = 1

    monkeypatch.setattr("meshplan.ui.tui.app.MeshplanApp.run", crashed_run)
    monkeypatch.setattr(tui, "check_terminal", lambda: None)  # CliRunner is not a terminal
    result = CliRunner().invoke(_cli(), ["tui", "--model", "llama3-8b"])
    assert result.exit_code == 1, result.output


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("tui")(tui.tui_cmd)
    app.command("noop")(lambda: None)  # two commands: typer keeps the subcommand name
    return app


def test_tui_cmd_fills_the_form(monkeypatch):
    seen = {}

    def fake_run(self):
        seen.update(values=self.initial, theme=self.initial_theme)

    monkeypatch.setattr("meshplan.ui.tui.app.MeshplanApp.run", fake_run)
    monkeypatch.setattr(tui, "check_terminal", lambda: None)
    result = CliRunner().invoke(_cli(), ["tui", "--model", "llama3-8b", "--nodes", "2", "--global-batch-tokens",
                                         "1048576", "--tokens", "none", "--theme", "light"])
    assert result.exit_code == 0, result.output
    assert seen["theme"] == "textual-light"
    v = seen["values"]
    assert (v["model"], v["nodes"], v["batch"], v["tokens"], v["gpus_per_node"]) == ("llama3-8b", "2",
                                                                                      "1048576 tok", "", "")
    assert (v["dtype"], v["reshard"]) == ("float32", "default")
    result = CliRunner().invoke(_cli(), ["tui", "--dtype", "bfloat16", "--fsdp-reshard-after-forward", "never"])
    assert result.exit_code == 0, result.output
    assert (seen["values"]["dtype"], seen["values"]["reshard"]) == ("bfloat16", "never")
    monkeypatch.setattr("meshplan.ui.tui.app.MeshplanApp.run", lambda self: seen.update(ep=self.ep_backend))
    result = CliRunner().invoke(_cli(), ["tui", "--ep-comm-backend", "deepep"])
    assert result.exit_code == 0, result.output
    assert seen["ep"] == "deepep"


def test_tui_cmd_rejects_bad_options():
    result = CliRunner().invoke(_cli(), ["tui", "--theme", "solarized"])
    assert isinstance(result.exception, MeshplanError) and "--theme" in str(result.exception)
    result = CliRunner().invoke(_cli(), ["tui", "--objective", "fast"])  # was silently `throughput`
    assert isinstance(result.exception, MeshplanError) and "throughput, time, cost" in str(result.exception)
    result = CliRunner().invoke(_cli(), ["tui", "--stack", "nope"])  # before the app starts, naming the choices
    assert isinstance(result.exception, MeshplanError) and "torchtitan-2026-03" in str(result.exception)
    with pytest.raises(MeshplanError, match="not both"):
        tui.form_values("m", "h", 1, None, 8192, 512, 4096, None, 0.9, "throughput")


def test_tui_without_a_terminal_exits_at_once(cli):
    """Piped or run from a script, `meshplan tui` used to write escape codes forever; now one line, exit 2."""
    out = cli("tui", timeout=60)  # run_cli pipes stdin/stdout: no terminal
    assert out.returncode == 2
    assert out.stderr.strip() == ("meshplan: error: meshplan tui needs a terminal (stdin and stdout are not one); "
                                  "use `meshplan plan` in scripts")
