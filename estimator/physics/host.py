"""Host RAM per node (bytes): each process's own footprint plus the model state it keeps, loads or saves there."""

from __future__ import annotations

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.hardware import GIB
from meshplan.estimator.physics.finetune import StageState
from meshplan.estimator.physics.layout import Layout
from meshplan.estimator.physics.state import BF16, PARAM_BYTES, STATE_BYTES
from meshplan.estimator.stack import StackProfile


def ranks_per_node(lay: Layout) -> np.ndarray:
    return xp.minimum(lay.gpus_per_node, lay.world)


def host_bytes_per_node(stack: StackProfile, lay: Layout, st: StageState) -> np.ndarray:
    """Every process's runtime footprint (the stack's `process_host_gib`) plus, per rank: under CPU offload its
    pinned shard of the weights, gradients and AdamW state (StageState.host_bytes: FSDP2 keeps them there, and DCP
    saves from them); otherwise the shard DCP loads and saves through host memory (16 bytes a trainable parameter
    over FSDP, and the frozen weights as stored)."""
    staged = STATE_BYTES * st.trainable_sharded + (st.stored_sharded_bytes - PARAM_BYTES * st.trainable_sharded)
    per_rank = xp.where(lay.offload, st.host_bytes, staged)
    return ranks_per_node(lay) * (stack.process_host_gib * GIB + per_rank)


def offloaded_bytes_per_node(lay: Layout, st: StageState) -> np.ndarray:
    """The node's share of host RAM that CPU offload pins (0 without offload)."""
    return ranks_per_node(lay) * st.host_bytes


def full_load_bytes_per_node(stack: StackProfile, lay: Layout, params: float) -> np.ndarray:
    """Host RAM if every rank loaded the whole model (`params` parameters) itself: the fp32 model of a pre-training
    checkpoint, the bf16 weights of a pretrained (Hugging Face) checkpoint for fine-tuning."""
    per_param = xp.where(lay.finetune, BF16, PARAM_BYTES)
    return ranks_per_node(lay) * (stack.process_host_gib * GIB + per_param * params)
