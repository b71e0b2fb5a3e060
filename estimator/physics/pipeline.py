"""Pipeline parallelism: microbatches in flight per stage, the bubble, and the stage-to-stage transfers."""

from __future__ import annotations

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.config import Schedule
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.physics.layout import Layout
from meshplan.estimator.physics.links import inter_node_bytes_per_s, intra_node_bytes_per_s
from meshplan.estimator.stack import StackProfile


def microbatches_in_flight(lay: Layout, stage: np.ndarray) -> np.ndarray:
    """Microbatches whose activations pipeline stage `stage` (0-based rank k) holds at its peak, in whole passes over
    its blocks (chunk-microbatches over vpp): 1F1B keeps min(m, pp - k), GPipe all m. The looped schedules as torch's
    own action order has them (torch.distributed.pipelining `_get_warmup_ops`: (vpp - 1) x the microbatches of a
    round, r = m // max(1, m // pp), plus (pp - 1 - k) forwards ahead, twice for interleaved 1F1B, once for the zero
    bubble's), at most vpp x m chunk-microbatches: interleaved 1F1B peaks at (vpp - 1) r + 2 (pp - 1 - k) + 1;
    InterleavedZeroBubble holds (vpp - 1) r + pp - k whole and, until their weight gradients run, the linears' inputs
    of (vpp - 1) r + pp on every rank, counted whole here (an upper bound: those inputs are part of a chunk's saved
    tensors). Both replayed from torch's order in tests/test_pipeline_fill.py. Without PP: the one microbatch."""
    p, v, m = lay.pp, lay.vpp, lay.microbatches
    ahead = xp.minimum(m, p - stage)
    per_round = xp.floor(m / xp.maximum(1.0, xp.floor(m / p)))
    warm = (v - 1) * per_round
    inter = xp.minimum(warm + 2 * (p - 1 - stage) + 1, v * m) / v
    zero_bubble = xp.minimum(warm + p, v * m) / v
    sched = lay.schedule
    by_schedule = xp.where(sched == int(Schedule.GPIPE), m,
                           xp.where(sched == int(Schedule.INTERLEAVED_1F1B), inter,
                                    xp.where(sched == int(Schedule.INTERLEAVED_ZERO_BUBBLE), zero_bubble, ahead)))
    return xp.where(lay.single_stage, 1.0, by_schedule)


def layers_in_flight(lay: Layout, layers_rank: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Microbatch-layers whose activations pipeline stage `stage` holds at the end of its forwards, on a rank of
    `layers_rank` blocks (its vpp chunks taken as equal: torchtitan's chunks differ by at most one block)."""
    return microbatches_in_flight(lay, stage) * layers_rank


def head_microbatches(lay: Layout) -> np.ndarray:
    """Microbatches whose head inputs the last stage holds at once: all of them under GPipe, else one."""
    return xp.where(xp.logical_not(lay.single_stage) & (lay.schedule == int(Schedule.GPIPE)), lay.microbatches, 1.0)


def receive_buffer_bytes(lay: Layout, hidden: float, first: np.ndarray, seq_shards) -> np.ndarray:
    """Bytes of one receive buffer (micro-batch, seq / tp, hidden; bf16; the whole sequence where TP runs without
    sequence parallelism: `seq_shards`, `layout.sequence_shards`) a non-first stage's PipelineStage keeps per
    microbatch of the step (and the gradient of each once its backward ran, until the step ends); a stack whose
    schedule allocates each receive as it posts it (`pp_receive_buffers: in_flight`) holds one per microbatch in
    flight instead (`memory.stage_memory`)."""
    return xp.where(xp.logical_not(lay.single_stage) & xp.logical_not(first),
                    lay.tokens_mb * 2 * hidden / seq_shards, 0.0)


def bubble_s(lay: Layout, microbatch_s: np.ndarray, weight_grad_s: np.ndarray | float = 0.0) -> np.ndarray:
    """Idle time per step (s) of a pipeline stage: (pp - 1) / vpp microbatch times (warm-up and drain).

    With fewer microbatches m than stages pp the pipeline cannot fill: GPipe and 1F1B still take pp + m - 1
    microbatch times (the formula above), and an interleaved rank also waits (pp - m) chunk times before each
    of its vpp - 1 later chunks, whose input is still travelling through the other ranks.

    InterleavedZeroBubble (ZB1P) fills the bubble with the deferred weight gradients (`weight_grad_s` of a
    microbatch's seconds on the rank): (pp - 1)(F + B - 2W) where 1F1B idles (pp - 1)(F + B) (DeepSeek-V3 technical
    report, arXiv 2412.19437, Table 2; the deepseek-ai/DualPipe README), F + B being a chunk's time. That is torch's
    ScheduleInterleavedZeroBubble's idle time exactly once m >= pp (tests/test_pipeline_fill.py replays its action
    order); an unfilled one (m < pp) waits (vpp - 1)(pp - m)(F + B - W) more here, an approximation: torch's order
    (its inserted bubbles) idled 17-32 % more or less in the cases replayed (the step within a third, tested)."""
    p, v = lay.pp, lay.vpp
    unfilled = (v - 1) * xp.maximum(0.0, p - lay.microbatches)
    zero_bubble = lay.schedule == int(Schedule.INTERLEAVED_ZERO_BUBBLE)
    w = xp.where(zero_bubble, weight_grad_s, 0.0)
    idle = xp.maximum(0.0, microbatch_s - 2.0 * w) * (p - 1) + (microbatch_s - w) * unfilled
    return xp.where(lay.single_stage, 0.0, idle / v)


def p2p_s(lay: Layout, hw: HardwareProfile, stack: StackProfile, hidden: float, seq_shards,
          microbatch_s: np.ndarray | float) -> np.ndarray:
    """Exposed stage-to-stage time per step (s): each microbatch chunk sends its activation forward and receives
    its gradient backward (bf16, tokens x hidden / tp: the whole sequence where TP runs without sequence
    parallelism, `seq_shards`), plus the schedule's per-microbatch overhead.

    Where the stack overlaps them (`pp_p2p_overlap`: Megatron-Core's overlap_p2p_comm under an interleaved
    schedule) a chunk's transfers and schedule step run while the chunk computes (`microbatch_s` / vpp: a
    microbatch's seconds on the rank), and only what outlasts that compute shows."""
    spans_nodes = lay.world > hw.scale_up_gpus(lay.gpus_per_node)
    p2p_bytes = lay.tokens_mb * hidden / seq_shards * 2.0 * 2  # activation forward + gradient backward per boundary
    bw = xp.where(spans_nodes, inter_node_bytes_per_s(hw), intra_node_bytes_per_s(hw, 2))  # one stage to the next
    transfer = p2p_bytes / bw
    per_mb = transfer * stack.pp_p2p_exposed + stack.pp_overhead_s_per_microbatch
    if stack.pp_p2p_overlap == "interleaved":
        chunk_s = microbatch_s / lay.vpp
        overlapped = xp.maximum(0.0, transfer + stack.pp_overhead_s_per_microbatch - chunk_s)
        per_mb = xp.where(lay.schedule == int(Schedule.INTERLEAVED_1F1B), overlapped, per_mb)
    return xp.where(lay.single_stage, 0.0, lay.microbatches * lay.vpp * per_mb)
