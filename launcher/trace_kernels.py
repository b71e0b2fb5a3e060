"""What the traced memory mode changes while it runs, so a CPU step keeps the tensors a GPU step keeps: CUDA's
fused RMSNorm (saved input + fp32 rstd), and DTensor's sharding propagation outside the trace's fake modes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class FusedRMSNorm(torch.autograd.Function):
    """What CUDA's fused RMSNorm kernel (`aten._fused_rms_norm`, which `F.rms_norm` uses on GPUs) keeps for
    backward: the input and the fp32 per-token rstd. On CPU `F.rms_norm` decomposes into pointwise ops that
    save two fp32 copies of the input instead, which the GPU run never allocates."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        out = (xf * rstd).to(x.dtype)
        if weight is not None:
            out = out * weight
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        g = grad.float()
        gw = None
        if weight is not None:
            gw = (g * normed).sum(dim=tuple(range(g.dim() - 1))).to(weight.dtype)
            g = g * weight.float()
        gx = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw, None


@contextmanager
def gpu_kernels() -> Iterator[None]:
    """During the trace, `F.rms_norm` (what `nn.RMSNorm` calls) runs `FusedRMSNorm`, the GPU run's saved
    tensors. A module attribute rather than a TorchFunctionMode: AC recomputation runs inside the autograd
    engine, where function modes are not active."""
    import torch.nn.functional as F

    orig = F.rms_norm

    def rms_norm(x: Any, shape: Any, weight: Any = None, eps: float | None = None) -> Any:
        if len(shape) != 1:
            return orig(x, shape, weight, eps)
        return FusedRMSNorm.apply(x, weight, torch.finfo(torch.float32).eps if eps is None else eps)

    F.rms_norm = rms_norm
    try:
        with _untracked_sharding_propagation():
            yield
    finally:
        F.rms_norm = orig


@contextmanager
def _untracked_sharding_propagation() -> Iterator[None]:
    """DTensor derives an op's output metadata by running it on fake tensors of the *global* shape
    (`ShardingPropagator._propagate_tensor_meta_non_cached`). Under the trace's FakeTensorMode it reuses
    that mode, so the memory tracker counted those global-shape tensors, which never exist on a GPU (e.g.
    two fp32 logits-sized buffers of the full vocabulary in the loss-parallel backward). Run the
    propagation with the trace's modes switched off, as it runs in a real step."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.utils._python_dispatch import _disable_current_modes

    orig = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self: Any, op_schema: Any) -> Any:
        with _disable_current_modes():
            return orig(self, op_schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = orig


