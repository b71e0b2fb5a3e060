"""Launch scripts for a plan: multi-node torchrun (c10d), Slurm (sbatch + srun torchrun), OpenMPI mpirun.

All three run meshplan's training core, `python -m launcher.core.train --plan PLAN`, on every rank. Every value
that comes from the plan or the user is shell-quoted (or, in #SBATCH lines, which bash does not parse,
validated to a plain token), so names and paths with spaces, quotes, `$(...)` or backticks stay inert.
"""

from __future__ import annotations

import re

from estimator.errors import MeshplanError
from planner.export._common import assign, comment, describe, env_lines, q, safe_token
from planner.export.env import EnvDefaults
from planner.plan_file import Plan

TRAIN_MODULE = "launcher.core.train"
# torchrun's default signal set plus SIGUSR1, which Slurm sends before the time limit (--signal)
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


def header(plan: Plan, title: str, plan_path: str, usage: list[str]) -> list[str]:
    lines = ["#!/usr/bin/env bash"]
    lines += comment(f"meshplan launch script: {title}")
    for line in describe(plan):
        lines += comment(line)
    lines += comment(f"plan file: {plan_path}")
    lines.append("#")
    for u in usage:
        lines += comment(u) if len(u) > 108 else ["# " + u]
    return lines


def continued(first: str, args: list[str], indent: str = "  ") -> list[str]:
    """`first \\` followed by one argument group per line."""
    if not args:
        return [first]
    out = [first + " \\"]
    for i, a in enumerate(args):
        out.append(indent + a + ("" if i == len(args) - 1 else " \\"))
    return out


def rendezvous_block(plan: Plan, max_restarts: int) -> list[str]:
    """Shell lines that set `plan`, `max_restarts` and (multi-node) check the c10d rendezvous host."""
    n = plan.cluster.nodes
    lines = []
    if n > 1:
        lines += [
            "# c10d rendezvous: the same command on every node; MESHPLAN_RDZV_HOST is the address of any ONE node",
            "# (it need not end up holding rank 0). No --node-rank/--master-addr/--master-port: c10d ignores them.",
            'if [ -z "${MESHPLAN_RDZV_HOST:-}" ]; then',
            f'  echo "meshplan: set MESHPLAN_RDZV_HOST to the address of one of the {n} nodes'
            ' (the same value on every node)" >&2',
            "  exit 2",
            "fi",
            'case "$MESHPLAN_RDZV_HOST" in',
            "  127.*|localhost|::1)",
            '    echo "meshplan: MESHPLAN_RDZV_HOST=$MESHPLAN_RDZV_HOST is a loopback address;'
            ' the other nodes cannot reach it" >&2',
            "    exit 2",
            "    ;;",
            "esac",
            "# One id per job, shared by all nodes; set MESHPLAN_RDZV_ID to rerun while an old rendezvous lingers.",
            f"rdzv_id={q(safe_token(plan.name))}",
            'rdzv_id="${MESHPLAN_RDZV_ID:-$rdzv_id}"',
        ]
    lines += [
        "# Restarts of the whole worker group after a failure; the training core resumes from its last checkpoint.",
        f'max_restarts="${{MESHPLAN_MAX_RESTARTS:-{int(max_restarts)}}}"',
    ]
    return lines


def torchrun_args(plan: Plan) -> list[str]:
    """torchrun's own options (no program): standalone for one node, c10d for several."""
    g = plan.cluster.gpus_per_node
    if plan.cluster.nodes == 1:
        return ["--standalone", "--nnodes 1", f"--nproc-per-node {g}", '--max-restarts "$max_restarts"']
    return [
        f"--nnodes {plan.cluster.nodes}",
        f"--nproc-per-node {g}",
        "--rdzv-backend c10d",
        '--rdzv-endpoint "$MESHPLAN_RDZV_HOST:${MESHPLAN_RDZV_PORT:-29500}"',
        '--rdzv-id "$rdzv_id"',
        '--max-restarts "$max_restarts"',
    ]


def _check_restarts(max_restarts: int) -> int:
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise MeshplanError(f"--max-restarts must be a non-negative integer, got {max_restarts!r}")
    return max_restarts


