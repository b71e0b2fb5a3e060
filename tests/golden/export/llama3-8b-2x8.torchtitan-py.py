# torchtitan 0.3.0 config function exported by meshplan from plan llama3-8b-16gpu.
# plan: llama3-8b-16gpu
# model: llama3-8b (8.03 B params, 32 layers) from llama3-8b
# cluster: 2 node(s) x 8 h100-sxm = 16 GPUs
# parallel: dp_replicate 1 x dp_shard 16 x cp 1 x tp 1 x pp 1; AC selective, compile on, float8 none
# training: seq_len 8192, global batch 32 sequences (262,144 tokens), micro-batch 1, 1000 steps
# estimate: peak 61.2 GiB/GPU of 72.0 usable, 7,421 tokens/s/GPU, MFU 41.2%
# plan file: /shared/plans/llama3-8b-2x8.yaml
#
# Launch on every node, with this file's folder on PYTHONPATH (keep only this module there) and the file named
# e.g. meshplan_job.py: torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29500
# --rdzv-id JOB -m torchtitan.train --module meshplan_job --config meshplan_config (--module: this file's name
# without .py).
# meshplan_config() starts from torchtitan's own config function and sets every plan value; --section.option
# flags after it still override single values.

"""meshplan plan as a torchtitan 0.3.0 config function (meshplan_config)."""

import dataclasses

from torchtitan.components.optimizer import default_adamw
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.trainer import Trainer

TORCHTITAN_RELEASE = '0.3.0'


def meshplan_config() -> Trainer.Config:
    """The plan's complete torchtitan 0.3.0 Trainer.Config: llama3_8b() with every plan value set."""
    config = llama3_8b()
    model_spec = model_registry('8B', converters=None)
    return dataclasses.replace(
        config,
        model_spec=model_spec,
        training=dataclasses.replace(
            config.training,
            local_batch_size=1,
            global_batch_size=32,
            seq_len=8192,
            max_norm=1.0,
            steps=1000,
        ),
        parallelism=dataclasses.replace(
            config.parallelism,
            data_parallel_replicate_degree=1,
            data_parallel_shard_degree=16,
            tensor_parallel_degree=1,
            pipeline_parallel_degree=1,
            context_parallel_degree=1,
            pipeline_parallel_schedule='1F1B',
        ),
        optimizer=dataclasses.replace(
            config.optimizer,
            param_groups=default_adamw(
                lr=0.0003,
                betas=(0.9, 0.95),
                eps=1e-08,
                weight_decay=0.1,
            ).param_groups,
        ),
        lr_scheduler=dataclasses.replace(
            config.lr_scheduler,
            total_steps=None,
            decay_ratio=None,
            warmup_steps=100,
            decay_type='cosine',
            min_lr_factor=0.1,
        ),
        checkpoint=dataclasses.replace(
            config.checkpoint,
            enable=True,
            folder='checkpoint',
            interval=500,
        ),
        activation_checkpoint=SelectiveAC.Config(),
        compile=dataclasses.replace(
            config.compile,
            enable=True,
            enable_async_tensor_parallel=False,
            components=['model', 'loss'],
        ),
        debug=dataclasses.replace(
            config.debug,
            seed=0,
        ),
    )
