"""Text shown on the page: model and hardware facts, the assumptions and conventions section (pure)."""

from __future__ import annotations

from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.compute import attention_kernel
from meshplan.estimator.report import FLOP_CONVENTION
from meshplan.estimator.stack import StackProfile
from meshplan.planner.labels import count_label
from meshplan.planner.search import RANK_BAND


def model_facts(m: ModelSpec) -> str:
    kind = "SwiGLU/RMSNorm" if m.mlp == "swiglu" else "GELU/LayerNorm"
    if m.mla is not None:
        attn = f"multi-head latent attention, {m.heads} heads (KV latent {m.mla.kv_lora_rank})"
    else:
        attn = f"GQA {m.heads}/{m.kv_heads} heads" if m.kv_heads < m.heads else f"MHA {m.heads} heads"
    tied = ", tied embeddings" if m.tied_embeddings else ""
    if m.moe is None:
        return (f"**{count_label(m.params)} parameters**: {m.layers} layers, hidden {m.hidden:,}, "
                f"MLP {m.ffn_hidden:,}, {attn}, vocab {m.vocab:,}; {kind}{tied}")
    e = m.moe
    shared = f" + a shared expert of {e.shared_ffn_hidden:,}" if e.shared_ffn_hidden else ""
    dense = f"; {m.dense_layers} dense layers (MLP {m.ffn_hidden:,})" if m.dense_layers else ""
    limited = f" from at most {e.limited_groups} of {e.expert_groups} expert groups" if e.group_limited else ""
    return (f"**{count_label(m.params)} parameters, {count_label(m.active_params)} active per token**: "
            f"{m.layers} layers, hidden {m.hidden:,}, {attn}, vocab {m.vocab:,}; mixture of experts in "
            f"{m.moe_layers} layers: {e.experts} routed experts (MLP {e.expert_ffn_hidden:,}), top-{e.top_k}"
            f"{limited}{shared}{dense}; {kind}{tied}")


def hardware_facts(hw: HardwareProfile) -> list[str]:
    fp8 = f"{hw.peak_tflops_fp8:,.0f}" if hw.peak_tflops_fp8 else "no fp8"
    price = (f"${hw.price.usd_per_gpu_hour:.2f}/GPU-hour ({hw.price.offering or 'list price'}, {hw.price.date})"
             if hw.price else "no price")
    return [
        f"**{hw.name}**",
        f"HBM {hw.hbm_total_gib:.1f} GiB, usable {hw.usable_hbm_gib:.1f} GiB ({hw.runtime_reserve_gib:.1f} runtime reserve)",
        f"dense TFLOP/s: bf16 {hw.peak_tflops_bf16:,.0f}, fp8 {fp8}" + (", MX formats" if hw.mx_formats else ""),
        f"HBM {hw.hbm_bandwidth_tbs:.2f} TB/s; scale-up {hw.intra_node_gbs:,.0f} GB/s/GPU; "
        f"scale-out {hw.inter_node_gbps:,.0f} Gb/s/GPU",
        f"{hw.gpus_per_node} GPUs per node, {hw.host_ram_gib_per_node:,.0f} GiB host RAM",
        price,
    ]


def fsdp_cost_source(stack: StackProfile) -> str:
    """Where a stack's per-block FSDP cost comes from: fitted to its runs (which then bound it) or measured."""
    if stack.fsdp_overhead_calibrated_share is None:
        return "FSDP2's per-block hooks, measured; no published run of this stack fitted it"
    return (f"fitted to the stack's published runs, where it is at most {stack.fsdp_overhead_calibrated_share:.0%} of "
            "a step; not FSDP2's work on a rank, which one H100 measured at 0-2.3 ms a block: the rest needs more than "
            "one rank")


def assumptions(hw: HardwareProfile, stack: StackProfile, memory_margin: float) -> str:
    """The conventions behind every number on the page, as markdown."""
    e = hw.efficiency
    fp8 = f", fp8 GEMM {e.gemm_fp8:.2f} of fp8 peak" if e.gemm_fp8 else ""
    price = (f"${hw.price.usd_per_gpu_hour:.2f} per GPU-hour, {hw.price.offering or 'list price'} read "
             f"{hw.price.date}" if hw.price else "no list price (cost is not shown)")
    kernel, attention = attention_kernel(hw, stack)
    one = stack.fragmentation_one_stream
    frag = f"{stack.fragmentation:.0%} of allocated" + (
        f", {one:.0%} on one GPU or DDP, where every allocation is on the compute stream" if one is not None else "")
    return f"""
**Throughput and MFU.** Model FLOPs per token follow torchtitan's convention: `{FLOP_CONVENTION}`.
MFU = tokens/s/GPU x FLOPs per token / the **dense bf16 peak** of the GPU ({hw.peak_tflops_bf16:,.0f} TFLOP/s
for {hw.id}), also for Float8 runs (as torchtitan reports it). Recompute from activation checkpointing costs
time but is not counted as model FLOPs.

**Memory.** Every memory number is the **peak reserved** memory of torch's caching allocator on the
**worst** rank (allocated + fragmentation; the stack's fragmentation is {frag}). With pipeline parallelism the worst pipeline stage is shown, and each stage on its own bar, so
an average never hides the rank that runs out of memory. Usable HBM = device total {hw.hbm_total_gib:.1f} GiB
minus {hw.runtime_reserve_gib:.1f} GiB for the CUDA/ROCm context and NCCL/library workspaces =
{hw.usable_hbm_gib:.1f} GiB. A plan fits when its peak is at most the **memory margin** ({memory_margin:.0%})
of usable HBM = {hw.usable_hbm_gib * memory_margin:.1f} GiB. Parameters, gradients and AdamW states are fp32
(mixed precision with bf16 compute, fp32 gradient reduction); activations are counted per microbatch in
flight, including the logits and loss buffers of the last stage.

**Efficiency factors** ({hw.id}): best-shape bf16 GEMM {e.gemm_bf16:.2f} of peak{fp8}; attention
({kernel}) {attention:.2f} of bf16 peak; achieved HBM bandwidth {e.hbm:.2f} of peak; sustained clock {e.clock:.2f};
collectives reach {hw.intra_node_efficiency:.2f} of the scale-up link and {hw.inter_node_efficiency:.2f} of
the scale-out line rate. The {stack.name} stack: model-shape GEMMs reach {stack.gemm_efficiency:.2f} of
best-shape; FSDP overlaps {stack.fsdp_overlap:.0%} of compute with its collectives; vanilla TP overlaps
{stack.tp_overlap:.0%}, async TP {stack.async_tp_overlap:.0%}; context parallel overlaps {stack.cp_overlap:.0%};
FSDP adds {stack.fsdp_overhead_s_per_layer * 1e3:.1f} ms a block per microbatch beyond compute and its exposed
collectives ({fsdp_cost_source(stack)}); a step adds {stack.step_overhead_s * 1e3:.0f} ms beyond its kernels' work.
Each number's source is in the hardware profile and stack YAML files.

**Ranking.** Configurations within {RANK_BAND:.0%} throughput of each other rank by lower memory (the estimate is
not finer than that). With the GPU count and hardware fixed, time-to-train and cost order the same way as
throughput, so the three objectives give the same ranking here; they differ in the hardware comparison.

**Time and cost.** days = token budget / (tokens/s/GPU x GPUs) / 86,400; cost = GPU-hours x {price}.
No restarts, checkpoint stalls or evaluation time are included.
"""
