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
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from meshplan.estimator.errors import InputError, LaunchError
from meshplan.planner.export import SUFFIX, render
from meshplan.planner.export.scripts import check_engine
from meshplan.planner.plan_file import Plan, default_run_dir, load_plan, plan_fingerprint, save_plan

BACKENDS = ("local", "torchrun", "slurm", "mpirun")
ENGINES = ("core", "torchtitan")
TRAIN_MODULE = "meshplan.launcher.run_plan"


@dataclass
class Launch:
    """What a launch will do: the command (argv) to run, in `cwd`, with extra environment."""

    backend: str
    run_dir: Path
    plan_path: Path
    argv: list[str]
    script: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    resolved: dict[str, object] = field(default_factory=dict)
    text: str | None = None  # the script's text, for the script backends
    run_config: Any = None  # the core's RunConfig for this run (launcher.core.config), as validated
    job: TitanJob | None = None  # --engine torchtitan: the config module to write

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
        raise LaunchError("device cuda needs torch with CUDA; install torch (the CPU build cannot run CUDA)", field="device")
    import torch

    if not torch.cuda.is_available():
        raise LaunchError("device cuda requested but no CUDA GPU is visible here (use device cpu for gloo)", field="device")


def validate_torchrun_args(args: list[str]) -> None:
    """Parse torchrun's arguments with torch's own parser (when torch is installed)."""
    if not _torch_available():
        return
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    try:
        parser.parse_args(args)
    except SystemExit:
        raise LaunchError(f"torchrun rejects the arguments: {shlex.join(args)}") from None


def check_run_dir_owner(plan: Plan, run_dir: Path) -> None:
    """A run directory belongs to one plan layout: refuse one that holds another plan's copy."""
    existing = run_dir / "plan.yaml"
    if not existing.exists():
        return
    theirs = plan_fingerprint(load_plan(existing))
    if theirs != plan_fingerprint(plan):
        raise LaunchError(
            f"{run_dir} holds a run of another plan (fingerprint {theirs}, this plan {plan_fingerprint(plan)}); "
            f"choose another --run-dir (default: {default_run_dir(plan)})"
        )


def check_init_from(path: str | Path) -> Path:
    """A pretrained checkpoint folder: it exists here and has a config.json (the weights are checked when the
    ranks read them)."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"init_from {folder}: no such folder (give the Hugging Face checkpoint's folder: "
                         "config.json and *.safetensors)", field="init_from")
    if not (folder / "config.json").is_file():
        raise InputError(f"init_from {folder}: no config.json there; a Hugging Face checkpoint folder has config.json "
                         "and *.safetensors", field="init_from")
    return folder.resolve()


def with_init_from(plan: Plan, path: str | Path) -> Plan:
    """The plan starting from checkpoint folder `path` (absolute); a pre-training plan becomes a full fine-tune."""
    from meshplan.planner.plan_file import FineTuning

    folder = str(check_init_from(path))
    ft = plan.finetune or FineTuning(mode="full")
    return plan.model_copy(update={"finetune": ft.model_copy(update={"init_from": folder})})


def prepare_run_dir(plan: Plan, run_dir: Path, steps: int | None) -> Path:
    """Copy the plan (with the step override) into the run directory (checked by `check_run_dir_owner`); return
    the copy's path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if steps is not None:
        if steps < 1:
            raise InputError(f"steps must be positive, got {steps}", field="steps")
        training = plan.training.model_copy(update={"steps": steps})
        plan = plan.model_copy(update={"training": training})
    return save_plan(plan, run_dir / "plan.yaml")