def render_torchrun(plan: Plan, plan_path: str, env: EnvDefaults, max_restarts: int = 0, **_: object) -> str:
    _check_restarts(max_restarts)
    n, g = plan.cluster.nodes, plan.cluster.gpus_per_node
    if n > 1:
        usage = [
            f"Run this same script on each of the {n} nodes ({g} GPUs each), e.g. with pdsh or a job runner:",
            "  MESHPLAN_RDZV_HOST=<address of one node> ./THIS_SCRIPT",
            "Optional: MESHPLAN_RDZV_PORT (29500), MESHPLAN_RDZV_ID (the plan name), MESHPLAN_MAX_RESTARTS.",
            "`python -m torch.distributed.run` is torchrun, run by the `python` first on PATH (your venv).",
        ]
    else:
        usage = [
            f"Single node ({g} GPUs): ./THIS_SCRIPT   (torchrun --standalone; MESHPLAN_MAX_RESTARTS optional)",
            "`python -m torch.distributed.run` is torchrun, run by the `python` first on PATH (your venv).",
        ]
    lines = header(plan, "torchrun (one command per node)", plan_path, usage)
    lines += ["set -euo pipefail", ""]
    lines += env_lines(env.for_backend("torchrun")) + [""]
    lines += assign("plan", plan_path)
    lines += rendezvous_block(plan, max_restarts) + [""]
    lines += continued(
        "exec python -m torch.distributed.run", torchrun_args(plan) + [f'-m {TRAIN_MODULE} --plan "$plan"']
    )
    return "\n".join(lines) + "\n"


_PARTITION = re.compile(r"^[A-Za-z0-9_.,@+-]{1,128}$")
_ACCOUNT = re.compile(r"^[A-Za-z0-9_.@+-]{1,128}$")
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^(\d+-\d+)$|^(UNLIMITED|unlimited|infinite|INFINITE)$")


def _slurm_value(flag: str, value: str | None, pattern: re.Pattern) -> str | None:
    if value is None or value == "":
        return None
    value = str(value)
    if not pattern.match(value):
        raise MeshplanError(
            f"--{flag} {value!r} is not a valid Slurm {flag}"
            + (" (e.g. 2-00:00:00, 48:00:00 or minutes)" if flag == "time" else " (letters, digits and _ . - only)")
        )
    return value


