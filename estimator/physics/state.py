"""Model state in bytes: fp32 parameters, fp32 gradients and AdamW's two moments, sharded by FSDP; and in which
precision a configuration trains (torchtitan's rules: FSDP's mixed precision, autocast without it, or fp32)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.physics.layout import Layout

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


def state_scale(lay: Layout) -> np.ndarray:
    """Bytes of parameters, gradients and AdamW state relative to fp32: 0.5 under training.dtype bfloat16 (all three
    in bf16, no fp32 master copy), else 1."""
    return xp.where(lay.bf16_state, 0.5, 1.0)


def fp32_compute(stack, lay: Layout) -> np.ndarray:
    """Configurations that compute in fp32: a stack whose mixed precision needs FSDP (torchtitan's maybe_enable_amp:
    FSDP/HSDP/CP cast to bf16, DDP and one device use autocast, and TP or PP without FSDP runs without mixed
    precision), with TP or PP but no FSDP, in fp32 training dtype."""
    return (np.bool_(stack.mixed_precision_needs_fsdp) & xp.logical_not(lay.fsdp)
            & (lay.has_tp | xp.logical_not(lay.single_stage)) & xp.logical_not(lay.bf16_state))


def autocast(stack, lay: Layout) -> np.ndarray:
    """Configurations without FSDP that train fp32 weights under torch.autocast (DDP, one device): every matmul
    casts its weight to bf16, and the cast copies live from the forward to their backward."""
    return xp.logical_not(lay.fsdp) & xp.logical_not(fp32_compute(stack, lay)) & xp.logical_not(lay.bf16_state)


def replicated_grad_copies(stack, lay: Layout) -> np.ndarray:
    """Extra gradient copies per trainable parameter: DDP without FSDP keeps its flat all-reduce buckets beside
    param.grad (torchtitan's replicate(): gradient_as_bucket_view False) when the stack says so; else 0."""
    return xp.where(xp.logical_not(lay.fsdp) & (lay.dp_replicate > 1) & np.bool_(stack.replicate_grad_buckets),
                    1.0, 0.0)
