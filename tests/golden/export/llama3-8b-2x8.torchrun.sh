#!/usr/bin/env bash
# meshplan launch script: torchrun (one command per node)
# plan: llama3-8b-16gpu
# model: llama3-8b (8.03 B params, 32 layers) from llama3-8b
# cluster: 2 node(s) x 8 h100-sxm = 16 GPUs
# parallel: dp_replicate 1 x dp_shard 16 x cp 1 x tp 1 x pp 1; AC selective, compile on, float8 none
# training: seq_len 8192, global batch 32 sequences (262,144 tokens), micro-batch 1, 1000 steps
# estimate: peak 61.2 GiB/GPU of 72.0 usable, 7,421 tokens/s/GPU, MFU 41.2%
# plan file: /shared/plans/llama3-8b-2x8.yaml
#
# Run this same script on each of the 2 nodes (8 GPUs each), e.g. with pdsh or a job runner:
#   MESHPLAN_RDZV_HOST=<address of one node> ./THIS_SCRIPT
# Optional: MESHPLAN_RDZV_PORT (29500), MESHPLAN_RDZV_ID (the plan name), MESHPLAN_MAX_RESTARTS.
# `python -m torch.distributed.run` is torchrun, run by the `python` first on PATH (your venv).
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
# c10d rendezvous: the same command on every node; MESHPLAN_RDZV_HOST is the address of any ONE node
# (it need not end up holding rank 0). No --node-rank/--master-addr/--master-port: c10d ignores them.
if [ -z "${MESHPLAN_RDZV_HOST:-}" ]; then
  echo "meshplan: set MESHPLAN_RDZV_HOST to the address of one of the 2 nodes (the same value on every node)" >&2
  exit 2
fi
case "$MESHPLAN_RDZV_HOST" in
  127.*|localhost|::1)
    echo "meshplan: MESHPLAN_RDZV_HOST=$MESHPLAN_RDZV_HOST is a loopback address; the other nodes cannot reach it" >&2
    exit 2
    ;;
esac
# One id per job, shared by all nodes; set MESHPLAN_RDZV_ID to rerun while an old rendezvous lingers.
rdzv_id=llama3-8b-16gpu
rdzv_id="${MESHPLAN_RDZV_ID:-$rdzv_id}"
# Restarts of the whole worker group after a failure; the training core resumes from its last checkpoint.
max_restarts="${MESHPLAN_MAX_RESTARTS:-0}"

exec python -m torch.distributed.run \
  --nnodes 2 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MESHPLAN_RDZV_HOST:${MESHPLAN_RDZV_PORT:-29500}" \
  --rdzv-id "$rdzv_id" \
  --max-restarts "$max_restarts" \
  -m launcher.core.train --plan "$plan"
