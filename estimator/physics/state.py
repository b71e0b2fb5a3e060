"""Model state in bytes: fp32 parameters, fp32 gradients and AdamW's two moments, sharded by FSDP."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PARAM_BYTES = 4.0  # fp32 master weights (torchtitan keeps fp32 parameters; MixedPrecisionPolicy casts to bf16)
GRAD_BYTES = 4.0  # fp32 sharded gradients
ADAMW_BYTES = 8.0  # AdamW exp_avg + exp_avg_sq, fp32
STATE_BYTES = PARAM_BYTES + GRAD_BYTES + ADAMW_BYTES  # 16 bytes per parameter in all
BF16 = 2.0  # bytes per bf16 element (all-gathered parameters, activations)


@dataclass(frozen=True)
class ModelState:
    """Bytes of model state one rank holds (float arrays)."""

    params_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray


def model_state(sharded_params: np.ndarray) -> ModelState:
    """State of a rank keeping `sharded_params` parameters after FSDP (:meth:`RankParams.sharded`)."""
    return ModelState(
        params_bytes=PARAM_BYTES * sharded_params,
        grads_bytes=GRAD_BYTES * sharded_params,
        optimizer_bytes=ADAMW_BYTES * sharded_params,
    )
