#!/usr/bin/env bash
# meshplan launch script: torchrun (one command per node)
# plan: llama3-405b-512gpu
# model: llama3-405b (405.85 B params, 126 layers) from llama3-405b
# cluster: 64 node(s) x 8 h100-sxm = 512 GPUs
# parallel: dp_replicate 1 x dp_shard 8 x cp 1 x tp 8 x pp 8 (Interleaved1F1B, 2 stages per rank); AC full,
# compile on, float8 tensorwise, async TP
# training: seq_len 8192, global batch 512 sequences (4,194,304 tokens), micro-batch 1, 1000 steps
# estimate: none stored in the plan (run `meshplan estimate --plan PLAN`)
# plan file: /shared/plans/llama3-405b-64x8.yaml
# run dir: /shared/runs/llama3-405b-64x8 (metrics, checkpoints; on storage every node shares)
# device: cuda (NCCL)
#
# Run this same script on each of the 64 nodes (8 GPUs each), e.g. with pdsh or a job runner:
#   MESHPLAN_RDZV_HOST=<address of one node> ./THIS_SCRIPT
# Optional: MESHPLAN_RDZV_PORT (29500), MESHPLAN_RDZV_ID (the plan name), MESHPLAN_LOCAL_ADDR,
# MESHPLAN_MAX_RESTARTS, MESHPLAN_SHUTDOWN_TIMEOUT, MESHPLAN_PYTHON.
# SIGUSR1 or SIGTERM: checkpoint and stop; exit 0 once the checkpoint is complete.
set -euo pipefail

# Environment defaults (meshplan's data/launch/env.yaml). A value already set in the environment wins.
# OMP_NUM_THREADS: torchrun sets 1 anyway when it is unset (with a warning) and mpirun sets nothing, so eight
# ranks per node would each start one OpenMP thread per core and oversubscribe the CPUs. Raise it for CPU-
# heavy data pipelines.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# PYTORCH_CUDA_ALLOC_CONF: Expandable segments cut allocator fragmentation, which the planner's peak-reserved
# estimate assumes. The old name is still the one torch 2.9.x honours for CUDA (pytorch#183387).
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
# PYTORCH_ALLOC_CONF: The new, device-generic name of the same setting (torchtitan's run_train.sh uses it);
# set both so old and new torch releases see it.
export PYTORCH_ALLOC_CONF="${PYTORCH_ALLOC_CONF:-expandable_segments:True}"
# TORCH_NCCL_ASYNC_ERROR_HANDLING: Abort NCCL communicators and tear the process down when a collective fails
# or times out, so a dead rank ends the job (and torchrun can restart it) instead of hanging every other rank.
export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
# NCCL_DEBUG: Print NCCL warnings and errors only; INFO floods the logs of a multi-node job. Use INFO (with
# NCCL_DEBUG_SUBSYS=INIT,NET) to debug a hang, not in production.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# PYTHONUNBUFFERED: Flush rank 0's progress lines immediately, so a Slurm output file or a tailed log shows
# where a job is rather than what was buffered before it died.
export PYTHONUNBUFFERED="${PYTHONUNBUFFERED:-1}"
# PYTHONFAULTHANDLER: Dump Python tracebacks on a segfault or a fatal signal, the only trace a crashed worker
# leaves.
export PYTHONFAULTHANDLER="${PYTHONFAULTHANDLER:-1}"

plan=/shared/plans/llama3-405b-64x8.yaml
run_dir=/shared/runs/llama3-405b-64x8
device=cuda
# The interpreter meshplan was installed with (no activated venv needed); MESHPLAN_PYTHON overrides it.
python=/opt/meshplan/.venv/bin/python
python="${MESHPLAN_PYTHON:-$python}"
# Restarts of the whole worker group after a failure; the training core resumes from its last checkpoint.
max_restarts="${MESHPLAN_MAX_RESTARTS:-0}"
# Seconds torchrun waits for the workers to checkpoint after a stop signal before it kills them.
shutdown_timeout="${MESHPLAN_SHUTDOWN_TIMEOUT:-240}"
# c10d rendezvous: the same command on every node; MESHPLAN_RDZV_HOST is the address of any ONE node
# (it need not end up holding rank 0). No --node-rank/--master-addr/--master-port: c10d ignores them.
if [ -z "${MESHPLAN_RDZV_HOST:-}" ]; then
  echo "meshplan: set MESHPLAN_RDZV_HOST to the address of one of the 64 nodes (the same value on every node)" >&2
  exit 2
