"""`meshplan calibrate`: fit a local stack profile to your own measured runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from meshplan.commands.table_fit import print_table
from meshplan.estimator.errors import MeshplanError


def calibrate_cmd(
    csv_path: Path = typer.Argument(..., metavar="MEASURED.csv", help="your measured runs in the ground-truth schema "
                                    "(rows of `meshplan compare --append-csv`, or your own logs)"),
    output: Path = typer.Option(..., "--output", "-o", help="the stack profile YAML to write (use it with "
                                "`meshplan estimate --stack ./mycluster.yaml`)"),
    stack: str = typer.Option("torchtitan", "--stack", help="the stack profile to start from and extend"),
    profile_id: str = typer.Option(None, "--id", help="id of the new profile [default: the output file's stem]"),
    rounds: int = typer.Option(5, "--rounds", min=1, max=20, help="coordinate-descent rounds per fit"),
    folds: int = typer.Option(5, "--folds", min=2, max=50, help="cross-validation folds (at most one per run)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object: fitted and left constants, errors"),
) -> None:
    """Fit the stack constants your measured runs constrain and write a stack profile that extends --stack.

    Each run is predicted from its configuration columns; a constant is refitted only when some run depends on
    it and the runs can tell it apart from the constants already chosen (no Float8 run: the Float8 constants
    stay as the base has them, and the output says why). The error is reported before, after, and on runs each
    fold was not fitted to.

    Example: meshplan compare runs/70b --append-csv measured.csv; meshplan calibrate measured.csv -o mycluster.yaml;
    meshplan plan --model llama3-70b --stack ./mycluster.yaml
    """
    from meshplan.estimator.calibration import calibrate, profile_yaml
    from meshplan.estimator.stack import load_stack
    from meshplan.estimator.validate import read_rows
    from meshplan.planner.plan_file import check_output_path, write_atomic

    check_output_path(output, "--output")
    new_id = profile_id or output.stem
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", new_id):
        raise MeshplanError(f"--id {new_id!r}: use letters, digits, '.', '_' and '-'")
    if not csv_path.is_file():
        raise MeshplanError(f"{csv_path}: no such file; give a CSV of measured runs in the ground-truth schema")
    base = load_stack(stack)
    rows = read_rows(csv_path)
    console = Console(stderr=True)
    if as_json or not console.is_terminal:
        cal = calibrate(base, rows, rounds, folds)
    else:
        with Progress(transient=True, console=console) as bar:
            task = bar.add_task("fitting (and cross-validating)", total=None)
            cal = calibrate(base, rows, rounds, folds, lambda d, t: bar.update(task, completed=d, total=t))
    write_atomic(output, profile_yaml(cal, new_id, stack, csv_path.name))
    if as_json:
        print(json.dumps({
            "output": str(output), "extends": stack, "runs": len(cal.runs),
            "fitted": {p: {"base": b, "fitted": round(f, 6)} for p, (b, f) in cal.values().items()},
            "left": cal.choice.left,
            "mape": {"before": cal.before, "in_sample": cal.in_sample, "cross_validated": cal.cross_validated},
            "folds": cal.folds,
        }, indent=2))
        return
    out = Console()
    table = Table(title=f"{len(cal.runs)} runs: constants fitted (the rest stay as {stack} has them)")
    for col in ("constant", stack, "fitted"):
        table.add_column(col, justify="left" if col == "constant" else "right")
    for p, (b, f) in cal.values().items():
        table.add_row(p, f"{b:.4g}", f"{f:.4g}")
    print_table(out, table)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    err = Table(title="MAPE")
    for col in ("", stack, "fitted (in-sample)", f"held out ({cal.folds}-fold)"):
        err.add_column(col, justify="right")
    err.add_row("tokens/s/GPU", pct(cal.before["tps"]), pct(cal.in_sample["tps"]), pct(cal.cross_validated["tps"]))
    err.add_row("peak memory", pct(cal.before["mem"]), pct(cal.in_sample["mem"]), pct(cal.cross_validated["mem"]))
    print_table(out, err)
    for p, why in cal.choice.left.items():
        out.print(f"not fitted: {p}: {why}", highlight=False)
    ref = str(output) if output.parent != Path(".") else f"./{output}"
    out.print(f"wrote {output} (use it: meshplan estimate --stack {ref} ...)", highlight=False)
