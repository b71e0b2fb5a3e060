"""The Slurm launch script of a plan: sbatch + srun torchrun, one task per node (see scripts.py for what
every launch script shares: quoting, the training command, stopping and requeueing)."""

from __future__ import annotations

import re

from meshplan.estimator.errors import MeshplanError
from meshplan.planner.export._common import env_lines, q, safe_token
from meshplan.planner.export.env import EnvDefaults
from meshplan.planner.export.scripts import (
    SIGNALS,
    _check_restarts,
    check_core,
    check_engine,
    continued,
    core_block,
    program,
    restarts_block,
    script_header,
    supervise,
)
from meshplan.planner.plan_file import Plan

NODE_INNER = (
    'if [ "${SLURM_NODEID:-}" = 0 ]; then is_host=1; else is_host=0; fi; '
    'exec "$1" -m torch.distributed.run --rdzv-conf "is_host=$is_host" "${@:2}"'
)


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


def head_address_block(n: int) -> list[str]:
    """Slurm, several nodes: the rendezvous address of the allocation's first node, by IP."""
    return [
        "# Rendezvous on the first node of the allocation, by IP. Fail loudly rather than fall back to localhost.",
        "# (Two steps, not `scontrol ... | head -n 1`: under pipefail, head closing the pipe early can kill the job.)",
        'node_list=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'head_node=$(head -n 1 <<<"$node_list")',
        'if [ -z "$head_node" ]; then',
        '  echo "meshplan: scontrol found no hosts in SLURM_JOB_NODELIST=\'$SLURM_JOB_NODELIST\'" >&2',
        "  exit 1",
        "fi",
        'rdzv_port="${MESHPLAN_RDZV_PORT:-29500}"',
        'if [ -n "${MESHPLAN_HEAD_ADDR:-}" ]; then',
        '  head_node_ip="$MESHPLAN_HEAD_ADDR"',
        "else",
        "  # The head node's `hostname --ip-address`; when its name maps to a loopback address (Debian's",
        "  # 127.0.1.1 in /etc/hosts), its first non-loopback IPv4 address from `hostname --all-ip-addresses`.",
        '  head_addrs=$(srun --nodes=1 --ntasks=1 -w "$head_node" bash -c'
        " 'hostname --ip-address; hostname --all-ip-addresses')",
        "  head_node_ip=$(awk 'NR == 1 { print $1 }' <<<\"$head_addrs\")",
        '  case "$head_node_ip" in',
        '    127.*|""|::1|localhost)',
        "      head_node_ip=$(awk 'NR == 2 { for (i = 1; i <= NF; i++) if ($i !~ /^127\\./ && $i !~ /:/)"
        " { print $i; exit } }' <<<\"$head_addrs\")",
        "      ;;",
        "  esac",
        "fi",
        'case "$head_node_ip" in',
        '  127.*|""|::1|localhost)',
        f'    echo "meshplan: head node \'$head_node\' has no address the other {n - 1} node(s) can reach'
        ' (hostname --ip-address and --all-ip-addresses give only loopback);'
        ' set MESHPLAN_HEAD_ADDR to one" >&2',
        "    exit 1",
        "    ;;",
        "esac",
        'echo "meshplan: rendezvous at $head_node_ip:$rdzv_port ($head_node), job $SLURM_JOB_ID"',
        "",
    ]


