#!/usr/bin/env bash
# meshplan launch script: torchtitan 0.3.0 (64 x 8 GPUs)
# plan: llama3-405b-512gpu
# model: llama3-405b (405.85 B params, 126 layers) from llama3-405b
# cluster: 64 node(s) x 8 h100-sxm = 512 GPUs
# parallel: dp_replicate 1 x dp_shard 8 x cp 1 x tp 8 x pp 8 (Interleaved1F1B, 2 stages per rank); AC full,
# compile on, float8 tensorwise, async TP
# training: seq_len 8192, global batch 512 sequences (4,194,304 tokens), micro-batch 1, 1000 steps
# estimate: none stored in the plan (run `meshplan estimate --plan PLAN`)
# plan file: /shared/plans/llama3-405b-64x8.yaml
#
# torchtitan 0.3.0 command line: config function llama3_405b (module llama3) with
# the plan's values as --section.option flags (frozen in 0.3.0; the AC choice is a subcommand, last).
# The model and its Float8 come from the config function: to set them from the plan use the Python
# export (-f torchtitan-py). torchtitan <= 0.2.2: -f torchtitan-toml.
# Run this same script on every node: MESHPLAN_RDZV_HOST=<address of one node> ./THIS_SCRIPT
# TT_MODULE / TT_CONFIG override the config function the flags below are applied to.
#
# STOPS unless TT_CONFIG is set: torchtitan 0.3.0 has no tensorwise Float8 recipe (Float8LinearConverter takes
# rowwise or rowwise_with_gw_hp); plan with --float8 rowwise, or export --format torchtitan-toml for
# torchtitan 0.2.2.
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
tt_config="${TT_CONFIG:-}"
if [ -z "$tt_config" ]; then
  echo 'meshplan: torchtitan 0.3.0 has no tensorwise Float8 recipe (Float8LinearConverter takes rowwise or rowwise_with_gw_hp); plan with --float8 rowwise, or export --format torchtitan-toml for torchtitan 0.2.2; or set TT_CONFIG to a config function whose model has it' >&2
  exit 2
fi
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
# Restarts of the whole worker group after a failure; the training core resumes from its last checkpoint.
max_restarts="${MESHPLAN_MAX_RESTARTS:-0}"

exec torchrun \
  --nnodes 64 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MESHPLAN_RDZV_HOST:${MESHPLAN_RDZV_PORT:-29500}" \
  --rdzv-id "$rdzv_id" \
  --max-restarts "$max_restarts" \
  -m torchtitan.train --module "$tt_module" --config "$tt_config" \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 8 \
  --parallelism.tensor_parallel_degree 8 \
  --parallelism.pipeline_parallel_degree 8 \
  --parallelism.context_parallel_degree 1 \
  --parallelism.pipeline_parallel_schedule Interleaved1F1B \
  --parallelism.pipeline_parallel_microbatch_size 1 \
  --training.local_batch_size 64 \
  --training.global_batch_size 512 \
  --training.seq_len 8192 \
  --training.max_norm 1.0 \
  --training.steps 1000 \
  --training.disable_cuda_graphs \
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
  --compile.enable_async_tensor_parallel \
  --compile.components model,loss \
  --checkpoint.enable \
  --checkpoint.folder checkpoint \
  --checkpoint.interval 500 \
  --debug.seed 0 \
  activation-checkpoint:full
