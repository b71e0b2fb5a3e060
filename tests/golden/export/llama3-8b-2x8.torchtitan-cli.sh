#!/usr/bin/env bash
# meshplan launch script: torchtitan 0.3.0 (2 x 8 GPUs)
# plan: llama3-8b-16gpu
# model: llama3-8b (8.03 B params, 32 layers) from llama3-8b
# cluster: 2 node(s) x 8 h100-sxm = 16 GPUs
# parallel: dp_replicate 1 x dp_shard 16 x cp 1 x tp 1 x pp 1; AC selective, compile on, float8 none
# training: seq_len 8192, global batch 32 sequences (262,144 tokens), micro-batch 1, 1000 steps
# estimate: peak 61.2 GiB/GPU of 72.0 usable, 7,421 tokens/s/GPU, MFU 41.2%
# plan file: /shared/plans/llama3-8b-2x8.yaml
#
# torchtitan 0.3.0 command line: config function llama3_8b (module llama3) with
# the plan's values as --section.option flags (frozen in 0.3.0; the AC choice is a subcommand, last).
# The model and its Float8 come from the config function: to set them from the plan use the Python
# export (-f torchtitan-py). torchtitan <= 0.2.2: -f torchtitan-toml.
# Run this same script on every node: MESHPLAN_RDZV_HOST=<address of one node> ./THIS_SCRIPT
# TT_MODULE / TT_CONFIG override the config function the flags below are applied to.
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

tt_module="${TT_MODULE:-llama3}"
tt_config="${TT_CONFIG:-llama3_8b}"
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

exec torchrun \
  --nnodes 2 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MESHPLAN_RDZV_HOST:${MESHPLAN_RDZV_PORT:-29500}" \
  --rdzv-id "$rdzv_id" \
  --max-restarts "$max_restarts" \
  -m torchtitan.train --module "$tt_module" --config "$tt_config" \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 16 \
  --parallelism.tensor_parallel_degree 1 \
  --parallelism.pipeline_parallel_degree 1 \
  --parallelism.context_parallel_degree 1 \
  --parallelism.pipeline_parallel_schedule 1F1B \
  --training.local_batch_size 1 \
  --training.global_batch_size 32 \
  --training.seq_len 8192 \
  --training.max_norm 1.0 \
  --training.steps 1000 \
  --optimizer.param_groups.0.optimizer_kwargs.lr 0.0003 \
  --optimizer.param_groups.0.optimizer_kwargs.betas 0.9 0.95 \
  --optimizer.param_groups.0.optimizer_kwargs.eps 1e-08 \
  --optimizer.param_groups.0.optimizer_kwargs.weight_decay 0.1 \
  --lr_scheduler.total_steps None \
  --lr_scheduler.decay_ratio None \
  --lr_scheduler.warmup_steps 100 \
  --lr_scheduler.decay_type cosine \
  --lr_scheduler.min_lr_factor 0.1 \
  --compile.enable \
  --compile.no_enable_async_tensor_parallel \
  --compile.components model,loss \
  --checkpoint.enable \
  --checkpoint.folder checkpoint \
  --checkpoint.interval 500 \
  --debug.seed 0 \
  activation-checkpoint:selective
