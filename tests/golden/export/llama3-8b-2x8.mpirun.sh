#!/usr/bin/env bash
# meshplan launch script: OpenMPI mpirun (16 ranks)
# plan: llama3-8b-16gpu
# model: llama3-8b (8.03 B params, 32 layers) from llama3-8b
# cluster: 2 node(s) x 8 h100-sxm = 16 GPUs
# parallel: dp_replicate 1 x dp_shard 16 x cp 1 x tp 1 x pp 1; AC selective, compile on, float8 none
# training: seq_len 8192, global batch 32 sequences (262,144 tokens), micro-batch 1, 1000 steps
# estimate: peak 61.2 GiB/GPU of 72.0 usable, 7,421 tokens/s/GPU, MFU 41.2%
# plan file: /shared/plans/llama3-8b-2x8.yaml
# run dir: /shared/runs/llama3-8b-2x8 (metrics, checkpoints; on storage every node shares)
# device: cuda (NCCL)
#
# Open MPI: one rank per GPU, 16 ranks on 2 node(s) of 8; no torchrun (so no --max-restarts).
#   MESHPLAN_HOSTFILE=hosts ./THIS_SCRIPT     (MASTER_ADDR defaults to the first host in the hostfile)
#   MASTER_ADDR=<head address> ./THIS_SCRIPT  (when mpirun finds the hosts itself, e.g. inside an allocation)
# Ranks map OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} to RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE
# and run the absolute interpreter below (same path on every node; MESHPLAN_PYTHON overrides it), so PATH on
# the nodes does not matter; only MASTER_ADDR/MASTER_PORT, the environment defaults below and PATH are
# passed to the ranks (-x). As root, Open MPI wants --allow-run-as-root or OMPI_ALLOW_RUN_AS_ROOT=1 plus
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (set them yourself; this script does not).
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

plan=/shared/plans/llama3-8b-2x8.yaml
run_dir=/shared/runs/llama3-8b-2x8
device=cuda
# The interpreter meshplan was installed with (no activated venv needed); MESHPLAN_PYTHON overrides it.
python=/opt/meshplan/.venv/bin/python
python="${MESHPLAN_PYTHON:-$python}"
hostfile="${MESHPLAN_HOSTFILE:-}"
if [ -z "${MASTER_ADDR:-}" ] && [ -n "$hostfile" ]; then
  # first host of the hostfile (lines look like `node01 slots=8`; comments and blank lines skipped)
  MASTER_ADDR=$(awk '$1 !~ /^#/ && NF { print $1; exit }' "$hostfile")
fi
case "${MASTER_ADDR:-}" in
  "")
    echo "meshplan: 2 nodes need MASTER_ADDR (an address of the node with rank 0) or MESHPLAN_HOSTFILE" >&2
    exit 2
    ;;
  127.*|localhost|::1)
    echo "meshplan: MASTER_ADDR=$MASTER_ADDR is a loopback address; the other nodes cannot reach it" >&2
    exit 2
    ;;
esac
export MASTER_ADDR
export MASTER_PORT="${MASTER_PORT:-29500}"

mpi_args=(-np 16 -npernode 8 --bind-to none)
if [ -n "$hostfile" ]; then mpi_args+=(--hostfile "$hostfile"); fi

# Stopping: SIGUSR1 or SIGTERM to this script becomes ONE SIGUSR1 for mpirun, which the workers get:
# they finish the step, checkpoint and exit 0.
# (mpirun forwards SIGUSR1 to the ranks; SIGTERM would make it end the job itself.)
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
  echo "meshplan: $1: asking the training core to checkpoint and stop (SIGUSR1 to mpirun)" >&2
  if [ -n "$child" ]; then kill -USR1 "$child" 2>/dev/null || true; fi
}
trap 'request_stop SIGUSR1' USR1
trap 'request_stop SIGTERM' TERM

if [ -n "$stop_signal" ]; then
  echo "meshplan: $stop_signal before mpirun started: nothing trained, nothing to checkpoint" >&2
  exit 1
fi
# The inner script is single-quoted on purpose: it expands on each rank, not here.
# shellcheck disable=SC2016
mpirun "${mpi_args[@]}" \
  -x MASTER_ADDR -x MASTER_PORT \
  -x OMP_NUM_THREADS -x PYTORCH_CUDA_ALLOC_CONF -x PYTORCH_ALLOC_CONF -x TORCH_NCCL_ASYNC_ERROR_HANDLING \
  -x NCCL_DEBUG -x PYTHONUNBUFFERED -x PYTHONFAULTHANDLER -x PATH \
  bash -c ': "${OMPI_COMM_WORLD_RANK:?not started by Open MPI mpirun}"; export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"; exec "$1" -m meshplan.launcher.run_plan --plan "$2" --run-dir "$3" --device "$4"' \
  meshplan-rank "$python" "$plan" "$run_dir" "$device" &
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
    echo "meshplan: stopped on $stop_signal with checkpoint $saved complete (mpirun exited $status); the same plan and run dir resume from it" >&2
    status=0
  elif [ "$status" -ne 0 ]; then
    echo "meshplan: stopped on $stop_signal but no new checkpoint in $run_dir/checkpoints (latest: ${saved:-none}); mpirun exited $status" >&2
  fi
fi
exit "$status"
