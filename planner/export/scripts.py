"""Launch scripts for a plan: multi-node torchrun (c10d), Slurm (sbatch + srun torchrun), OpenMPI mpirun.

All three run meshplan's training core on every rank, always as

    "$python" -m meshplan.launcher.run_plan --plan "$plan" --run-dir "$run_dir" --device "$device"

with `python` the absolute interpreter meshplan was installed with (MESHPLAN_PYTHON overrides it at run time; no
activated venv is needed on the nodes), `run_dir` an absolute path and `device` cuda (NCCL) unless cpu (gloo) was
asked for. Every value that comes from the plan or the user is shell-quoted (or, in #SBATCH lines, which bash
does not parse, validated to a plain token), so names and paths with spaces, quotes, `$(...)` or backticks stay
inert.

Stopping: each script runs its launcher (torchrun, srun or mpirun) in the background and turns SIGUSR1 or
SIGTERM into one SIGUSR1 for it; the launcher passes it to the workers, which finish the step, checkpoint and
exit 0. torchrun itself then exits 1 (it re-raises the signal), so the script decides its own status: 0 when a
stop was requested and the run dir's `checkpoints/latest` pointer moved since (the checkpoint completed), else
the launcher's status. Slurm with MESHPLAN_REQUEUE=1 then requeues the job, which resumes from that checkpoint.
"""

from __future__ import annotations

import sys

from meshplan.estimator.errors import MeshplanError
from meshplan.planner.export._common import assign, comment, describe, env_lines, q, safe_token
from meshplan.planner.export.env import EnvDefaults
from meshplan.planner.plan_file import Plan

TRAIN_MODULE = "meshplan.launcher.run_plan"
DEVICES = ("cuda", "cpu")
# torchrun's default signal set plus SIGUSR1, which Slurm sends before the time limit (--signal) and which the
# scripts use to ask for a checkpoint-and-stop
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# seconds torchrun gives the workers to checkpoint after a stop signal before it SIGKILLs them (its own default
# is 30); below the 300 s of Slurm's --signal=B:USR1@300 warning
SHUTDOWN_TIMEOUT = 240
CORE_ARGS = f'-m {TRAIN_MODULE} --plan "$plan" --run-dir "$run_dir" --device "$device"'
ENGINES = ("core", "torchtitan")
# `--engine torchtitan`: torchtitan 0.3's entry point on the module `meshplan export -f torchtitan-py` writes into
# RUN_DIR/TITAN_JOB_DIR (its own folder on PYTHONPATH, so nothing else there can shadow a package); torchtitan
# writes its checkpoints and logs under --dump_folder, the run dir.
TITAN_JOB_DIR = "torchtitan-job"
TITAN_MODULE = "meshplan_job"
TITAN_ARGS = (f'-m torchtitan.train --module {TITAN_MODULE} --config meshplan_config --dump_folder "$run_dir"')


def program(engine: str) -> tuple[str, list[str]]:
    """(torchrun's program arguments, shell lines that prepare them) for the training engine."""
    if engine == "core":
        return CORE_ARGS, []
    if engine == "torchtitan":
        return TITAN_ARGS, [
            f"# torchtitan 0.3 runs the plan's config function from {TITAN_JOB_DIR}/{TITAN_MODULE}.py in the run dir.",
            f'export PYTHONPATH="$run_dir/{TITAN_JOB_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"',
        ]
    raise MeshplanError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")


def check_engine(plan: Plan, engine: str) -> None:
    """MeshplanError (one line) when `engine` cannot run `plan` as planned (the core and a DeepEP plan)."""
    from meshplan.planner.plan_file import core_refusal

    why = core_refusal(plan) if engine == "core" else None
    if why:
        raise MeshplanError(why)