fi
case "$MESHPLAN_RDZV_HOST" in
  127.*|localhost|::1)
    echo "meshplan: MESHPLAN_RDZV_HOST=$MESHPLAN_RDZV_HOST is a loopback address; the other nodes cannot reach it" >&2
    exit 2
    ;;
esac
# One id per job, shared by all nodes; set MESHPLAN_RDZV_ID to rerun while an old rendezvous lingers.
rdzv_id=llama3-405b-512gpu
rdzv_id="${MESHPLAN_RDZV_ID:-$rdzv_id}"
# This node's address as the others reach it (torchrun --local-addr), when its host name does not
# resolve to one (e.g. Debian's 127.0.1.1 in /etc/hosts); default: the host name.
local_addr=()
if [ -n "${MESHPLAN_LOCAL_ADDR:-}" ]; then local_addr=(--local-addr "$MESHPLAN_LOCAL_ADDR"); fi
# c10d's store runs on the node that recognises MESHPLAN_RDZV_HOST as its own name or address; torch
# misses addresses of other interfaces and names mapped to 127.0.1.1 (then no node hosts it and all
# wait), so the node that has the address among its own says so (--rdzv-conf is_host=1).
rdzv_conf=()
read -r -a own_addrs <<<"$(hostname --all-ip-addresses 2>/dev/null || true)"
for a in ${own_addrs[@]+"${own_addrs[@]}"}; do
  if [ "$a" = "$MESHPLAN_RDZV_HOST" ]; then rdzv_conf=(--rdzv-conf is_host=1); fi
done

# Stopping: SIGUSR1 or SIGTERM to this script becomes ONE SIGUSR1 for torchrun, which the workers get:
# they finish the step, checkpoint and exit 0.
# (torchrun passes it on: --signals-to-handle; it then exits 1 itself.)
# The checkpoint is complete when the "latest" pointer in the run dir moves; see the end of this script.
latest="$run_dir/checkpoints/latest"
stop_signal=""
stop_mark=""
child=""
# shellcheck disable=SC2317  # run by the traps below
request_stop() {
  if [ -n "$stop_signal" ]; then return 0; fi
  stop_signal="$1"
  stop_mark=$(cat "$latest" 2>/dev/null || true)
  echo "meshplan: $1: asking the training core to checkpoint and stop (SIGUSR1 to torchrun)" >&2
  if [ -n "$child" ]; then kill -USR1 "$child" 2>/dev/null || true; fi
}
trap 'request_stop SIGUSR1' USR1
trap 'request_stop SIGTERM' TERM

if [ -n "$stop_signal" ]; then
  echo "meshplan: $stop_signal before torchrun started: nothing trained, nothing to checkpoint" >&2
  exit 1
fi
"$python" -m torch.distributed.run \
  --nnodes 64 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MESHPLAN_RDZV_HOST:${MESHPLAN_RDZV_PORT:-29500}" \
  --rdzv-id "$rdzv_id" \
  ${local_addr[@]+"${local_addr[@]}"} \
  ${rdzv_conf[@]+"${rdzv_conf[@]}"} \
  --max-restarts "$max_restarts" \
  --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
  --shutdown-timeout "$shutdown_timeout" \
  -m meshplan.launcher.run_plan --plan "$plan" --run-dir "$run_dir" --device "$device" &
child=$!
if [ -n "$stop_signal" ]; then kill -USR1 "$child" 2>/dev/null || true; fi  # a stop right at the start
status=0
while :; do
  wait "$child" && status=0 || status=$?
  if kill -0 "$child" 2>/dev/null; then continue; fi  # woken by a trap, not by the end of the launch
  break
done
if [ -n "$stop_signal" ]; then
  saved=$(cat "$latest" 2>/dev/null || true)
  if [ -n "$saved" ] && [ "$saved" != "$stop_mark" ]; then
    echo "meshplan: stopped on $stop_signal with checkpoint $saved complete (torchrun exited $status); the same plan and run dir resume from it" >&2
    status=0
  elif [ "$status" -ne 0 ]; then
    echo "meshplan: stopped on $stop_signal but no new checkpoint in $run_dir/checkpoints (latest: ${saved:-none}); torchrun exited $status" >&2
  fi
fi
exit "$status"
