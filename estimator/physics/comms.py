"""Communication time (seconds): the bandwidth a rank group gets, ring collectives, and each parallelism's
traffic — TP (+SP) all-gathers and reduce-scatters, CP's ring attention, FSDP's all-gather and reduce-scatter,
and the DP-replicate (HSDP) all-reduce. Bandwidths and latencies come from the hardware profile
(`intra_node_gbs`, `inter_node_gbps`, their efficiencies and latencies); overlaps from the stack profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.config import Float8
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.compute import FULL_AC_PASSES, by_recipe, hbm_bytes_per_s
from meshplan.estimator.physics.finetune import Weights
from meshplan.estimator.physics.layout import (
    Layout,
    as_float,
    reduces_every_microbatch,
    resharded,
    sequence_shards,
)
from meshplan.estimator.physics.links import inter_node_bytes_per_s, intra_node_bytes_per_s
from meshplan.estimator.physics.shapes import RankParams
from meshplan.estimator.physics.state import BF16, GRAD_BYTES, PARAM_BYTES, state_scale
from meshplan.estimator.stack import StackProfile


def ring_s(nbytes, ranks, bytes_per_s, latency_s):
    """Ring all-gather / reduce-scatter of `nbytes` (the full, unsharded size) over `ranks` ranks, seconds."""
    n = as_float(ranks)
    return xp.where(n > 1, nbytes * (n - 1) / n / bytes_per_s + (n - 1) * latency_s, 0.0)


def group_bytes_per_s(hw: HardwareProfile, ranks_per_node, spans_nodes, nodes=2.0):
    """Per-rank ring bandwidth (B/s): NVLink inside a node; across nodes each rank drives its own NIC, so
    `ranks_per_node` parallel rings share the node's NICs and NVLink caps the total. Achieved network bandwidth
    falls as a collective spans more nodes (the profile's `inter_node_scaling` per doubling beyond two). On a
    switchless node the group's `ranks_per_node` GPUs ring over their pair links (`links.intra_node_bytes_per_s`)."""
    scale = 1.0 / (1.0 + hw.inter_node_scaling * np.log2(xp.maximum(as_float(nodes), 2.0) / 2.0))
    intra = intra_node_bytes_per_s(hw, ranks_per_node)
    inter = xp.minimum(intra, inter_node_bytes_per_s(hw) * scale * as_float(ranks_per_node))
    return xp.where(spans_nodes, inter, intra)


@dataclass(frozen=True)
class TPTimes:
    """TP + sequence parallel per microbatch (s)."""

    total_s: np.ndarray  # every TP collective
    overlap: np.ndarray  # share hidden behind compute (async TP micro-pipelining or the stack's plain overlap)
    copy_s: np.ndarray | float = 0.0  # the collectives' layout copies on the compute stream (never hidden)

    @property
    def exposed_s(self) -> np.ndarray:
        return self.total_s * (1 - self.overlap) + self.copy_s


def tp_times(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, lay: Layout, layers) -> TPTimes:
    """Per block: 2 all-gathers + 2 reduce-scatters of tokens x hidden forward, the same backward, and the
    all-gathers again when the forward is recomputed (full AC) or the inputs re-gathered (op-SAC). Tensorwise
    Float8 all-gathers the activations in fp8 (1 byte). Eager DTensor copies each collective's tensor once more on
    the compute stream (`copy_s`, HBM-bound). TP stays inside a node in the plans meshplan ranks; a
    configuration whose TP group spans nodes (Megatron-LM and nanotron run them) rings over the nodes' NICs."""
    h, t, gpn = float(model.hidden), lay.tp, hw.scale_up_gpus(lay.gpus_per_node)
    spans = t > gpn  # a flat ring: every step waits for the slowest (inter-node) link
    bw = group_bytes_per_s(hw, xp.minimum(t, gpn), spans, xp.ceil(t / gpn))
    lat = xp.where(spans, hw.inter_node_latency_us, hw.intra_node_latency_us) * 1e-6
    ag_bytes = lay.tokens_mb * h * xp.where(lay.fp8 & (lay.float8 == int(Float8.TENSORWISE)), 1.0, BF16)
    rs_bytes = lay.tokens_mb * h * BF16
    n_ag = 4 + xp.where(lay.full_ac, 2, xp.where(lay.selective_ac, 2, 0))
    n_rs = 4 + xp.where(lay.full_ac, 2, 0)
    total = layers * (n_ag * ring_s(ag_bytes, t, bw, lat) + n_rs * ring_s(rs_bytes, t, bw, lat))
    # DTensor's sequence-parallel collectives run along the sequence dimension (Shard(1) of [batch, seq, hidden])
    # while NCCL works along dim 0: funcol's reduce_scatter_tensor first copies its whole input into rank-major
    # order (chunk + cat), and all_gather_tensor copies its output back (chunk + cat) unless one sequence a
    # microbatch lets it take a view: a full-size copy on the compute stream each. Counted in eager mode only: the
    # compiled TP runs of runs.csv show none (r0010 beside its async-TP twin r0011 would be 9 points slower with
    # them); what inductor makes of the chunk + cat was not traced. Async TP's fused matmul-collectives write in place
    # (without sequence parallelism each block all-reduces a replicated activation: the same bytes, no layout copy)
    eager_sp = (t > 1) & ~lay.async_tp & ~lay.compiled & (sequence_shards(stack, model, lay) > 1)
    # (bytes a bf16 element copied: sp_copy_bytes_per_element; an fp8 all-gather's output copies half as many)
    copied = xp.where(eager_sp, n_rs * rs_bytes + xp.where(lay.micro_batch > 1, n_ag * ag_bytes, 0.0), 0.0) / BF16
    copy = layers * copied * stack.sp_copy_bytes_per_element / hbm_bytes_per_s(hw)
    gathered = stack.tp_gathered_qk_bytes_per_element
    if gathered is not None and model.qk_norm:
        total_qk, copy_qk = _gathered_qk_heads_s(model, hw, stack, lay, layers, bw, lat, gathered)
        total, copy = total + total_qk, copy + copy_qk
    return TPTimes(total_s=total, overlap=xp.where(lay.async_tp, stack.async_tp_overlap, stack.tp_overlap),
                   copy_s=copy)


def _gathered_qk_heads_s(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, lay: Layout, layers, bw, lat,
                         bytes_per_element: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(collective seconds, compute-stream seconds) per microbatch of a TP plan that gathers the query and key heads
    after QK-norm. torchtitan's Qwen3 plan from f9e8897a6 (2025-08-18, #1429) to 8c1d1c5fc (2025-10-14, #1870,
    "Remove unnecessary all-gather qwen3") wrapped q_norm and k_norm in NoParallel(use_local_output=False): their
    head-sharded output (Shard(2)) is redistributed to Replicate, an all-gather of q and k each block; RoPE and
    repeat_kv then run on every head on every TP rank, and SDPA takes its heads back as a local slice, whose
    backward all-gathers dq and dk. So one all-gather forward, one backward, one more when the forward is
    recomputed (full or op-level AC, as the other TP all-gathers); each also copied on the compute stream in eager
    mode (funcol gathers along dim 0 and cats along the head dim). The RoPE / repeat_kv bytes are counted from the
    plan's model code (traced with a dispatch-mode byte counter: 24 forward and 31 backward per element, eager);
    compiled, they shrink like the other elementwise work (compile_elementwise_factor)."""
    t = lay.tp
    elements = lay.tokens_mb * float(model.q_dim + model.kv_dim)
    n_fwd = 1 + xp.where(lay.full_ac | lay.selective_ac, 1, 0)
    comm = layers * (n_fwd + 1) * ring_s(elements * BF16, t, bw, lat)
    fwd, bwd = bytes_per_element
    extra = 1 - 1 / as_float(t)  # the sharded plan would move 1/tp of it
    elem_factor = xp.where(lay.compiled, stack.compile_elementwise_factor, 1.0)
    rope = layers * elements * extra * (n_fwd * fwd + bwd) * elem_factor
    copied = xp.where((t > 1) & ~lay.compiled, (n_fwd + 1) * elements * stack.sp_copy_bytes_per_element, 0.0)
    return comm, (rope + layers * copied) / hbm_bytes_per_s(hw)


def cp_exposed_s(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, lay: Layout, layers,
                 attention_s) -> np.ndarray:
    """CP ring attention per microbatch: K and V blocks pass around the ring (cp - 1 times forward, twice that
    backward), overlapped with the attention of the previous block."""
    kv_attn = float(model.q_dim if stack.repeat_kv else model.kv_dim)
    kv_bytes = 2 * lay.tokens_mb * kv_attn / lay.tp * 2.0
    gpn, t, cp = hw.scale_up_gpus(lay.gpus_per_node), lay.tp, lay.cp
    spans = cp * t > gpn
    bw = group_bytes_per_s(hw, xp.minimum(as_float(cp), xp.maximum(1.0, gpn / t)), spans)
    lat = xp.where(spans, hw.inter_node_latency_us, hw.intra_node_latency_us) * 1e-6
    comm = layers * 3 * (cp - 1) * (kv_bytes / bw + lat) * xp.where(lay.full_ac, FULL_AC_PASSES, 1.0)
    return xp.maximum(0.0, comm - stack.cp_overlap * layers * attention_s)


@dataclass(frozen=True)
class FSDPTimes:
    """FSDP all-gather and reduce-scatter over the dp_shard x cp group (s)."""

    per_microbatch_s: np.ndarray  # collectives each microbatch issues (hidden behind compute up to fsdp_overlap)
    step_edges_s: np.ndarray  # the first all-gather and last reduce-scatter, which cannot hide
    step_once_s: np.ndarray  # with PP: the stage gathered and reduced once per step (exposed as counted here)
    reduce_once_s: np.ndarray  # without PP or a per-microbatch sync: the step's one reduce-scatter, issued by the
    # last microbatch's backward; its exposure is the step's (step.py: it shares that microbatch's overlap)
    copy_out_s: np.ndarray  # per microbatch: the all-gathers' copy-out on the compute stream (not hidden)
    copy_out_once_s: np.ndarray  # with PP: the stage's one copy-out per step


def _fsdp_group(hw: HardwareProfile, n, ranks_node, nodes):
    """(per-rank ring bandwidth, latency per collective) of an FSDP group of `n` ranks, `ranks_node` per node."""
    lat_intra, lat_inter = hw.intra_node_latency_us * 1e-6, hw.inter_node_latency_us * 1e-6
    bw = group_bytes_per_s(hw, ranks_node, nodes > 1, nodes)
    # latency per collective: one hop per node crossed plus the hops inside a node
    hop = xp.where(n > 1, (nodes - 1) * lat_inter + (ranks_node - 1) * lat_intra, 0.0)
    return bw, hop


def fsdp_times(hw: HardwareProfile, stack: StackProfile, lay: Layout, rp: RankParams, w: Weights) -> FSDPTimes:
    """All-gather (bf16, or fp8 with Float8 all-gather) and reduce-scatter (the stack's reduce dtype) of the rank's
    parameters, one collective per block and the two root units, ring over nodes then inside them. A MoE model's
    routed experts gather and reduce over their own group (dp_shard x cp x tp / ep ranks, strided by ep in
    torchtitan's sparse mesh), one collective per MoE block. Under LoRA the blocks gather their frozen weights
    (QLoRA: NF4) and adapters, and only the adapters' gradients are reduce-scattered."""
    n, t, gpn = lay.fsdp_ranks, lay.tp, hw.scale_up_gpus(lay.gpus_per_node)
    ranks_node = xp.maximum(1.0, xp.minimum(n, gpn / t))
    nodes = xp.ceil(n / ranks_node)
    bw, hop = _fsdp_group(hw, n, ranks_node, nodes)
    ne, ep = lay.expert_fsdp_ranks, lay.ep
    ranks_node_e = xp.where(ep > 1, xp.maximum(1.0, xp.minimum(ne, gpn / ep)), ranks_node)
    nodes_e = xp.ceil(ne / ranks_node_e)
    bw_e, hop_e = _fsdp_group(hw, ne, ranks_node_e, nodes_e)
    fp8_ag = by_recipe(lay, stack, "fp8_all_gather", False)
    dense = rp.most - rp.routed
    ag_bytes = dense * xp.where(fp8_ag, 1.0, BF16)
    rs_bytes = dense * stack.reduce_bytes
    if xp.any_(lay.lora):
        lora_ag = BF16 * (rp.most - rp.blocks) + w.block_gather_bytes_per_param * rp.blocks + BF16 * w.adapters
        ag_bytes = xp.where(lay.lora, lora_ag, ag_bytes)
        rs_bytes = xp.where(lay.lora, w.adapters * stack.reduce_bytes, rs_bytes)
    units = rp.layers + 2
    ag = ring_s(ag_bytes, n, bw, 0) + units * hop
    rs = ring_s(rs_bytes, n, bw, 0) + units * hop
    if xp.any_(rp.routed):  # the routed experts stay bf16 (Float8 converts nn.Linear layers only)
        ag = ag + ring_s(rp.routed * BF16, ne, bw_e, 0) + rp.moe_layers * hop_e
        rs = rs + ring_s(rp.routed * stack.reduce_bytes, ne, bw_e, 0) + rp.moe_layers * hop_e
    single = lay.single_stage
    reshard = resharded(stack, lay)
    per_mb_sync = reduces_every_microbatch(stack, lay)
    # per microbatch: AG forward (+ AG backward when resharded; with PP only when resharded) + RS (every microbatch
    # or only the last)
    gathers_mb = single | reshard
    per_mb = xp.where(gathers_mb, ag * xp.where(reshard, 2.0, 1.0), 0.0) + xp.where(per_mb_sync, rs, 0.0)
    hidden = 1 - stack.fsdp_overlap
    # the step's one gradient reduce-scatter: without PP the last microbatch's backward issues each block's as it
    # finishes, hidden like that microbatch's gathers (reduce_once_s, step.py); with PP torch.distributed.pipelining
    # runs FSDP's post-backward for every block of the stage only after the stage's last backward (stage.py
    # perform_reduce_grad; in 2.5 backward_maybe_with_nosync's last_backward), and waits for it: nothing is left to
    # hide it behind
    once = xp.logical_not(per_mb_sync)
    # FSDP2 splits each all-gather's output into the unsharded parameters on the compute stream (copy-out: read and
    # write, the stack's bytes per parameter), before the block can run; on a mesh of one shard its own path casts
    # and copies every parameter and gradient instead (one_rank_copy_bytes)
    hbm = hbm_bytes_per_s(hw)
    copy = xp.where(lay.fsdp, stack.fsdp_copy_bytes_per_param * dense / hbm, 0.0)
    unshard_b, reduce_b = one_rank_copy_bytes(stack, lay)
    one = lay.fsdp_one_rank
    copy = xp.where(one, unshard_b * rp.most / hbm, copy)
    reduce_copy = xp.where(one, reduce_b * w.trainable(lay, rp.most) / hbm, 0.0)
    return FSDPTimes(
        copy_out_s=xp.where(gathers_mb, copy * xp.where(reshard, 2.0, 1.0), 0.0)
        + xp.where(per_mb_sync, reduce_copy, 0.0),
        copy_out_once_s=xp.where(gathers_mb, 0.0, copy) + xp.where(per_mb_sync, 0.0, reduce_copy),
        per_microbatch_s=per_mb,
        # once per microbatch when gradients are reduced every microbatch, else once per step
        # (with PP the last block's reduce-scatter is part of the stage's exposed one below)
        step_edges_s=(ag + xp.where(single, rs, 0.0)) / units * xp.where(per_mb_sync, lay.microbatches, 1.0),
        step_once_s=xp.where(gathers_mb, 0.0, ag * hidden) + xp.where(once & ~single, rs, 0.0),
        reduce_once_s=xp.where(once & single, rs, 0.0),
    )


def one_rank_copy_bytes(stack: StackProfile, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes per parameter that FSDP2 moves on a mesh of one shard (torch's world_size == 1 paths, counted from
    torch/distributed/fsdp/_fully_shard, 2.9-2.13), per unshard and per gradient reduction. An unshard casts the
    sharded parameter to the bf16 param dtype (FSDPParam.all_gather_inputs: read 4, write 2; none where the
    parameters are bf16 already, training dtype bfloat16) and copies it into the unsharded parameter
    (FSDPParamGroup.wait_for_unshard: read 2, write 2). A reduction copies the bf16 gradient into a reduce-dtype
    buffer (foreach_reduce_scatter_copy_in: 2 + R), that into the output (reduce_output.copy_: 2R) and casts it back
    where the parameters are not in the reduce dtype (R + P). Checked on one H100 (data/measurements/
    h100-sxm-fsdp-probes-2026-11-27.csv): the compiled 1B probe's 15.7 ms of copies predicted a step where its
    forward + backward took 8.8 ms longer wrapped, the 8B bf16 one's 84 ms where it took 72.7 ms longer."""
    p = PARAM_BYTES * state_scale(lay)
    r = float(stack.reduce_bytes)
    unshard = xp.where(p > BF16, p + BF16, 0.0) + 2 * BF16
    reduce = BF16 + r + 2 * r + xp.where(p != r, r + p, 0.0)
    return unshard, reduce


def dp_replicate_s(hw: HardwareProfile, stack: StackProfile, lay: Layout, trainable_sharded: np.ndarray) -> np.ndarray:
    """DP replicate (HSDP / DDP): the gradient all-reduce of the rank's `trainable_sharded` parameters across
    replicas, partly hidden (the stack's `dp_replicate_overlap_share` of FSDP's overlap), per step; after every
    microbatch's backward when the stack syncs gradients every microbatch (torchtitan: FSDP2 and DDP reduce on each
    backward; Megatron-LM's and nanotron's DDP only on the last: `replicate_sync_every_microbatch`) and there is no
    pipeline. HSDP all-reduces in the reduce dtype, DDP the gradients as they are (fp32,
    bf16 under training.dtype bfloat16)."""
    dr, world, gpn = lay.dp_replicate, lay.world, hw.scale_up_gpus(lay.gpus_per_node)
    in_node = xp.minimum(dr, gpn)  # replicas inside one node (all of them on one node)
    bw = xp.where(world > gpn, inter_node_bytes_per_s(hw) * xp.minimum(gpn, world / dr),
                  intra_node_bytes_per_s(hw, in_node))
    bw = xp.minimum(bw, intra_node_bytes_per_s(hw))
    grad = xp.where(lay.fsdp, stack.reduce_bytes, GRAD_BYTES * state_scale(lay))
    allreduce = xp.where(dr > 1, 2 * grad * trainable_sharded * (dr - 1) / dr / bw, 0.0)
    every = xp.where(lay.fsdp, bool(stack.grad_sync_every_microbatch), stack.ddp_sync_every_microbatch)
    times = xp.where(lay.single_stage & every, lay.microbatches, 1.0)
    return times * allreduce * (1 - stack.fsdp_overlap * stack.dp_replicate_overlap_share)
