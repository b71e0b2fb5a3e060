"""`meshplan launch`: run a plan with torchrun on this machine, or render and start a multi-node launch."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from launcher.launch import BACKENDS, build_launch, preflight, run_launch


def launch_cmd(
    plan: Path = typer.Argument(..., help="plan file (meshplan plan -o / meshplan estimate -o)"),
    backend: str = typer.Option("local", "--backend", "-b", help=f"one of {', '.join(BACKENDS)}"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print exactly what would run; start nothing"),
    run_dir: Path = typer.Option(None, "--run-dir", help="where the plan copy, script and metrics go [runs/<name>]"),
    steps: int = typer.Option(None, "--steps", min=1, help="override the plan's number of optimizer steps"),
    device: str = typer.Option("cuda", "--device", help="cpu (gloo) or cuda (nccl) for the local backend"),
    nproc_per_node: int = typer.Option(None, "--nproc-per-node", min=1, help="local: processes [the plan's world]"),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="torchrun restarts after a worker failure"),
    partition: str = typer.Option(None, "--partition", help="slurm: #SBATCH --partition"),
    time: str = typer.Option(None, "--time", help="slurm: #SBATCH --time, e.g. 2-00:00:00"),
    account: str = typer.Option(None, "--account", help="slurm: #SBATCH --account"),
) -> None:
    """Launch a plan. `local` runs torchrun --standalone here (the plan's world size in processes; --device
    cpu uses gloo); `torchrun`, `slurm` and `mpirun` write the same script `meshplan export` writes into the
    run directory and start or submit it.

    Example (a CPU smoke run from a tiny config.json):
    meshplan estimate --model tiny/config.json --gpus 2 --gpus-per-node 2 --seq-len 64 -o tiny.yaml
    meshplan launch tiny.yaml --backend local --device cpu --steps 5 --run-dir runs/tiny
    """
    launch = build_launch(plan, backend, run_dir, steps, device, nproc_per_node, max_restarts, partition, time,
                          account, write=not dry_run)
    console = Console(stderr=True)
    if dry_run:
        print(launch.describe())
        if launch.script is not None:
            from planner.export import render
            from planner.plan_file import load_plan

            print(f"# {launch.script} would contain:")
            print(render(load_plan(plan), backend, str(launch.plan_path.resolve()), max_restarts=max_restarts,
                         partition=partition, time=time, account=account), end="")
        return
    preflight(launch, device)
    console.print(f"run directory: {launch.run_dir}  (metrics: {launch.run_dir / 'metrics.jsonl'})")
    console.print(f"$ {launch.describe()}")
    rc = run_launch(launch, device)
    if rc != 0:
        raise typer.Exit(rc)
    if backend == "local":
        console.print(f"done; compare with the estimate: meshplan compare {launch.run_dir}")
