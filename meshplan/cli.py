"""`meshplan`: plan distributed LLM training before spending a GPU-hour.

Errors in the user's input print one line (`meshplan: error: ...`) and exit with status 2; no traceback.
"""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError
from typer import _click

from meshplan.commands import (
    capacity,
    catalog,
    compare,
    estimate,
    export,
    launch,
    plan,
    trace,
    tui,
    validate,
    web,
)
from meshplan.estimator.errors import MeshplanError

app = typer.Typer(
    name="meshplan",
    help="Plan distributed LLM training (FSDP2/HSDP, TP, PP, CP, Float8, compile, AC) before you launch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("estimate")(estimate.estimate_cmd)
app.command("validate")(validate.validate_cmd)
app.command("plan")(plan.plan_cmd)
app.command("capacity")(capacity.capacity_cmd)
app.command("export")(export.export_cmd)
app.command("launch")(launch.launch_cmd)
app.command("compare")(compare.compare_cmd)
app.command("web")(web.web_cmd)
app.command("tui")(tui.tui_cmd)
app.command("trace")(trace.trace_cmd)
app.command("trace-grid")(trace.trace_grid_cmd)
app.command("models")(catalog.models_cmd)
app.command("hardware")(catalog.hardware_cmd)


def fail(message: str, code: int = 2) -> None:
    print(f"meshplan: error: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        rv = app(args=argv, prog_name="meshplan", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        fail("aborted", 130)
    except _click.exceptions.ClickException as exc:
        fail(exc.format_message().replace("\n", " "), exc.exit_code or 2)
    except MeshplanError as exc:
        fail(str(exc))
    except ValidationError as exc:  # a boundary model rejected a value the command did not pre-check
        err = exc.errors()[0]
        fail(f"invalid {'.'.join(str(x) for x in err['loc'])}: {err['msg']}")
    except OSError as exc:
        fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
    except UnicodeDecodeError as exc:  # safety net: a reader that did not check the encoding itself
        fail(f"an input file is not UTF-8 text (byte {exc.start}: {exc.reason}); give a text file saved as UTF-8")
    except OverflowError as exc:  # safety net: a number past what the estimator can represent
        fail(f"a number is too large ({exc}); give a realistic size")
    except KeyboardInterrupt:
        fail("interrupted", 130)
    sys.exit(rv if isinstance(rv, int) else 0)
