"""`meshplan`: plan distributed LLM training before spending a GPU-hour.

Errors in the user's input print one line (`meshplan: error: ...`) and exit with status 2; no traceback.
Commands are imported when they run (or their own `--help` is asked for): `meshplan --help` lists them from
their modules' source, without importing numpy, pydantic or the estimator.
"""

from __future__ import annotations

import ast
import importlib
import sys
from functools import cache
from pathlib import Path

import typer
from typer import _click  # typer's own click (the separate click package is not imported: 30-50 ms)
from typer.core import TyperCommand, TyperGroup

# command name -> (module under meshplan/commands, function), in the order `meshplan --help` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "estimate": ("estimate", "estimate_cmd"),
    "validate": ("validate", "validate_cmd"),
    "calibrate": ("calibrate", "calibrate_cmd"),
    "plan": ("plan", "plan_cmd"),
    "capacity": ("capacity", "capacity_cmd"),
    "export": ("export", "export_cmd"),
    "launch": ("launch", "launch_cmd"),
    "export-weights": ("export_weights", "export_weights_cmd"),
    "compare": ("compare", "compare_cmd"),
    "web": ("web", "web_cmd"),
    "tui": ("tui", "tui_cmd"),
    "trace": ("trace", "trace_cmd"),
    "trace-grid": ("trace", "trace_grid_cmd"),
    "models": ("catalog", "models_cmd"),
    "hardware": ("catalog", "hardware_cmd"),
}
CONTEXT = {"help_option_names": ["-h", "--help"]}


@cache
def short_help(name: str) -> str:
    """The first sentence of a command's docstring, read from its module's source (nothing is imported)."""
    module, func = COMMANDS[name]
    tree = ast.parse((Path(__file__).parent / "commands" / f"{module}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == func:
            doc = " ".join((ast.get_docstring(node) or "").split())
            return doc.split(". ")[0].rstrip(".")
    return ""


def load_command(name: str) -> _click.Command:
    """The real click command of `name`: its module imported, its function made a Typer command."""
    module, func = COMMANDS[name]
    fn = getattr(importlib.import_module(f"meshplan.commands.{module}"), func)
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False, context_settings=CONTEXT)
    one.command(name)(fn)
    cmd = typer.main.get_command(one)
    cmd.name = name
    return cmd


class LazyCommand(TyperCommand):
    """Stands for a command in the group's listing; parsing, running and its own help load the real one."""

    def __init__(self, name: str):
        super().__init__(name, short_help=short_help(name), help=short_help(name), add_help_option=False)

    @property
    def real(self) -> _click.Command:
        return load_command(self.name)

    def make_context(self, info_name, args, parent=None, **extra):  # noqa: ANN001, D102
        return self.real.make_context(info_name, args, parent=parent, **extra)

    def get_help(self, ctx: _click.Context) -> str:  # noqa: D102
        return self.real.get_help(ctx)


class LazyGroup(TyperGroup):
    """meshplan's commands, imported one at a time when they are used."""

    def list_commands(self, ctx: _click.Context) -> list[str]:  # noqa: D102
        return list(COMMANDS)

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:  # noqa: D102
        return LazyCommand(cmd_name) if cmd_name in COMMANDS else None


app = typer.Typer(
    name="meshplan",
    cls=LazyGroup,
    help="Plan distributed LLM training (FSDP2/HSDP, TP, PP, CP, Float8, compile, AC) before you launch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
)


@app.callback()
def _root() -> None:
    """Plan distributed LLM training (FSDP2/HSDP, TP, PP, CP, Float8, compile, AC) before you launch."""


def fail(message: str, code: int = 2) -> None:
    print(f"meshplan: error: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors become one line on stderr and a non-zero exit."""
    from meshplan.estimator.errors import MeshplanError

    try:
        rv = app(args=argv, prog_name="meshplan", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        fail("aborted", 130)
    except _click.exceptions.ClickException as exc:
        fail(exc.format_message().replace("\n", " "), exc.exit_code or 2)
    except MeshplanError as exc:
        fail(exc.for_cli() if hasattr(exc, "for_cli") else str(exc))
    except OSError as exc:
        fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
    except UnicodeDecodeError as exc:  # safety net: a reader that did not check the encoding itself
        fail(f"an input file is not UTF-8 text (byte {exc.start}: {exc.reason}); give a text file saved as UTF-8")
    except OverflowError as exc:  # safety net: a number past what the estimator can represent
        fail(f"a number is too large ({exc}); give a realistic size")
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except Exception as exc:
        pydantic = sys.modules.get("pydantic")  # loaded by any command that validates; never imported here
        if pydantic is not None and isinstance(exc, pydantic.ValidationError):
            # a boundary model rejected a value the command did not pre-check
            err = exc.errors()[0]
            fail(f"invalid {'.'.join(str(x) for x in err['loc'])}: {err['msg']}")
        raise
    sys.exit(rv if isinstance(rv, int) else 0)
