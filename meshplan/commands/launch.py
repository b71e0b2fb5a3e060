"""`meshplan launch`: run a plan with torchrun on this machine, or render and start a multi-node launch."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from meshplan.launcher.launch import BACKENDS, ENGINES, build_launch, preflight, run_launch


def launch_cmd(
    plan: Path = typer.Argument(..., help="plan file (meshplan plan -o / meshplan estimate -o)"),
    backend: str = typer.Option("local", "--backend", "-b", help=f"one of {', '.join(BACKENDS)}"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="validate the plan with the training core's own rules, print the resolved run and "
        "exactly what would run; start nothing"),
    run_dir: Path = typer.Option(
        None, "--run-dir", help="the only place the run writes: plan copy, script, metrics, checkpoints "
        "[runs/<name>-<plan fingerprint>]"),
    steps: int = typer.Option(None, "--steps", min=1, help="override the plan's number of optimizer steps"),
    device: str = typer.Option(
        "cuda", "--device", help="cuda (NCCL; the plan's GPUs) or cpu (gloo; a smoke run), for every backend"),
    nproc_per_node: int = typer.Option(None, "--nproc-per-node", min=1, help="local: processes [the plan's world]"),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="torchrun restarts after a worker failure"),
    partition: str = typer.Option(None, "--partition", help="slurm: #SBATCH --partition"),
    time: str = typer.Option(None, "--time", help="slurm: #SBATCH --time, e.g. 2-00:00:00"),
    account: str = typer.Option(None, "--account", help="slurm: #SBATCH --account"),
    wait: bool = typer.Option(False, "--wait", help="slurm: wait for the job to end (sbatch --wait); exit with its "
                              "status"),
    as_json: bool = typer.Option(False, "--json", help="with --dry-run: the resolved run as JSON"),
    init_from: Path = typer.Option(
        None, "--init-from", help="start from this Hugging Face checkpoint folder (config.json + *.safetensors): "
        "each rank reads only its shards; a pre-training plan becomes a full fine-tune"),
    engine: str = typer.Option(
        "core", "--engine", help=f"one of {', '.join(ENGINES)}: meshplan's training core, or torchtitan 0.3 on the "
        "plan's torchtitan-py config (CUDA; written to RUN_DIR/torchtitan-job/)"),
) -> None:
    """Launch a plan. `local` runs torchrun --standalone here (the plan's world size in processes); `torchrun`,
    `slurm` and `mpirun` write the same script `meshplan export` writes into the run directory and start or
    submit it. Every backend sends the training core to --device (cuda + NCCL by default) in --run-dir, which
    belongs to this plan alone: a run dir of another plan is refused, the same plan resumes from its last
    intact checkpoint. SIGTERM/SIGINT/SIGUSR1 to meshplan are passed on to the job, which checkpoints and stops.

    Example (a CPU smoke run from a tiny config.json):
    meshplan estimate --model tiny/config.json --gpus 2 --gpus-per-node 2 --seq-len 64 -o tiny.yaml
    meshplan launch tiny.yaml --backend local --device cpu --steps 5 --run-dir runs/tiny
    """
    launch = build_launch(plan, backend, run_dir, steps, device, nproc_per_node, max_restarts, partition, time,
                          account, write=not dry_run, wait=wait, engine=engine, init_from=init_from)
    console = Console(stderr=True)
    if dry_run:
        if as_json:
            print(json.dumps({**launch.resolved, "command": launch.argv, "script": launch.text}, indent=1))
            return
        r = launch.resolved
        print(f"# resolved run: {r['engine']} engine, {r['backend']} on {r['nodes']} node(s) x {r['processes_per_node']} processes = "
              f"world {r['world']}; device {r['device']} ({r['process_group']}); {r['steps']} steps")
        print(f"# run dir {r['run_dir']} (checkpoints {r['checkpoints']}); plan fingerprint {r['fingerprint']}")
        print(launch.describe())
        if launch.text is not None:
            print(f"# {launch.script} would contain:")
            print(launch.text, end="")
        return
    preflight(launch, device)
    console.print(f"run directory: {launch.run_dir}  (metrics: {launch.run_dir / 'metrics.jsonl'})")
    console.print(f"$ {launch.describe()}")
    rc = run_launch(launch, device)
    if rc != 0:
        raise typer.Exit(rc)
    if backend == "local" or (backend == "slurm" and wait) or backend in ("torchrun", "mpirun"):
        console.print(f"done; compare with the estimate: meshplan compare {launch.run_dir}")