def render_slurm(
    plan: Plan,
    plan_path: str,
    env: EnvDefaults,
    max_restarts: int = 0,
    partition: str | None = None,
    time: str | None = None,
    account: str | None = None,
    *,
    device: str = "cuda",
    run_dir: str = "",
    python: str | None = None,
    engine: str = "core",
    **_: object,
) -> str:
    _check_restarts(max_restarts)
    python = check_core(device, run_dir, python)
    args, prepare = program(engine)
    check_engine(plan, engine)
    partition = _slurm_value("partition", partition, _PARTITION)
    time = _slurm_value("time", time, _TIME)
    account = _slurm_value("account", account, _ACCOUNT)
    n, g = plan.cluster.nodes, plan.cluster.gpus_per_node
    unit = "GPUs" if device == "cuda" else "processes"
    usage = [
        "Submit: sbatch THIS_SCRIPT   (sbatch options on the command line override the #SBATCH lines)",
        "One task per node: srun starts one torchrun per node and torchrun starts the workers.",
        "Everything below is expanded once by the batch shell, so no per-node value ($SLURM_NODEID, ...) is used.",
    ]
    if n > 1:
        usage.append("Set MESHPLAN_HEAD_ADDR to override the rendezvous address (e.g. when hostname resolves to a bridge).")
    usage += [
        "Stop early: scancel --signal=USR1 --batch JOB (or --signal=TERM): the job checkpoints and ends COMPLETED",
        "(exit 0), or with MESHPLAN_REQUEUE=1 requeues itself; submitting the same script again resumes.",
    ]
    nvlink = plan.hardware.scale_up_gpus(g)
    if n > 1 and nvlink > g:
        usage.append(f"NVLink joins {nvlink} GPUs across nodes here ({plan.hardware.id}): the plan times groups of up "
                     f"to {min(nvlink, n * g)} ranks on it, so the {n} nodes must share one NVLink domain (Slurm's "
                     "topology/block plugin places a job in one block where it can; sbatch --segment=N keeps each "
                     "N nodes in one block).")
    lines = script_header(plan, f"Slurm (sbatch + srun torchrun, {n} x {g} {unit})", plan_path, run_dir, device, usage)
    sb = [
        f"--job-name={safe_token(plan.name)}",
        f"--nodes={n}",
        "--ntasks-per-node=1",
    ]
    if device == "cuda":
        sb.append(f"--gpus-per-node={g}")
    # append: a requeued job keeps the first run's output (Slurm truncates slurm-N.out otherwise)
    sb += ["--exclusive", "--signal=B:USR1@300", "--open-mode=append"]
    if time:
        sb.append(f"--time={time}")
    if partition:
        sb.append(f"--partition={partition}")
    if account:
        sb.append(f"--account={account}")
    lines += [f"#SBATCH {s}" for s in sb]
    lines += ["set -euo pipefail", ""]
    lines += env_lines(env.for_backend("slurm")) + [""]
    lines += core_block(plan_path, run_dir, device, python)
    lines += restarts_block(max_restarts)
    lines += [
        "",
        'if [ -z "${SLURM_JOB_ID:-}" ]; then',
        '  echo "meshplan: not inside a Slurm job; submit with: sbatch $0" >&2',
        "  exit 2",
        "fi",
        f'if [ "${{SLURM_NNODES:-0}}" -ne {n} ]; then',
        f'  echo "meshplan: the plan needs {n} node(s) but the job has ${{SLURM_NNODES:-0}}" >&2',
        "  exit 2",
        "fi",
        "",
    ]
    lines += prepare
    if n > 1:
        lines += head_address_block(n)
        rdzv = [
            '--nnodes "$SLURM_NNODES"',
            f"--nproc-per-node {g}",
            '--rdzv-id "$SLURM_JOB_ID"',
            "--rdzv-backend c10d",
            '--rdzv-endpoint "$head_node_ip:$rdzv_port"',
        ]
    else:
        lines += ["# One node: torchrun --standalone (c10d on this node), no rendezvous address needed.", ""]
        rdzv = ["--standalone", "--nnodes 1", f"--nproc-per-node {g}"]
    why = [
        "# --signal=B:USR1@300 sends SIGUSR1 to this batch shell only, 5 minutes before the time limit, as does",
        "# `scancel --signal=USR1 --batch`; srun passes SIGUSR1 on to torchrun, torchrun to the workers",
        "# (--signals-to-handle) and then exits 1. Never SIGTERM to srun: srun answers it by SIGKILLing the step.",
    ]
    node_note = [
        "# c10d's store runs on the node that recognises the endpoint as its own; torch misses an address of",
        "# another interface or a name mapped to 127.0.1.1 (then every node waits as a client), so each node",
        "# says whether it is the head (SLURM_NODEID 0, the batch node) with --rdzv-conf is_host. The wrapper",
        "# runs on each node (single-quoted on purpose) and execs the interpreter given as its first argument.",
        "# shellcheck disable=SC2016",
    ]
    first = 'srun --kill-on-bad-exit=1 "$python" -m torch.distributed.run'
    if n > 1:
        first = f'srun --kill-on-bad-exit=1 bash -c {q(NODE_INNER)} meshplan-node "$python"'
    launch = (node_note if n > 1 else []) + continued(
        first,
        [
            *rdzv,
            '--max-restarts "$max_restarts"',
            f"--signals-to-handle {SIGNALS}",
            '--shutdown-timeout "$shutdown_timeout"',
            args + " &",
        ],
    )
    lines += supervise(launch, "srun", why, requeue=True)
    return "\n".join(lines) + "\n"


# Slurm, several nodes: run by bash on every node; torchrun's options arrive as arguments, never spliced in.
