"""The optimizer step (seconds) from its parts, and what it yields: tokens/s per GPU and MFU.

A microbatch's time is the busy compute (slowed while communication kernels share the SMs) + launch overhead
+ the exposed TP, CP and FSDP time; a step is the microbatches, the pipeline's bubble and transfers, FSDP's
unhidden edges, the DP-replicate all-reduce, the optimizer and the stack's fixed per-step overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics import finetune, pipeline
from meshplan.estimator.physics.comms import cp_exposed_s, dp_replicate_s, fsdp_times, tp_times
from meshplan.estimator.physics.compute import compute_times, optimizer_step_s
from meshplan.estimator.physics.layout import Layout, resharded, sequence_shards
from meshplan.estimator.physics.shapes import RankParams
from meshplan.estimator.physics.state import state_scale
from meshplan.estimator.stack import StackProfile

TIME_CATEGORIES = (
    "compute",
    "recompute",
    "float8_casts",
    "elementwise",
    "overhead",
    "fsdp_exposed",
    "tp_exposed",
    "cp_exposed",
    "ep_all_to_all",
    "nf4_dequant",
    "offload_exposed",
    "pp_bubble",
    "pp_p2p",
    "dp_allreduce",
    "optimizer_step",
)


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step by TIME_CATEGORIES (they sum to `step_s`), and what the step yields."""

    parts: dict[str, np.ndarray]
    step_s: np.ndarray
    microbatch_s: np.ndarray
    tokens_per_sec_per_gpu: np.ndarray
    mfu: np.ndarray  # model FLOPs (torchtitan's convention) / bf16 peak of the profile
    fsdp_overhead_s: np.ndarray  # seconds per step of the stack's per-block FSDP cost (part of `overhead`)


