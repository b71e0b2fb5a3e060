"""Layers point one way (estimator <- planner <- launcher, ui <- meshplan's CLI), checked on the source, and the
command line starts without the numerical stack."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.estimator.errors import ConfigError, InputError, MeshplanError

ROOT = Path(__file__).resolve().parents[1]


def imports(folder: str) -> list[tuple[str, str]]:
    """(file, imported module) for every import in the folder's Python files, lazy ones inside functions too."""
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out += [(str(path.relative_to(ROOT)), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.append((str(path.relative_to(ROOT)), node.module))
    return out


def offending(folder: str, banned: tuple[str, ...]) -> list[str]:
    return [f"{f}: {m}" for f, m in imports(folder) if any(m == b or m.startswith(b + ".") for b in banned)]


CLI = ("meshplan.cli", "meshplan.commands")


@pytest.mark.parametrize("folder", ["estimator", "planner", "launcher", "ui"])
def test_no_layer_imports_the_command_line(folder):
    assert offending(folder, CLI) == []


def test_the_estimator_imports_no_other_layer_and_no_torch():
    banned = ("meshplan.planner", "meshplan.launcher", "meshplan.ui", *CLI, "torch", "torchao", "streamlit",
              "textual", "plotly", "pandas")
    assert offending("estimator", banned) == []


def test_the_planner_imports_neither_launcher_nor_ui():
    assert offending("planner", ("meshplan.launcher", "meshplan.ui", "torch")) == []


def test_the_training_core_imports_no_planner_and_no_ui():
    assert offending("launcher/core", ("meshplan.planner", "meshplan.ui", "meshplan.launcher.launch")) == []


def test_nothing_imports_ui():
    for folder in ("estimator", "planner", "launcher"):
        assert offending(folder, ("meshplan.ui",)) == []


def test_help_loads_no_numpy_and_no_estimator():
    code = ("import runpy, sys; sys.argv = ['meshplan', '--help']\n"
            "try:\n    runpy.run_module('meshplan', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'pydantic', 'torch')"
            " or m.startswith(('meshplan.estimator.', 'meshplan.planner'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Commands" in out.stdout and "estimate" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "['meshplan.estimator.errors']"


def test_errors_name_fields_and_the_cli_names_flags():
    err = InputError("seq_len must be a positive integer, got 0", field="seq_len")
    assert isinstance(err, MeshplanError) and isinstance(err, ValueError)
    assert err.for_cli() == "--seq-len must be a positive integer, got 0"
    assert ConfigError("degrees multiply to 12 ...").for_cli() == "degrees multiply to 12 ..."
    from meshplan.estimator import TrainConfig, load_hardware, load_model

    with pytest.raises(InputError) as exc:
        TrainConfig(gpus=8, tp=0).resolve(load_model("llama3-8b"), load_hardware("h100-sxm"))
    assert str(exc.value).startswith("tp must be") and exc.value.field == "tp"  # no CLI flag below the CLI
