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
    return (bool(stack.mixed_precision_needs_fsdp) & xp.logical_not(lay.fsdp)
            & (lay.has_tp | xp.logical_not(lay.single_stage)) & xp.logical_not(lay.bf16_state))


def autocast(stack, lay: Layout) -> np.ndarray:
    """Configurations without FSDP that train under torch.autocast (DDP, one device; TP or PP too on a stack whose
    mixed precision does not need FSDP): the stack's bf16 copies of the matmul weights live from the forward to their
    backward."""
    return xp.logical_not(lay.fsdp) & xp.logical_not(fp32_compute(stack, lay)) & xp.logical_not(lay.bf16_state)


@dataclass(frozen=True)
class StateBytes:
    """Bytes per trainable parameter a rank keeps (after FSDP's or ZeRO-1's sharding is applied by the caller)."""

    params: np.ndarray  # weights (+ an fp32 master copy)
    grads: np.ndarray  # gradients (+ data parallel's buckets)
    optimizer: np.ndarray  # AdamW's moments
    buckets: np.ndarray | float = 0.0  # of `grads`, data parallel's buckets: allocated when DDP wraps the model and
    # kept through every phase of every step (the gradients themselves appear in the first backward)


def state_bytes(stack, lay: Layout) -> StateBytes:
    """FSDP: fp32 parameters, gradients and AdamW state (4 + 4 + 8 bytes), sharded by the caller. Without FSDP the
    stack's replicated state (torchtitan's DDP: fp32 weights, fp32 gradients and a second copy in DDP's buckets;
    nanotron: bf16 weights, an fp32 gradient accumulator and an fp32 master copy), the master weights and moments
    divided over the replicas under ZeRO-1. Training dtype bfloat16 keeps every one in bf16, with no master copy:
    FSDP's halved, and without FSDP bf16 weights, gradients (and DDP's buckets, where the stack has them) and
    moments, whatever the stack keeps in mixed precision (its weights may be bf16 already: nanotron, generic)."""
    scale = state_scale(lay)
    if stack is None:
        return StateBytes(PARAM_BYTES * scale, GRAD_BYTES * scale, ADAMW_BYTES * scale)
    rs = stack.replicated_state
    zero = 1.0 / lay.dp_replicate if rs.zero1 else 1.0
    replicas = xp.where(lay.dp_replicate > 1, rs.grad_buckets, 0.0)
    bf16 = lay.bf16_state
    fsdp = lay.fsdp
    buckets = xp.where(fsdp, 0.0, xp.where(bf16, xp.where(replicas > 0, BF16, 0.0), replicas))
    return StateBytes(
        params=xp.where(fsdp, PARAM_BYTES * scale, xp.where(bf16, BF16, rs.weights + rs.master * zero)),
        grads=xp.where(fsdp, GRAD_BYTES * scale,
                       xp.where(bf16, BF16 + xp.where(replicas > 0, BF16, 0.0), rs.grads + replicas)),
        optimizer=xp.where(fsdp, ADAMW_BYTES * scale, xp.where(bf16, ADAMW_BYTES / 2, rs.optimizer) * zero),
        buckets=buckets,
    )


def weight_copy_bytes(stack, lay: Layout) -> np.ndarray:
    """Bytes per matmul weight autocast keeps as a bf16 copy (0 where it does not apply)."""
    return xp.where(autocast(stack, lay), stack.replicated_state.weight_copies, 0.0)
