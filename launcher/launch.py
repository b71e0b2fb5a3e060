"""Turn a plan file into a launch: local torchrun, multi-node torchrun, Slurm or OpenMPI.

Every backend works in a run directory: the plan is copied there (with `--steps` applied), the launch
script that `meshplan export` would write is rendered there, and rank 0 of the training core writes
`metrics.jsonl` there. `--dry-run` prints exactly what would run and starts nothing.
torch is imported only to validate torchrun arguments and check devices, and only when installed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from estimator.errors import MeshplanError
from planner.export import SUFFIX, render
from planner.plan_file import Plan, load_plan, save_plan

BACKENDS = ("local", "torchrun", "slurm", "mpirun")
TRAIN_MODULE = "launcher.core.train"


@dataclass
class Launch:
    """What a launch will do: the command (argv) to run, in `cwd`, with extra environment."""

    backend: str
    run_dir: Path
    plan_path: Path
    argv: list[str]
    script: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def check_device(device: str) -> None:
    """Fail early and clearly when CUDA/NCCL is asked for on a machine without it."""
    if device != "cuda":
        return
    if not _torch_available():
        raise MeshplanError("--device cuda needs torch with CUDA; install torch (the CPU build cannot run CUDA)")
    import torch

    if not torch.cuda.is_available():
        raise MeshplanError("--device cuda requested but no CUDA GPU is visible here (use --device cpu for gloo)")


def validate_torchrun_args(args: list[str]) -> None:
    """Parse torchrun's arguments with torch's own parser (when torch is installed)."""
    if not _torch_available():
        return
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    try:
        parser.parse_args(args)
    except SystemExit:
        raise MeshplanError(f"torchrun rejects the arguments: {shlex.join(args)}") from None


def prepare_run_dir(plan: Plan, run_dir: Path, steps: int | None) -> Path:
    """Copy the plan (with the step override) into the run directory; return the copy's path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if steps is not None:
        if steps < 1:
            raise MeshplanError(f"--steps must be positive, got {steps}")
        training = plan.training.model_copy(update={"steps": steps})
        plan = plan.model_copy(update={"training": training})
    return save_plan(plan, run_dir / "plan.yaml")


def build_launch(
    plan_file: str | Path,
    backend: str,
    run_dir: str | Path | None = None,
    steps: int | None = None,
    device: str = "cuda",
    nproc_per_node: int | None = None,
    max_restarts: int = 0,
    partition: str | None = None,
    time: str | None = None,
    account: str | None = None,
    write: bool = True,
) -> Launch:
    """Work out the launch; with `write`, create the run directory, plan copy and script."""
    if backend not in BACKENDS:
        raise MeshplanError(f"unknown backend '{backend}'; choose one of: {', '.join(BACKENDS)}")
    if device not in ("cpu", "cuda"):
        raise MeshplanError(f"--device must be cpu or cuda, got {device!r}")
    if max_restarts < 0:
        raise MeshplanError(f"--max-restarts must be >= 0, got {max_restarts}")
    plan = load_plan(plan_file)
    run_dir = Path(run_dir) if run_dir else Path("runs") / plan.name
    plan_copy = run_dir / "plan.yaml"
    if backend == "local":
        nproc = nproc_per_node or plan.cluster.gpus
        if nproc != plan.cluster.gpus:
            raise MeshplanError(
                f"the plan's world size is {plan.cluster.gpus} processes; --nproc-per-node {nproc} cannot run it on"
                " one machine (make a plan with fewer GPUs, e.g. from a tiny config.json)"
            )
        torchrun_args = ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}"]
        validate_torchrun_args([*torchrun_args, "-m", TRAIN_MODULE])
        argv = [sys.executable, "-m", "torch.distributed.run", *torchrun_args, "-m", TRAIN_MODULE,
                "--plan", str(plan_copy), "--run-dir", str(run_dir), "--device", device]
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        if write:
            prepare_run_dir(plan, run_dir, steps)
        return Launch(backend, run_dir, plan_copy, argv, env=env)
    fmt = backend
    script = run_dir / f"launch{SUFFIX[fmt]}"
    text = render(plan, fmt, str(plan_copy.resolve()), max_restarts=max_restarts, partition=partition, time=time,
                  account=account)
    if write:
        prepare_run_dir(plan, run_dir, steps)
        from planner.plan_file import write_atomic

        write_atomic(script, text, mode=0o755)
    if backend == "slurm":
        argv = ["sbatch", "--chdir", str(run_dir.resolve()), str(script)]
    else:
        argv = ["bash", str(script)]
    return Launch(backend, run_dir, plan_copy, argv, script=script)


def preflight(launch: Launch, device: str) -> None:
    """Everything that can be checked before starting: torch, the device, the scheduler's tools."""
    if launch.backend == "local":
        check_device(device)
        if not _torch_available():
            raise MeshplanError("the training core needs torch: pip install 'meshplan[train]' (CPU: torch==2.13.0)")
    tool = {"slurm": "sbatch", "mpirun": "mpirun"}.get(launch.backend)
    if tool and shutil.which(tool) is None:
        raise MeshplanError(f"{tool} is not on PATH here; run the script {launch.script} where {tool} is available")


def run_launch(launch: Launch, device: str) -> int:
    """Start the launch in the foreground and return its exit status."""
    preflight(launch, device)
    env = {**os.environ, **launch.env}
    return subprocess.call(launch.argv, env=env)
