"""The Open MPI launch script of a plan: mpirun starts one process per GPU, each exporting torch's rank
variables from Open MPI's (see scripts.py for what every launch script shares)."""

from __future__ import annotations

from meshplan.estimator.errors import MeshplanError
from meshplan.planner.export._common import env_lines, q
from meshplan.planner.export.env import EnvDefaults
from meshplan.planner.export.scripts import (
    TRAIN_MODULE,
    check_core,
    check_engine,
    continued,
    core_block,
    script_header,
    supervise,
)
from meshplan.planner.plan_file import Plan

# Run by bash on every rank; the interpreter, plan, run dir and device arrive as $1..$4, never spliced into this text.
MPI_INNER = (
    ': "${OMPI_COMM_WORLD_RANK:?not started by Open MPI mpirun}"; '
    'export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" '
    'LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"; '
    f'exec "$1" -m {TRAIN_MODULE} --plan "$2" --run-dir "$3" --device "$4"'
)


def render_mpirun(plan: Plan, plan_path: str, env: EnvDefaults, *, device: str = "cuda", run_dir: str = "",
                  python: str | None = None, engine: str = "core", **_: object) -> str:
    python = check_core(device, run_dir, python)
    if engine != "core":
        raise MeshplanError("--engine torchtitan runs under torchrun: use --backend local, torchrun or slurm")
    check_engine(plan, engine)
    n, g, world = plan.cluster.nodes, plan.cluster.gpus_per_node, plan.cluster.gpus
    envs = env.for_backend("mpirun")
    per = "GPU" if device == "cuda" else "process slot"
    usage = [
        f"Open MPI: one rank per {per}, {world} ranks on {n} node(s) of {g}; no torchrun (so no --max-restarts).",
        "  MESHPLAN_HOSTFILE=hosts ./THIS_SCRIPT     (MASTER_ADDR defaults to the first host in the hostfile)",
        "  MASTER_ADDR=<head address> ./THIS_SCRIPT  (when mpirun finds the hosts itself, e.g. inside an allocation)",
        "Ranks map OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} to RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE",
        "and run the absolute interpreter below (same path on every node; MESHPLAN_PYTHON overrides it), so PATH on",
        "the nodes does not matter; only MASTER_ADDR/MASTER_PORT, the environment defaults below and PATH are",
        "passed to the ranks (-x). As root, Open MPI wants --allow-run-as-root or OMPI_ALLOW_RUN_AS_ROOT=1 plus",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (set them yourself; this script does not).",
        "SIGUSR1 or SIGTERM: checkpoint and stop; exit 0 once the checkpoint is complete.",
    ]
    lines = script_header(plan, f"OpenMPI mpirun ({world} ranks)", plan_path, run_dir, device, usage)
    lines += ["set -euo pipefail", ""]
    lines += env_lines(envs) + [""]
    lines += core_block(plan_path, run_dir, device, python)
    lines += [
        'hostfile="${MESHPLAN_HOSTFILE:-}"',
        'if [ -z "${MASTER_ADDR:-}" ] && [ -n "$hostfile" ]; then',
        "  # first host of the hostfile (lines look like `node01 slots=8`; comments and blank lines skipped)",
        "  MASTER_ADDR=$(awk '$1 !~ /^#/ && NF { print $1; exit }' \"$hostfile\")",
        "fi",
    ]
    if n > 1:
        lines += [
            'case "${MASTER_ADDR:-}" in',
            "  \"\")",
            f'    echo "meshplan: {n} nodes need MASTER_ADDR (an address of the node with rank 0) or MESHPLAN_HOSTFILE"'
            " >&2",
            "    exit 2",
            "    ;;",
            "  127.*|localhost|::1)",
            '    echo "meshplan: MASTER_ADDR=$MASTER_ADDR is a loopback address; the other nodes cannot reach it" >&2',
            "    exit 2",
            "    ;;",
            "esac",
        ]
    else:
        lines += ['MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"']
    lines += [
        "export MASTER_ADDR",
        'export MASTER_PORT="${MASTER_PORT:-29500}"',
        "",
        f"mpi_args=(-np {world} -npernode {g} --bind-to none)",
        'if [ -n "$hostfile" ]; then mpi_args+=(--hostfile "$hostfile"); fi',
        "",
    ]
    xs = [f"-x {e.name}" for e in envs] + ["-x PATH"]
    launch = [
        "# The inner script is single-quoted on purpose: it expands on each rank, not here.",
        "# shellcheck disable=SC2016",
        *continued(
            'mpirun "${mpi_args[@]}"',
            ["-x MASTER_ADDR -x MASTER_PORT"]
            + [" ".join(xs[i : i + 4]) for i in range(0, len(xs), 4)]
            + [f"bash -c {q(MPI_INNER)}", 'meshplan-rank "$python" "$plan" "$run_dir" "$device" &'],
        ),
    ]
    lines += supervise(launch, "mpirun", ["# (mpirun forwards SIGUSR1 to the ranks; SIGTERM would make it end the job itself.)"])
    return "\n".join(lines) + "\n"
