"""Exports of a plan: torchtitan jobs (0.2.2 TOML, 0.3.0 command line or Python config function) and launch
scripts (torchrun, Slurm, OpenMPI mpirun).

`render(plan, fmt, plan_path)` is pure: it returns the text and touches nothing. Scripts run meshplan's
training core, `"$python" -m meshplan.launcher.run_plan --plan "$plan" --run-dir "$run_dir" --device "$device"`, every
value shell-quoted.

    >>> text = render(plan, "slurm", "/shared/plans/llama3-70b.yaml", partition="train", time="2-00:00:00")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from meshplan.estimator.errors import MeshplanError
from meshplan.planner.export.env import BACKENDS, EnvDefaults, EnvVar, default_env_path, load_env_defaults
from meshplan.planner.export.mpirun import render_mpirun
from meshplan.planner.export.scripts import TRAIN_MODULE, render_torchrun
from meshplan.planner.export.slurm import render_slurm
from meshplan.planner.export.torchtitan import TOML_VERSION, render_toml
from meshplan.planner.export.torchtitan_cli import CLI_VERSION, cli_overrides, render_cli
from meshplan.planner.export.torchtitan_py import PY_VERSION, render_py, torchtitan_train_argv
from meshplan.planner.plan_file import Plan, default_run_dir, framework_refusal

_RENDERERS: dict[str, Callable[..., str]] = {
    "torchtitan-toml": render_toml,
    "torchtitan-cli": render_cli,
    "torchtitan-py": render_py,
    "torchrun": render_torchrun,
    "slurm": render_slurm,
    "mpirun": render_mpirun,
}
FORMATS: tuple[str, ...] = tuple(_RENDERERS)
SCRIPT_FORMATS: frozenset[str] = frozenset({"torchtitan-cli", "torchrun", "slurm", "mpirun"})
SUFFIX = {"torchtitan-toml": ".toml", "torchtitan-cli": ".sh", "torchtitan-py": ".py", "torchrun": ".sh",
          "slurm": ".sbatch", "mpirun": ".sh"}


def render(
    plan: Plan,
    fmt: str,
    plan_path: str | Path = "plan.yaml",
    *,
    env: EnvDefaults | None = None,
    env_file: str | Path | None = None,
    max_restarts: int = 0,
    partition: str | None = None,
    time: str | None = None,
    account: str | None = None,
    device: str = "cuda",
    run_dir: str | Path | None = None,
    python: str | None = None,
    engine: str = "core",
) -> str:
    """The export of `plan` in format `fmt` (see FORMATS), as text.

    plan_path: the plan file as the nodes will see it (scripts pass it to the training core).
    env / env_file: environment defaults (default: meshplan's data/launch/env.yaml).
    max_restarts: torchrun --max-restarts default (scripts read MESHPLAN_MAX_RESTARTS at run time).
    partition / time / account: optional #SBATCH values for `slurm`.
    device: where the scripts send the training core: cuda (NCCL, Slurm gres) or cpu (gloo, no gres).
    run_dir: the run directory the scripts pass to the core, made absolute against the current directory
        [default_run_dir(plan)].
    python: the interpreter the scripts run (MESHPLAN_PYTHON overrides it at run time) [sys.executable].
    engine: what the scripts train with: meshplan's core, or torchtitan 0.3 on the module of the
        `torchtitan-py` export, which the caller writes to RUN_DIR/torchtitan-job/meshplan_job.py (CUDA only).
    """
    renderer = _RENDERERS.get(fmt)
    if renderer is None:
        raise MeshplanError(f"unknown export format '{fmt}'; choose one of: {', '.join(FORMATS)}")
    other = framework_refusal(plan)  # every format runs torchtitan's semantics (its job, or meshplan's core)
    if other:
        raise MeshplanError(other)
    if env is None:
        env = load_env_defaults(env_file)
    plan_path = str(plan_path)
    if not plan_path or "\x00" in plan_path:
        raise MeshplanError("the plan path must be a non-empty path")
    if device not in ("cuda", "cpu"):
        raise MeshplanError(f"--device must be cuda or cpu, got {device!r}")
    if engine == "torchtitan" and device != "cuda":
        raise MeshplanError("--engine torchtitan trains on CUDA GPUs only; use the core (--engine core) for --device cpu")
    run_dir = os.path.abspath(run_dir if run_dir is not None else default_run_dir(plan))
    return renderer(
        plan, plan_path, env, max_restarts=max_restarts, partition=partition, time=time, account=account,
        device=device, run_dir=run_dir, python=python, engine=engine,
    )


__all__ = [
    "BACKENDS",
    "CLI_VERSION",
    "FORMATS",
    "PY_VERSION",
    "SCRIPT_FORMATS",
    "SUFFIX",
    "TOML_VERSION",
    "TRAIN_MODULE",
    "EnvDefaults",
    "EnvVar",
    "cli_overrides",
    "default_env_path",
    "load_env_defaults",
    "render",
    "torchtitan_train_argv",
]