def step_time(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, lay: Layout, rp: RankParams,
              vocab_rank: np.ndarray) -> StepTime:
    """Step time of every configuration, timed for the stage with the output layer."""
    m, layers = lay.microbatches, rp.layers
    comp = compute_times(model, hw, stack, lay, layers, vocab_rank, rp.moe_layers)
    tp = tp_times(model, hw, stack, lay, layers)
    cp = cp_exposed_s(model, hw, stack, lay, layers, comp.attention_s)
    w = finetune.weights(model, lay, rp)
    st = finetune.stage_state(w, lay, rp, rp.most, stack)
    fsdp = fsdp_times(hw, stack, lay, rp, w)
    busy = comp.busy_s
    hide = stack.fsdp_overlap * busy  # what FSDP's collectives can hide behind in a microbatch
    fsdp_exposed = xp.maximum(0.0, fsdp.per_microbatch_s - hide)
    # the step's one reduce-scatter (no per-microbatch sync, no PP) runs in the last microbatch's backward beside
    # that microbatch's gathers: it hides in what overlap they leave, at most as well as the per-microbatch ones
    reduce_once = xp.maximum(fsdp.reduce_once_s * (1 - stack.fsdp_overlap),
                             xp.maximum(0.0, fsdp.per_microbatch_s + fsdp.reduce_once_s - hide) - fsdp_exposed)
    # CPU offload: each all-gather's shard comes host-to-device first and each reduce-scatter's output goes back,
    # on the copy streams of FSDP's prefetch (hidden like its collectives); with gradient accumulation the later
    # microbatches' device-to-host copies block and add on the CPU
    gathers = xp.where(resharded(stack, lay), 2.0, 1.0)
    h2d = finetune.offload_transfer_s(hw, lay, st, gathers)
    offload_mb = xp.maximum(0.0, fsdp.per_microbatch_s + h2d - hide) - fsdp_exposed
    offload_acc = (m - 1) * finetune.offload_accumulate_s(hw, stack, lay, st)
    # slow-down of compute kernels sharing the GPU with communication kernels
    hidden_comm = fsdp.per_microbatch_s + tp.total_s * tp.overlap
    slow = stack.comm_compute_slowdown * xp.minimum(1.0, hidden_comm / xp.maximum(busy, 1e-12))
    busy_slow = busy * (1 + slow)
    # the CPU launches a microbatch's kernels ahead of the GPU: launches cost time only where they outlast the GPU's
    # work (measured on one H100: hidden at 8k tokens a microbatch, ~0.7 ms a block exposed at 2k, eager)
    launch = xp.maximum(0.0, comp.overhead_s - busy_slow)
    a2a = exposed_all_to_all_s(lay, comp.all_to_all_s, busy)
    t_mb = (busy_slow + launch + comp.fsdp_overhead_s + tp.exposed_s + cp + fsdp_exposed + fsdp.copy_out_s + offload_mb
            + a2a)
    parts = {
        "compute": m * comp.gemm_attention_s,
        "recompute": m * comp.recompute_s,
        "float8_casts": m * comp.float8_casts_s,
        "elementwise": m * comp.elementwise_s,
        "overhead": m * (launch + comp.fsdp_overhead_s + (busy_slow - busy_slow / (1 + slow))) + stack.step_overhead_s,
        "fsdp_exposed": m * (fsdp_exposed + fsdp.copy_out_s) + fsdp.step_edges_s + fsdp.step_once_s
        + fsdp.copy_out_once_s + reduce_once,
        "tp_exposed": m * tp.exposed_s,
        "cp_exposed": m * cp,
        "ep_all_to_all": m * a2a,
        "nf4_dequant": m * comp.dequant_s,
        "offload_exposed": m * offload_mb + offload_acc,
        "pp_bubble": pipeline.bubble_s(lay, t_mb, comp.weight_grad_s),
        "pp_p2p": pipeline.p2p_s(lay, hw, stack, float(model.hidden), sequence_shards(stack, model, lay), t_mb),
        "dp_allreduce": dp_replicate_s(hw, stack, lay, st.trainable_sharded),
        "optimizer_step": xp.where(lay.offload, finetune.cpu_optimizer_s(hw, stack, lay, st.trainable_sharded),
                                   optimizer_step_s(hw, stack, st.trainable_sharded) * state_scale(lay))
        + xp.where(lay.fsdp | lay.has_tp, layers * stack.dtensor_optimizer_s_per_layer, 0.0),
    }
    step = (m * t_mb + parts["pp_bubble"] + parts["pp_p2p"] + fsdp.step_edges_s + fsdp.step_once_s + fsdp.copy_out_once_s
            + reduce_once + parts["dp_allreduce"] + parts["optimizer_step"] + stack.step_overhead_s + offload_acc)
    tps = lay.global_batch * lay.seq_len / (lay.world * step)
    return StepTime(parts=parts, step_s=step, microbatch_s=t_mb, tokens_per_sec_per_gpu=tps,
                    mfu=finetune.flops_per_token(model, lay, model_flops_per_token(model, lay.seq_len)) * tps
                    / (hw.peak_tflops_bf16 * 1e12), fsdp_overhead_s=m * comp.fsdp_overhead_s)


def exposed_all_to_all_s(lay: Layout, all_to_all_s: np.ndarray, busy_s: np.ndarray) -> np.ndarray:
    """Seconds a microbatch waits on its expert-parallel dispatch and combine. Exposed whole (torchtitan: each
    all-to-all sits between the router and the experts of the same microbatch), or, with Megatron-Core's 1F1B
    all-to-all overlap (`moe_a2a_overlap`), hidden behind the compute of the microbatch paired with it (one's
    forward with another's backward) up to that compute's length; the microbatches without a partner (a rank's
    first and last: the pipeline's warm-up and cool-down, pp of m) expose theirs."""
    if not xp.any_(lay.a2a_overlap):
        return all_to_all_s
    m = lay.microbatches
    paired = xp.maximum(m - lay.pp, 0.0) / xp.maximum(m, 1.0)
    hidden = xp.minimum(all_to_all_s, busy_s) * paired
    return xp.where(lay.a2a_overlap, all_to_all_s - hidden, all_to_all_s)


def model_flops_per_token(model: ModelSpec, seq_len: np.ndarray) -> np.ndarray:
    """torchtitan's MFU numerator per token: 6 (N_active - N_embedding) + 6 L (q + v) s (full attention, no
    recompute): 12 L q s when the query and value widths are equal."""
    return model.flops_per_token(1) + 6.0 * float(model.layers) * float(model.q_dim + model.v_dim) * (seq_len - 1)
