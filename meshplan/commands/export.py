"""`meshplan export`: a plan as a torchtitan job config or a launch script (torchrun, Slurm, mpirun)."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path

import typer

from planner.export import SCRIPT_FORMATS, render
from planner.plan_file import load_plan, write_atomic


class Format(StrEnum):
    torchtitan_toml = "torchtitan-toml"
    torchtitan_cli = "torchtitan-cli"
    torchrun = "torchrun"
    slurm = "slurm"
    mpirun = "mpirun"


def export_cmd(
    plan: Path = typer.Argument(..., help="plan file (YAML) written by `meshplan plan -o` or `meshplan estimate -o`"),
    fmt: Format = typer.Option(..., "--format", "-f", help="what to write"),
    output: Path = typer.Option(None, "--output", "-o", help="file to write [default: stdout]"),
    plan_path: str = typer.Option(
        None, "--plan-path", help="the plan file as the nodes see it, baked into scripts [default: its absolute path]"
    ),
    partition: str = typer.Option(None, "--partition", help="slurm: #SBATCH --partition"),
    time: str = typer.Option(None, "--time", help="slurm: #SBATCH --time, e.g. 2-00:00:00"),
    account: str = typer.Option(None, "--account", help="slurm: #SBATCH --account"),
    max_restarts: int = typer.Option(
        0, "--max-restarts", min=0, help="torchrun --max-restarts default (MESHPLAN_MAX_RESTARTS overrides it at run time)"
    ),
) -> None:
    """Export PLAN as torchtitan's job config (0.2.x TOML or 0.3 command line) or as a launch script.

    Scripts run meshplan's training core (`python -m launcher.core.train --plan PLAN`) on every rank:
    torchrun with c10d rendezvous (the same command on every node), Slurm (sbatch + srun torchrun) or
    OpenMPI mpirun. Written atomically; scripts are made executable.

    Example: meshplan export plan.yaml -f slurm --partition train --time 2-00:00:00 -o train.sbatch
    """
    loaded = load_plan(plan)
    text = render(
        loaded,
        fmt.value,
        plan_path if plan_path else str(plan.resolve()),
        max_restarts=max_restarts,
        partition=partition,
        time=time,
        account=account,
    )
    if output is None:
        sys.stdout.write(text)
        return
    mode = 0o755 if fmt.value in SCRIPT_FORMATS else 0o644
    write_atomic(output, text, mode=mode)
    typer.echo(f"wrote {output} ({fmt.value})", err=True)