# --- shared with the torchtitan-cli export (planner/export/torchtitan.py); keep their output stable ---
def header(plan: Plan, title: str, plan_path: str, usage: list[str], facts: tuple[str, ...] = ()) -> list[str]:
    """The script's opening comment: title, the plan, `facts` (one comment each), then the usage lines."""
    lines = ["#!/usr/bin/env bash"]
    lines += comment(f"meshplan launch script: {title}")
    for line in describe(plan):
        lines += comment(line)
    lines += comment(f"plan file: {plan_path}")
    for fact in facts:
        lines += comment(fact)
    lines.append("#")
    for u in usage:
        lines += comment(u) if len(u) > 108 else ["# " + u]
    return lines


def rdzv_host_check(plan: Plan) -> list[str]:
    """Multi-node c10d: fail fast without a reachable MESHPLAN_RDZV_HOST; set `rdzv_id`."""
    n = plan.cluster.nodes
    return [
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


def rendezvous_block(plan: Plan, max_restarts: int) -> list[str]:
    """Shell lines that set `plan`, `max_restarts` and (multi-node) check the c10d rendezvous host."""
    n = plan.cluster.nodes
    lines = []
    if n > 1:
        lines += rdzv_host_check(plan)
    lines += [
        "# Restarts of the whole worker group after a failure; the training core resumes from its last checkpoint.",
        f'max_restarts="${{MESHPLAN_MAX_RESTARTS:-{int(max_restarts)}}}"',
    ]
    return lines


def torchrun_args(plan: Plan, node: tuple[str, ...] = (), tail: tuple[str, ...] = ()) -> list[str]:
    """torchrun's own options (no program): standalone for one node, c10d for several (then `node`, this node's
    rendezvous options, after the rendezvous id); `tail` after --max-restarts."""
    g = plan.cluster.gpus_per_node
    if plan.cluster.nodes == 1:
        return ["--standalone", "--nnodes 1", f"--nproc-per-node {g}", '--max-restarts "$max_restarts"', *tail]
    return [
        f"--nnodes {plan.cluster.nodes}",
        f"--nproc-per-node {g}",
        "--rdzv-backend c10d",
        '--rdzv-endpoint "$MESHPLAN_RDZV_HOST:${MESHPLAN_RDZV_PORT:-29500}"',
        '--rdzv-id "$rdzv_id"',
        *node,
        '--max-restarts "$max_restarts"',
        *tail,
    ]


# --- meshplan's own scripts ---
def script_header(plan: Plan, title: str, plan_path: str, run_dir: str, device: str, usage: list[str]) -> list[str]:
    return header(plan, title, plan_path, usage, (
        f"run dir: {run_dir} (metrics, checkpoints; on storage every node shares)",
        f"device: {device} ({'NCCL' if device == 'cuda' else 'gloo, a CPU run'})",
    ))


def continued(first: str, args: list[str], indent: str = "  ") -> list[str]:
    """`first \\` followed by one argument group per line."""
    if not args:
        return [first]
    out = [first + " \\"]
    for i, a in enumerate(args):
        out.append(indent + a + ("" if i == len(args) - 1 else " \\"))
    return out


def core_block(plan_path: str, run_dir: str, device: str, python: str) -> list[str]:
    """Shell lines that set `plan`, `run_dir`, `device` and `python` (the training core's command line)."""
    return [
        *assign("plan", plan_path),
        *assign("run_dir", run_dir),
        f"device={q(device)}",
        "# The interpreter meshplan was installed with (no activated venv needed); MESHPLAN_PYTHON overrides it.",
        *assign("python", python),
        'python="${MESHPLAN_PYTHON:-$python}"',
    ]


def restarts_block(max_restarts: int) -> list[str]:
    return [
        "# Restarts of the whole worker group after a failure; the training core resumes from its last checkpoint.",
        f'max_restarts="${{MESHPLAN_MAX_RESTARTS:-{int(max_restarts)}}}"',
        "# Seconds torchrun waits for the workers to checkpoint after a stop signal before it kills them.",
        f'shutdown_timeout="${{MESHPLAN_SHUTDOWN_TIMEOUT:-{SHUTDOWN_TIMEOUT}}}"',
    ]


def c10d_block(plan: Plan) -> list[str]:
    """Multi-node torchrun: check the c10d rendezvous host, set `rdzv_id`."""
    n = plan.cluster.nodes
    if n == 1:
        return []
    return rdzv_host_check(plan) + [
        "# This node's address as the others reach it (torchrun --local-addr), when its host name does not",
        "# resolve to one (e.g. Debian's 127.0.1.1 in /etc/hosts); default: the host name.",
        "local_addr=()",
        'if [ -n "${MESHPLAN_LOCAL_ADDR:-}" ]; then local_addr=(--local-addr "$MESHPLAN_LOCAL_ADDR"); fi',
        "# c10d's store runs on the node that recognises MESHPLAN_RDZV_HOST as its own name or address; torch",
        "# misses addresses of other interfaces and names mapped to 127.0.1.1 (then no node hosts it and all",
        "# wait), so the node that has the address among its own says so (--rdzv-conf is_host=1).",
        "rdzv_conf=()",
        'read -r -a own_addrs <<<"$(hostname --all-ip-addresses 2>/dev/null || true)"',
        'for a in ${own_addrs[@]+"${own_addrs[@]}"}; do',
        '  if [ "$a" = "$MESHPLAN_RDZV_HOST" ]; then rdzv_conf=(--rdzv-conf is_host=1); fi',
        "done",
    ]


def core_torchrun_args(plan: Plan) -> list[str]:
    """torchrun's own options for the core: this node's address and rendezvous role (c10d_block), and the stop
    signals with time to checkpoint."""
    return torchrun_args(
        plan,
        node=('${local_addr[@]+"${local_addr[@]}"}', '${rdzv_conf[@]+"${rdzv_conf[@]}"}'),
        tail=(f"--signals-to-handle {SIGNALS}", '--shutdown-timeout "$shutdown_timeout"'),
    )


def supervise(launch: list[str], what: str, why: list[str], requeue: bool = False) -> list[str]:
    """Run the `launch` lines (a command ending in `&`) in the background, turn SIGUSR1/SIGTERM into one SIGUSR1
    for it, wait, and exit with an honest status (see the module docstring). `why`: comment lines on how the
    signal travels from `what` on."""
    lines = [
        f"# Stopping: SIGUSR1 or SIGTERM to this script becomes ONE SIGUSR1 for {what}, which the workers get:",
        "# they finish the step, checkpoint and exit 0.",
        *why,
        '# The checkpoint is complete when the "latest" pointer in the run dir moves; see the end of this script.',
        'latest="$run_dir/checkpoints/latest"',
        'stop_signal=""',
        'stop_mark=""',
        'child=""',
        "# shellcheck disable=SC2317  # run by the traps below",
        "request_stop() {",
        '  if [ -n "$stop_signal" ]; then return 0; fi',
        '  stop_signal="$1"',
        '  stop_mark=$(cat "$latest" 2>/dev/null || true)',
        f'  echo "meshplan: $1: asking the training core to checkpoint and stop (SIGUSR1 to {what})" >&2',
        '  if [ -n "$child" ]; then kill -USR1 "$child" 2>/dev/null || true; fi',
        "}",
        "trap 'request_stop SIGUSR1' USR1",
        "trap 'request_stop SIGTERM' TERM",
        "",
        'if [ -n "$stop_signal" ]; then',
        f'  echo "meshplan: $stop_signal before {what} started: nothing trained, nothing to checkpoint" >&2',
        "  exit 1",
        "fi",
        *launch,
        "child=$!",
        'if [ -n "$stop_signal" ]; then kill -USR1 "$child" 2>/dev/null || true; fi  # a stop right at the start',
        "status=0",
        "while :; do",
        '  wait "$child" && status=0 || status=$?',
        '  if kill -0 "$child" 2>/dev/null; then continue; fi  # woken by a trap, not by the end of the launch',
        "  break",
        "done",
        'if [ -n "$stop_signal" ]; then',
        '  saved=$(cat "$latest" 2>/dev/null || true)',
        '  if [ -n "$saved" ] && [ "$saved" != "$stop_mark" ]; then',
        f'    echo "meshplan: stopped on $stop_signal with checkpoint $saved complete ({what} exited $status);'
        ' the same plan and run dir resume from it" >&2',
        "    status=0",
    ]
    if requeue:
        lines += [
            '    if [ "${MESHPLAN_REQUEUE:-0}" = 1 ]; then',
            '      if scontrol requeue "$SLURM_JOB_ID"; then',
            '        echo "meshplan: requeued job $SLURM_JOB_ID; it resumes from $saved" >&2',
            "      else",
            '        echo "meshplan: scontrol requeue $SLURM_JOB_ID failed; resubmit this script to resume" >&2',
            "      fi",
            "    fi",
        ]
    lines += [
        '  elif [ "$status" -ne 0 ]; then',
        f'    echo "meshplan: stopped on $stop_signal but no new checkpoint in $run_dir/checkpoints'
        f' (latest: ${{saved:-none}}); {what} exited $status" >&2',
        "  fi",
        "fi",
        'exit "$status"',
    ]
    return lines


def _check_restarts(max_restarts: int) -> int:
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise MeshplanError(f"--max-restarts must be a non-negative integer, got {max_restarts!r}")
    return max_restarts


def check_core(device: str, run_dir: str, python: str | None) -> str:
    """Validate the core's device / run dir; return the interpreter (sys.executable when None)."""
    if device not in DEVICES:
        raise MeshplanError(f"--device must be cuda or cpu, got {device!r}")
    if not run_dir or "\x00" in run_dir or not run_dir.startswith("/"):
        raise MeshplanError(f"the run dir must be an absolute path, got {run_dir!r}")
    python = python if python is not None else (sys.executable or "python3")
    if not python or "\x00" in python:
        raise MeshplanError("the python interpreter must be a non-empty path")
    return python


def render_torchrun(plan: Plan, plan_path: str, env: EnvDefaults, max_restarts: int = 0, *, device: str = "cuda",
                    run_dir: str = "", python: str | None = None, engine: str = "core", **_: object) -> str:
    _check_restarts(max_restarts)
    python = check_core(device, run_dir, python)
    args, prepare = program(engine)
    check_engine(plan, engine)
    n, g = plan.cluster.nodes, plan.cluster.gpus_per_node
    unit = "GPUs" if device == "cuda" else "processes"
    if n > 1:
        usage = [
            f"Run this same script on each of the {n} nodes ({g} {unit} each), e.g. with pdsh or a job runner:",
            "  MESHPLAN_RDZV_HOST=<address of one node> ./THIS_SCRIPT",
            "Optional: MESHPLAN_RDZV_PORT (29500), MESHPLAN_RDZV_ID (the plan name), MESHPLAN_LOCAL_ADDR,",
            "MESHPLAN_MAX_RESTARTS, MESHPLAN_SHUTDOWN_TIMEOUT, MESHPLAN_PYTHON.",
        ]
    else:
        usage = [
            f"Single node ({g} {unit}): ./THIS_SCRIPT   (torchrun --standalone: no rendezvous address needed)",
            "Optional: MESHPLAN_MAX_RESTARTS, MESHPLAN_SHUTDOWN_TIMEOUT, MESHPLAN_PYTHON.",
        ]
    usage.append("SIGUSR1 or SIGTERM: checkpoint and stop; exit 0 once the checkpoint is complete.")
    lines = script_header(plan, "torchrun (one command per node)", plan_path, run_dir, device, usage)
    lines += ["set -euo pipefail", ""]
    lines += env_lines(env.for_backend("torchrun")) + [""]
    lines += core_block(plan_path, run_dir, device, python)
    lines += restarts_block(max_restarts)
    lines += c10d_block(plan) + prepare + [""]
    launch = continued('"$python" -m torch.distributed.run', core_torchrun_args(plan) + [args + " &"])
    lines += supervise(launch, "torchrun", ["# (torchrun passes it on: --signals-to-handle; it then exits 1 itself.)"])
    return "\n".join(lines) + "\n"
