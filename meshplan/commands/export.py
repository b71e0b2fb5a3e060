"""`meshplan export`: a plan as a torchtitan job config or a launch script (torchrun, Slurm, mpirun)."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path

import typer

from meshplan.planner.export import SCRIPT_FORMATS, render
from meshplan.planner.plan_file import default_run_dir, load_plan, write_atomic


class Device(StrEnum):
    cuda = "cuda"
    cpu = "cpu"


class Format(StrEnum):
    torchtitan_toml = "torchtitan-toml"
    torchtitan_cli = "torchtitan-cli"
    torchtitan_py = "torchtitan-py"
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
    device: Device = typer.Option(
        Device.cuda, "--device", help="scripts: where the training core runs: cuda (NCCL, Slurm GPUs) or cpu (gloo)"
    ),
    run_dir: Path = typer.Option(
        None, "--run-dir", help="scripts: the core's run directory (metrics, checkpoints), made absolute "
        "[runs/<name>-<plan fingerprint>]"
    ),
) -> None:
    """Export PLAN as a torchtitan job (0.2.2 TOML, 0.3.0 command line or 0.3.0 Python config) or a launch script.

    Scripts run meshplan's training core on every rank, with this interpreter (MESHPLAN_PYTHON overrides it):
    `python -m meshplan.launcher.run_plan --plan PLAN --run-dir RUN_DIR --device DEVICE`, under torchrun with c10d
    rendezvous (the same command on every node), Slurm (sbatch + srun torchrun) or OpenMPI mpirun.
    SIGUSR1/SIGTERM make the core checkpoint and stop, and the script exit 0 once the checkpoint is complete.
    Written atomically; scripts are made executable.

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
        device=device.value,
        run_dir=(run_dir if run_dir is not None else default_run_dir(loaded)).resolve(),
    )
    note = None
    if fmt.value in (Format.torchtitan_cli.value, Format.torchtitan_py.value):
        from meshplan.planner.export.torchtitan_03 import layout_note

        note = layout_note(loaded)
    elif fmt.value == Format.torchtitan_toml.value:
        from meshplan.planner.export.torchtitan import layout_note_022

        note = layout_note_022(loaded)
    if note:
        typer.echo(f"note: {note}", err=True)
    if output is None:
        sys.stdout.write(text)
        return
    mode = 0o755 if fmt.value in SCRIPT_FORMATS else 0o644
    write_atomic(output, text, mode=mode)
    typer.echo(f"wrote {output} ({fmt.value})", err=True)
