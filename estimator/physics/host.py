"""Host RAM per node (bytes): each process's own footprint plus the model state it loads or saves."""

from __future__ import annotations

import numpy as np

from meshplan.estimator.hardware import GIB
from meshplan.estimator.physics.layout import Layout
from meshplan.estimator.physics.shapes import RankParams
from meshplan.estimator.physics.state import PARAM_BYTES, STATE_BYTES
from meshplan.estimator.stack import StackProfile


def host_bytes_per_node(stack: StackProfile, lay: Layout, rp: RankParams) -> np.ndarray:
    """DCP loads and saves each rank's own shard (parameters, gradients' space, AdamW state: 16 bytes a
    parameter over FSDP), on top of every process's runtime footprint (the stack's `process_host_gib`)."""
    ranks = np.minimum(lay.gpus_per_node, lay.world)
    return ranks * (stack.process_host_gib * GIB + STATE_BYTES * rp.sharded(rp.most, lay))


def full_load_bytes_per_node(stack: StackProfile, lay: Layout, params: float) -> np.ndarray:
    """Host RAM if every rank loaded the whole fp32 checkpoint (`params` parameters) itself."""
    ranks = np.minimum(lay.gpus_per_node, lay.world)
    return ranks * (stack.process_host_gib * GIB + PARAM_BYTES * params)