def resolve_run(plan: Plan, backend: str, run_dir: Path, steps: int | None, device: str,
                engine: str) -> tuple[Any, dict[str, object]]:
    """The training core's own validation of the plan (its RunConfig, no torch needed) and what the run will be."""
    from meshplan.launcher.core.config import RunConfig
    from meshplan.launcher.plan_run import run_config_fields
    check_engine(plan, engine)
    try:
        cfg = RunConfig.from_dict(run_config_fields(plan, run_dir, steps, device))
    except ValueError as exc:
        raise LaunchError(f"the training core refuses this plan: {exc}") from None
    # torchtitan keeps its checkpoints in dump_folder/checkpoint.folder
    checkpoints = run_dir / "checkpoint" if engine == "torchtitan" else cfg.checkpoint_path
    return cfg, {
        "engine": engine,
        "backend": backend,
        "device": device,
        "process_group": "nccl" if device == "cuda" else "gloo",
        "world": cfg.world_size,
        "nodes": plan.cluster.nodes,
        "processes_per_node": plan.cluster.gpus_per_node,
        "run_dir": str(run_dir.resolve()),
        "checkpoints": str(checkpoints.resolve()),
        "fingerprint": cfg.fingerprint,
        "steps": cfg.steps,
        "finetune": cfg.finetune,
        "init_from": cfg.init_from,
    }


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
    wait: bool = False,
    engine: str = "core",
    init_from: str | Path | None = None,
) -> Launch:
    """Work out the launch; with `write`, create the run directory, plan copy and script. `init_from`: a Hugging
    Face checkpoint folder the run starts from (recorded in the plan copy, so the run dir belongs to it)."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend '{backend}'; choose one of: {', '.join(BACKENDS)}", field="backend")
    if device not in ("cpu", "cuda"):
        raise InputError(f"device must be cpu or cuda, got {device!r}", field="device")
    if max_restarts < 0:
        raise InputError(f"max_restarts must be >= 0, got {max_restarts}", field="max_restarts")
    if engine not in ENGINES:
        raise InputError(f"unknown engine '{engine}'; choose one of: {', '.join(ENGINES)}", field="engine")
    plan = load_plan(plan_file)
    if init_from is not None:
        plan = with_init_from(plan, init_from)
    elif plan.finetune is not None and plan.finetune.init_from:
        check_init_from(plan.finetune.init_from)
    run_dir = Path(run_dir) if run_dir else default_run_dir(plan)
    check_run_dir_owner(plan, run_dir)
    run_config, resolved = resolve_run(plan, backend, run_dir, steps, device, engine)
    plan_copy = run_dir / "plan.yaml"
    job = titan_job(plan, run_dir, steps, device) if engine == "torchtitan" else None
    if backend == "local":
        nproc = nproc_per_node or plan.cluster.gpus
        if nproc != plan.cluster.gpus:
            raise LaunchError(
                f"the plan's world size is {plan.cluster.gpus} processes; --nproc-per-node {nproc} cannot run it on"
                " one machine (make a plan with fewer GPUs, e.g. from a tiny config.json)"
            )
        torchrun_args = ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}"]
        validate_torchrun_args([*torchrun_args, "-m", TRAIN_MODULE])
        program = ["-m", TRAIN_MODULE, "--plan", str(plan_copy.resolve()), "--run-dir", str(run_dir.resolve()),
                   "--device", device]
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        if job is not None:
            from meshplan.planner.export.torchtitan_py import torchtitan_train_argv

            program = [*torchtitan_train_argv(job.plan, job.path), "--dump_folder", str(run_dir.resolve())]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(job.path.parent.resolve()),
                                                                os.environ.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "torch.distributed.run", *torchrun_args, *program]
        if write:
            write_run_dir(plan, run_dir, steps, job)
        return Launch(backend, run_dir, plan_copy, argv, env=env, resolved=resolved, run_config=run_config, job=job)
    fmt = backend
    script = run_dir / f"launch{SUFFIX[fmt]}"
    text = render_script(plan, fmt, plan_copy, run_dir, device, max_restarts, partition, time, account, engine)
    if write:
        write_run_dir(plan, run_dir, steps, job)
        from meshplan.planner.plan_file import write_atomic

        write_atomic(script, text, mode=0o755)
    if backend == "slurm":
        argv = ["sbatch", *(["--wait"] if wait else []), "--chdir", str(run_dir.resolve()), str(script.resolve())]
    else:
        argv = ["bash", str(script.resolve())]
    return Launch(backend, run_dir, plan_copy, argv, script=script, resolved=resolved, text=text,
                  run_config=run_config, job=job)


def render_script(plan: Plan, fmt: str, plan_copy: Path, run_dir: Path, device: str, max_restarts: int,
                  partition: str | None, time: str | None, account: str | None, engine: str = "core") -> str:
    """The launch script `meshplan export` writes, for this run directory, device and engine."""
    return render(plan, fmt, str(plan_copy.resolve()), max_restarts=max_restarts, partition=partition, time=time,
                  account=account, device=device, run_dir=str(run_dir.resolve()), engine=engine)


class TitanJob(NamedTuple):
    """`--engine torchtitan`: the plan (with the step override), where its torchtitan 0.3 module goes, its text."""

    plan: Plan
    path: Path
    text: str


def titan_job(plan: Plan, run_dir: Path, steps: int | None, device: str) -> TitanJob:
    """The torchtitan 0.3 job of a plan; MeshplanError when torchtitan 0.3 cannot run the plan as planned."""
    from meshplan.planner.export.scripts import TITAN_JOB_DIR, TITAN_MODULE

    if device != "cuda":
        raise LaunchError("--engine torchtitan trains on CUDA GPUs only; use the core (--engine core) for --device cpu")
    if steps is not None:
        plan = plan.model_copy(update={"training": plan.training.model_copy(update={"steps": steps})})
    path = run_dir / TITAN_JOB_DIR / f"{TITAN_MODULE}.py"
    return TitanJob(plan, path, render(plan, "torchtitan-py", str(run_dir / "plan.yaml")))


def write_run_dir(plan: Plan, run_dir: Path, steps: int | None, job: TitanJob | None) -> None:
    """The plan copy and, for torchtitan, its config module."""
    prepare_run_dir(plan, run_dir, steps)
    if job is not None:
        from meshplan.planner.plan_file import write_atomic

        job.path.parent.mkdir(exist_ok=True)
        write_atomic(job.path, job.text)


def preflight(launch: Launch, device: str) -> None:
    """Everything that can be checked before starting: torch, the device, the scheduler's tools."""
    if launch.backend == "local":
        check_device(device)
        if not _torch_available():
            raise LaunchError("the training core needs torch: pip install 'meshplan[train]' (CPU: torch==2.13.0)")
        if launch.job is not None:
            import importlib.util

            if importlib.util.find_spec("torchtitan") is None:
                raise LaunchError("--engine torchtitan needs torchtitan 0.3 installed here: pip install torchtitan==0.3.0")
        else:
            check_core_environment(launch)
    tool = {"slurm": "sbatch", "mpirun": "mpirun"}.get(launch.backend)
    if tool and shutil.which(tool) is None:
        raise LaunchError(f"{tool} is not on PATH here; run the script {launch.script} where {tool} is available")


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)