def render_slurm(
    plan: Plan,
    plan_path: str,
    env: EnvDefaults,
    max_restarts: int = 0,
    partition: str | None = None,
    time: str | None = None,
    account: str | None = None,
    **_: object,
) -> str:
    _check_restarts(max_restarts)
    partition = _slurm_value("partition", partition, _PARTITION)
    time = _slurm_value("time", time, _TIME)
    account = _slurm_value("account", account, _ACCOUNT)
    n, g = plan.cluster.nodes, plan.cluster.gpus_per_node
    usage = [
        "Submit: sbatch THIS_SCRIPT   (sbatch options on the command line override the #SBATCH lines)",
        "One task per node: srun starts one torchrun per node and torchrun starts the GPU workers.",
        "Everything below is expanded once by the batch shell, so no per-node value ($SLURM_NODEID, ...) is used.",
        "Set MESHPLAN_HEAD_ADDR to override the rendezvous address (e.g. when hostname resolves to a bridge).",
    ]
    lines = header(plan, f"Slurm (sbatch + srun torchrun, {n} x {g} GPUs)", plan_path, usage)
    sb = [
        f"--job-name={safe_token(plan.name)}",
        f"--nodes={n}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={g}",
        "--exclusive",
        "--signal=B:USR1@300",
    ]
    if time:
        sb.append(f"--time={time}")
    if partition:
        sb.append(f"--partition={partition}")
    if account:
        sb.append(f"--account={account}")
    lines += [f"#SBATCH {s}" for s in sb]
    lines += ["set -euo pipefail", ""]
    lines += env_lines(env.for_backend("slurm")) + [""]
    lines += assign("plan", plan_path)
    lines += [
        "# Restarts of the whole worker group after a failure; the training core resumes from its last checkpoint.",
        f'max_restarts="${{MESHPLAN_MAX_RESTARTS:-{int(max_restarts)}}}"',
        'rdzv_port="${MESHPLAN_RDZV_PORT:-29500}"',
        "",
        'if [ -z "${SLURM_JOB_ID:-}" ]; then',
        '  echo "meshplan: not inside a Slurm job; submit with: sbatch $0" >&2',
        "  exit 2",
        "fi",
        f'if [ "${{SLURM_NNODES:-0}}" -ne {n} ]; then',
        f'  echo "meshplan: the plan needs {n} nodes but the job has ${{SLURM_NNODES:-0}}" >&2',
        "  exit 2",
        "fi",
        "",
        "# Rendezvous on the first node of the allocation, by IP. Fail loudly rather than fall back to localhost.",
        "# (Two steps, not `scontrol ... | head -n 1`: under pipefail, head closing the pipe early can kill the job.)",
        'node_list=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'head_node=$(head -n 1 <<<"$node_list")',
        'if [ -z "$head_node" ]; then',
        '  echo "meshplan: scontrol found no hosts in SLURM_JOB_NODELIST=\'$SLURM_JOB_NODELIST\'" >&2',
        "  exit 1",
        "fi",
        'if [ -n "${MESHPLAN_HEAD_ADDR:-}" ]; then',
        '  head_node_ip="$MESHPLAN_HEAD_ADDR"',
        "else",
        '  head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk \'{print $1}\')',
        "fi",
        'case "$head_node_ip" in',
        '  127.*|""|::1|localhost)',
        '    echo "meshplan: head node \'$head_node\' resolved to \'$head_node_ip\';'
        ' set MESHPLAN_HEAD_ADDR to an address the other nodes can reach" >&2',
        "    exit 1",
        "    ;;",
        "esac",
        'echo "meshplan: rendezvous at $head_node_ip:$rdzv_port ($head_node), job $SLURM_JOB_ID"',
        "",
        "# --signal=B:USR1@300 warns this batch shell 5 minutes before the time limit: forward it to the job step,",
        "# where torchrun passes it on to the workers (--signals-to-handle) and the training core checkpoints.",
        "# (A torchrun too old for --signals-to-handle rejects it: drop that line and rely on SIGTERM at the limit.)",
    ]
    lines += continued(
        "srun --kill-on-bad-exit=1 torchrun",
        [
            '--nnodes "$SLURM_NNODES"',
            f"--nproc-per-node {g}",
            '--rdzv-id "$SLURM_JOB_ID"',
            "--rdzv-backend c10d",
            '--rdzv-endpoint "$head_node_ip:$rdzv_port"',
            '--max-restarts "$max_restarts"',
            f"--signals-to-handle {SIGNALS}",
            f'-m {TRAIN_MODULE} --plan "$plan" &',
        ],
    )
    lines += [
        "step_pid=$!",
        "trap 'echo \"meshplan: time limit near, forwarding SIGUSR1\" >&2; kill -USR1 \"$step_pid\" 2>/dev/null || true' USR1",
        "status=0",
        "while :; do",
        '  wait "$step_pid" && status=0 || status=$?',
        '  if kill -0 "$step_pid" 2>/dev/null; then continue; fi  # woken by the trap, not by the step ending',
        "  break",
        "done",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


# Run by bash on every rank; the plan path arrives as $1, never spliced into this text.
MPI_INNER = (
    ': "${OMPI_COMM_WORLD_RANK:?not started by Open MPI mpirun}"; '
    'export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" '
    'LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"; '
    f'exec python -m {TRAIN_MODULE} --plan "$1"'
)


def render_mpirun(plan: Plan, plan_path: str, env: EnvDefaults, **_: object) -> str:
    n, g, world = plan.cluster.nodes, plan.cluster.gpus_per_node, plan.cluster.gpus
    envs = env.for_backend("mpirun")
    usage = [
        f"Open MPI: one rank per GPU, {world} ranks on {n} node(s) of {g}; no torchrun (so no --max-restarts).",
        "  MESHPLAN_HOSTFILE=hosts ./THIS_SCRIPT     (MASTER_ADDR defaults to the first host in the hostfile)",
        "  MASTER_ADDR=<head address> ./THIS_SCRIPT  (when mpirun finds the hosts itself, e.g. inside an allocation)",
        "Ranks map OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} to RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE;",
        "only MASTER_ADDR/MASTER_PORT, the environment defaults below and PATH are passed to the ranks (-x).",
    ]
    lines = header(plan, f"OpenMPI mpirun ({world} ranks)", plan_path, usage)
    lines += ["set -euo pipefail", ""]
    lines += env_lines(envs) + [""]
    lines += assign("plan", plan_path)
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
        "# The inner script is single-quoted on purpose: it expands on each rank, not here.",
        "# shellcheck disable=SC2016",
    ]
    xs = [f"-x {e.name}" for e in envs] + ["-x PATH"]
    lines += continued(
        'mpirun "${mpi_args[@]}"',
        ["-x MASTER_ADDR -x MASTER_PORT"]
        + [" ".join(xs[i : i + 4]) for i in range(0, len(xs), 4)]
        + [f"bash -c {q(MPI_INNER)}", 'meshplan-rank "$plan"'],
    )
    return "\n".join(lines) + "\n"