def _pointer(checkpoints: Path) -> str:
    """The `latest` checkpoint pointer in `checkpoints` ("" when there is none)."""
    try:
        return (checkpoints / "latest").read_text().strip()
    except OSError:
        return ""


def check_core_environment(launch: Launch) -> None:
    """The core's own machine checks (CUDA-only features on CPU, a compiler for compile, ...) before any process
    starts, so a run that cannot work here fails in one line instead of once per rank."""
    from meshplan.launcher.core.parallelize import check_environment

    try:
        check_environment(launch.run_config)
    except RuntimeError as exc:
        raise LaunchError(str(exc)) from None


def run_launch(launch: Launch, device: str) -> int:
    """Start the launch in the foreground and return its exit status. SIGTERM, SIGINT, SIGUSR1 and SIGHUP sent
    to meshplan are passed on to the job (torchrun hands them to the workers, which checkpoint and stop), and
    meshplan waits for it instead of leaving it orphaned. A job stopped that way whose checkpoint was saved
    ends with status 0 (torchrun itself exits 1 after a signal), so a scheduler can requeue or chain it."""
    preflight(launch, device)
    env = {**os.environ, **launch.env}
    checkpoints = Path(str(launch.resolved["checkpoints"]))
    before = _pointer(checkpoints)
    child = subprocess.Popen(launch.argv, env=env)
    previous = {}
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    for sig in FORWARDED:
        previous[sig] = signal.signal(sig, forward)
    try:
        rc = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    after = _pointer(checkpoints)
    if rc != 0 and received and after and after != before and (checkpoints / after).is_dir():
        print(f"meshplan: stopped by signal {received[0]}; checkpoint {after} saved; launch again to resume",
              file=sys.stderr)
        return 0
    return rc
