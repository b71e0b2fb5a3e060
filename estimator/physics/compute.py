"""Compute time per microbatch on one rank (seconds): GEMMs, attention, recompute, Float8 casts, elementwise work,
kernel-launch overhead; and the optimizer step. FLOPs are dense; peaks and efficiencies come from the hardware
profile, the framework's factors from the stack profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.config import FLOAT8_RECIPES
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics import finetune, moe
from meshplan.estimator.physics.layout import Layout, sequence_shards
from meshplan.estimator.physics.state import fp32_compute, weight_copy_bytes
from meshplan.estimator.stack import StackProfile

FWD_BWD_GEMM = 3.0  # a linear's forward + backward: 1 + 2 matmuls of the same size
FWD_BWD_ATTENTION = 3.5  # flash attention's forward + backward: the backward is 2.5 forwards (recomputes P)
FULL_AC_PASSES = 4.0 / 3.0  # full AC runs each block's forward twice: 4 passes instead of 3
FROZEN_GEMM = 2.0 / 3.0  # a frozen linear's backward computes the input gradient only: 2 matmuls of 3
FP32 = 4.0  # bytes per fp32 element


@dataclass(frozen=True)
class ComputeTimes:
    """Seconds per microbatch on one rank (float arrays)."""

    gemm_attention_s: np.ndarray  # the blocks' GEMMs and attention plus the output projection
    recompute_s: np.ndarray  # what activation checkpointing re-runs
    float8_casts_s: np.ndarray  # Float8 amax + scale + cast traffic
    elementwise_s: np.ndarray  # norms, RoPE, activations, residuals, and the loss over the vocabulary
    overhead_s: np.ndarray  # the CPU's kernel launches: on the critical path only where the GPU runs out of work
    fsdp_overhead_s: np.ndarray  # FSDP's per-block cost the published multi-GPU runs show (0 without FSDP)
    attention_s: np.ndarray  # one block's attention (CP overlaps its ring exchange with it)
    all_to_all_s: np.ndarray  # expert-parallel dispatch and combine of the rank's MoE blocks (not hidden)
    dequant_s: np.ndarray  # QLoRA: NF4 weights dequantized to bf16 before their GEMMs
    weight_grad_s: np.ndarray  # the weight-gradient GEMMs (a third of every trained linear's), part of gemm_attention_s

    @property
    def busy_s(self) -> np.ndarray:
        """Time the GPU computes (before slow-down by communication kernels)."""
        return self.gemm_attention_s + self.recompute_s + self.float8_casts_s + self.elementwise_s + self.dequant_s


def peak_flops(hw: HardwareProfile, fp8: bool = False) -> float:
    """Sustained dense peak FLOP/s: the profile's bf16 (or fp8) tensor peak x its clock under the power cap."""
    tflops = (hw.peak_tflops_fp8 or hw.peak_tflops_bf16) if fp8 else hw.peak_tflops_bf16
    return tflops * 1e12 * hw.efficiency.clock


def fp32_peak_tflops(hw: HardwareProfile) -> float:
    """Dense fp32 TFLOP/s (non-tensor-core; torch leaves TF32 matmuls off by default): the profile's, or a sixteenth
    of its bf16 peak (the Ampere / Hopper ratio: 19.5 / 312, 67 / 989) when it states none."""
    return hw.peak_tflops_fp32 or hw.peak_tflops_bf16 / 16


def hbm_bytes_per_s(hw: HardwareProfile) -> float:
    """Achieved HBM bandwidth of memory-bound kernels, bytes/s."""
    return hw.hbm_bandwidth_tbs * 1e12 * hw.efficiency.hbm


def attention_kernel(hw: HardwareProfile, stack: StackProfile, kernel: str = "default") -> tuple[str, float]:
    """(name, fwd+bwd throughput / bf16 peak) of the attention kernel a job runs on this part: `kernel` (sdpa,
    flex), or the stack's (`attention_kernel`) by default. SDPA runs cuDNN's fused attention where the stack prefers
    it and the profile states it, else FlashAttention-2; FlexAttention its Triton kernel, at the stack's
    `flex_attention_factor` of FlashAttention-2."""
    if stack.attention_of(kernel) == "flex":
        return "FlexAttention", hw.efficiency.attention * stack.flex_attention_factor
    cudnn = hw.efficiency.attention_cudnn
    if stack.sdpa_backend == "cudnn" and cudnn is not None:
        return "cuDNN's fused attention", cudnn
    return "FlashAttention-2", hw.efficiency.attention


FLEX_BLOCK = 128  # FlexAttention's default sparse block (tokens): a partly masked block is computed whole


def document_share(seq_len, document_tokens):
    """Share of causal attention's work a block-causal mask leaves where sequences of `seq_len` tokens are packed
    with documents of mean `document_tokens` (exponential lengths, cut at the sequence's ends: a Poisson process of
    document starts): E[sum d_i^2] / s^2 = 2 (x - 1 + e^-x) / x^2 with x = s / D, plus the partly masked blocks
    FlexAttention computes whole (a block's width B past each document's square: (2 B s + B^2 E[n]) / s^2, E[n] =
    x + 1 documents a sequence); at most 1, and 1 where D is 0 (one document a sequence). Works on numbers and
    arrays."""
    s = xp.as_float(seq_len)
    d = xp.as_float(document_tokens)
    x = s / xp.maximum(d, 1.0)
    within = 2.0 * (x - 1.0 + xp.exp(-x)) / xp.maximum(x * x, 1e-12)
    blocks = (2.0 * FLEX_BLOCK * s + FLEX_BLOCK ** 2 * (x + 1.0)) / (s * s)
    return xp.where(d > 0, xp.minimum(1.0, within + blocks), 1.0)


def attention_efficiency(hw: HardwareProfile, stack: StackProfile, lay: Layout | None = None):
    """Fwd+bwd attention throughput / bf16 peak of the kernel each configuration runs on this part
    (attention_kernel: FlexAttention where `lay.flex_attention`, else SDPA's; the stack's without a layout)."""
    if lay is None:
        return attention_kernel(hw, stack)[1]
    return xp.where(lay.flex_attention, attention_kernel(hw, stack, "flex")[1], attention_kernel(hw, stack, "sdpa")[1])


def by_recipe(lay: Layout, stack: StackProfile, field: str, default) -> np.ndarray:
    """A Float8 recipe's stack value per configuration (`default` where the recipe is none or not profiled)."""
    if not xp.is_array(lay.float8):  # one configuration: its recipe's value
        recipe = stack.float8.get(FLOAT8_RECIPES[int(lay.float8)])
        return default if recipe is None else getattr(recipe, field)
    out = xp.full_like(lay.tp, default, dtype=np.asarray(default).dtype.type)
    for code, name in enumerate(FLOAT8_RECIPES):
        if name in stack.float8:
            out = xp.where(lay.float8 == code, getattr(stack.float8[name], field), out)
    return out


def gemm_s(hw: HardwareProfile, stack: StackProfile, lay: Layout, k_in, n_out, count: float = 1.0,
           recipe: np.ndarray | None = None, tokens=None, groups=None):
    """(forward + backward seconds of a linear with k_in x n_out weights, already TP-sharded, per microbatch in
    the configuration's precision, the same in bf16). Efficiency falls for small and skinny GEMMs. `recipe`: the
    Float8 recipes' GEMM factors (`by_recipe(..., "gemm_factor", 1.0)`), computed here when not given.
    `tokens`: rows other than the microbatch's tokens; `groups`: a grouped GEMM of that many equal groups. One
    grouped kernel fills the GPU with the tiles of every group, so the whole GEMM's FLOPs set the size term, and the
    rows per group count as a narrow dimension (a group's last tile runs part empty). Measured on one H100: a
    grouped GEMM runs at 0.81-0.94 of the dense GEMM of the same total shape from 8 groups of 3072 rows to 128 of
    512 (data/measurements/h100-sxm-grouped-gemm-2026-11-27.json), not at the throughput of one group alone."""
    fl = 2.0 * (lay.tokens_mb if tokens is None else tokens) * k_in * n_out
    narrow = xp.minimum(k_in, n_out)  # skinny GEMMs (TP-sharded K/V, small heads) run below peak
    if groups is not None:
        narrow = xp.minimum(narrow, tokens / groups)
    size = fl / (fl + stack.gemm_half_gflop * 1e9) * narrow / (narrow + stack.gemm_half_dim)
    t16 = FWD_BWD_GEMM * fl / (peak_flops(hw) * hw.efficiency.gemm_bf16 * stack.gemm_efficiency * size)
    if hw.peak_tflops_fp8 is None:
        return count * t16, count * t16
    if recipe is None:
        recipe = by_recipe(lay, stack, "gemm_factor", 1.0)
    t8 = FWD_BWD_GEMM * fl / (peak_flops(hw, fp8=True) * hw.efficiency.gemm_fp8 * stack.gemm_efficiency * size * recipe)
    return count * xp.where(lay.fp8, t8, t16), count * t16


def attention_gemms_s(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, lay: Layout,
                      recipe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fwd + bwd seconds of a block's attention projections, the share op-SAC recomputes: every second one).
    GQA: wq, wk, wv, wo; MLA: the query and KV down-projections (whole on every TP rank, as torchtitan's
    NoParallel), their column-parallel up-projections and wo."""
    h, q, t = float(model.hidden), float(model.q_dim), lay.tp
    if model.mla is None:
        wq, _ = gemm_s(hw, stack, lay, h, q / t, recipe=recipe)
        wk, _ = gemm_s(hw, stack, lay, h, float(model.kv_dim) / t, recipe=recipe)
        wo, _ = gemm_s(hw, stack, lay, q / t, h, recipe=recipe)
        return wq + 2 * wk + wo, wk + wo
    a = model.mla
    shapes = [(h, float(a.q_lora_rank)), (float(a.q_lora_rank), q / t)] if a.q_lora_rank else [(h, q / t)]
    shapes += [(h, float(a.kv_lora_rank + a.qk_rope_head_dim)),
               (float(a.kv_lora_rank), model.heads * float(a.qk_nope_head_dim + a.v_head_dim) / t),
               (float(model.v_dim) / t, h)]
    times = [gemm_s(hw, stack, lay, k, n, recipe=recipe)[0] for k, n in shapes]
    return sum(times), sum(times[1::2])


def _mlp_cast_elems(width_t):
    """Elements of the MLP's Float8-converted linears' inputs and output gradients per token, beyond the block's
    attention share (w1/w3 outputs' gradients, w2's input and its gradient), for an inner width `width_t`."""
    return 2 * width_t + width_t + 2 * width_t


# torch.autocast over fp32 weights in an eager block, forward + backward: every matmul casts its weight to bf16 and the
# bf16 weight gradient back to fp32 (6 + 6 bytes a weight; a recompute casts again: 18), and the residual stream stays
# fp32, so each linear casts its input and the norms and residual adds move fp32 (50 bytes a token per unit of
# hidden; 60 with AC). Counted from the core's block code by benchmarks/autocast_bytes.py (a TorchDispatchMode
# byte count of every aten op, autocast vs bf16 weights: the same at two widths and two sequence lengths)
AUTOCAST_BYTES_PER_WEIGHT = (12.0, 18.0)  # without AC, with (full or op-level) AC
AUTOCAST_BYTES_PER_TOKEN_HIDDEN = (50.0, 60.0)


def autocast_cast_s(stack: StackProfile, lay: Layout, layers, hidden: float, block_linear_per_hidden,
                    head_weights, hbm) -> np.ndarray:
    """Seconds per microbatch torch.autocast's casts add to an eager rank holding `layers` blocks whose linears have
    `block_linear_per_hidden` x `hidden` weights each (and `head_weights` in the output projection): only where the
    stack trains fp32 weights under autocast (torchtitan 0.2.2 on one GPU or DDP: `replicated_state.weight_copies`).
    Compiled blocks fuse the input casts into their neighbours; the weights' casts would remain, but the measured
    compiled runs (data/measurements/h100-sxm-core-2026-11-27.csv) are predicted 3-11 % slow already without them, so
    none is counted there (an open question, not a measurement of zero)."""
    ac = lay.full_ac | lay.selective_ac
    per_weight = xp.where(ac, AUTOCAST_BYTES_PER_WEIGHT[1], AUTOCAST_BYTES_PER_WEIGHT[0])
    per_token = xp.where(ac, AUTOCAST_BYTES_PER_TOKEN_HIDDEN[1], AUTOCAST_BYTES_PER_TOKEN_HIDDEN[0]) * hidden
    moved = layers * (per_weight * block_linear_per_hidden * hidden + lay.tokens_mb * per_token) \
        + AUTOCAST_BYTES_PER_WEIGHT[0] * head_weights
    return xp.where((weight_copy_bytes(stack, lay) > 0) & ~lay.compiled, moved / hbm, 0.0)


def compute_times(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, lay: Layout, layers: np.ndarray,
                  vocab_rank: np.ndarray, moe_layers: np.ndarray | None = None) -> ComputeTimes:
    """Compute time per microbatch of a rank running `layers` blocks (`moe_layers` of them MoE blocks); timing
    assumes the stage with the head."""
    h, q, kv, F = float(model.hidden), float(model.q_dim), float(model.kv_dim), float(model.ffn_hidden)
    t, gated = lay.tp, model.gated_mlp
    kv_t, q_t, f_t = kv / t, q / t, F / t
    async_eff = xp.where(lay.async_tp, stack.async_tp_gemm_factor, 1.0)
    recipe = by_recipe(lay, stack, "gemm_factor", 1.0)  # once for the block's GEMMs
    attn_gemm, attn_sel = attention_gemms_s(model, hw, stack, lay, recipe)
    w1, _ = gemm_s(hw, stack, lay, h, f_t, 2.0 if gated else 1.0, recipe=recipe)  # w1 and w3 (gated) or fc1
    w2, _ = gemm_s(hw, stack, lay, f_t, h, recipe=recipe)
    block_gemm = (attn_gemm + w1 + w2) / async_eff
    seq_t = sequence_shards(stack, model, lay)  # t, or 1 where TP runs without sequence parallelism
    # the output projection stays bf16 (torchao); vocabulary-sharded under TP (whole without sequence parallelism)
    _, head_gemm = gemm_s(hw, stack, lay, h, float(model.vocab) / seq_t, recipe=recipe)
    # causal flash attention: forward 2 matmuls (QK^T, then PV) of s x s/2 per head (fewer with local attention)
    attn_fwd_flops = 2.0 * lay.micro_batch * lay.seq_len * lay.seq_len * (q + float(model.v_dim)) / (t * lay.cp) * 0.5
    if model.attention_window:
        attn_fwd_flops = attn_fwd_flops * model.attention_share(lay.seq_len)
    if xp.any_(lay.document_tokens > 0):  # FlexAttention's block-causal mask: attention within documents only (the
        # whole sequence's share: CP's load-balanced shards split that work evenly)
        attn_fwd_flops = attn_fwd_flops * xp.where(lay.flex_attention,
                                                   document_share(lay.seq_len, lay.document_tokens), 1.0)
    attn_eff = attention_efficiency(hw, stack, lay) * stack.attention_factor / (1 + stack.cp_attention_penalty * (lay.cp - 1))
    attn = FWD_BWD_ATTENTION * attn_fwd_flops / (peak_flops(hw) * attn_eff)
    per_chunk = xp.where(lay.single_stage, 1.0, 1.0 / lay.vpp)  # the head runs once per microbatch, not per chunk
    # recompute: full AC re-runs each block's forward; op-SAC re-runs every second mm (wk, wo, w3)
    sel_recompute = (attn_sel + (w1 / 2 if gated else 0.0)) / FWD_BWD_GEMM / async_eff
    fwd_block = (block_gemm + attn) / FWD_BWD_GEMM
    # Float8 scale + cast traffic over every converted linear's input and output gradient
    lin_elems = (h + h + q_t + h) + (q_t + 2 * kv_t + h + h) + _mlp_cast_elems(f_t) - (0.0 if gated else f_t)
    hbm = hbm_bytes_per_s(hw)
    cast_bytes = by_recipe(lay, stack, "cast_bytes_per_element", 0.0) \
        * xp.where(lay.compiled, 1.0, stack.eager_float8_cast_factor)
    casts = xp.where(lay.fp8, layers * lay.tokens_mb * lin_elems * cast_bytes / hbm, 0.0)
    elem_factor = xp.where(lay.compiled, stack.compile_elementwise_factor, 1.0)
    elem = layers * lay.tokens_mb * stack.elementwise_passes * (h / seq_t + F / t) * 2 / hbm * elem_factor
    elem = elem + lay.tokens_mb * vocab_rank * FP32 * stack.loss_passes / hbm * per_chunk
    elem = elem + autocast_cast_s(stack, lay, layers, h, q_t + 2 * kv_t + q_t + (3.0 if gated else 2.0) * f_t,
                                  h * float(model.vocab) / seq_t * per_chunk, hbm)
    fewer_launches = xp.where(lay.compiled, stack.compile_overhead_factor, 1.0)
    overhead = layers * stack.launch_overhead_s_per_layer * fewer_launches
    # where FSDP2 spans ranks (it shards, or all-reduces each block's gradients over dp_replicate), its fitted
    # per-block cost, most of which needs more than one rank; on one GPU alone its hooks' CPU time, added to the
    # launches below (the one-rank probes of data/measurements/ show nothing more while the GPU is busy)
    alone = lay.fsdp_one_rank & (lay.dp_replicate <= 1)
    fsdp_overhead = xp.where(lay.fsdp & ~alone, layers * stack.fsdp_overhead_s_per_layer * fewer_launches, 0.0)
    # LoRA: the frozen base linears (and the frozen output projection) skip their weight gradients; the adapters'
    # skinny GEMMs run forward and backward (and again in a full-AC recompute, half of them under op-SAC)
    frozen = xp.where(lay.lora, FROZEN_GEMM, 1.0)
    adapters = finetune.lora_gemm_s(model, hw, stack, lay, gemm_s)
    gemm_attention = layers * (block_gemm * frozen + attn + adapters) + head_gemm * frozen * per_chunk
    recompute = layers * xp.where(lay.full_ac, fwd_block + adapters / FWD_BWD_GEMM,
                                  xp.where(lay.selective_ac, sel_recompute + adapters / FWD_BWD_GEMM / 2, 0.0))
    # QLoRA: each NF4 linear is dequantized in the forward, in the backward and in a full-AC recompute
    dequant_passes = 2.0 + xp.where(lay.full_ac, 1.0, xp.where(lay.selective_ac, 0.5, 0.0))
    dequant = layers * finetune.dequant_s(model, stack, lay, hbm_bytes_per_s(hw), dequant_passes)
    a2a = xp.zeros_like(t)
    # a full-AC recompute launches the block's forward kernels again; FSDP2 does no work in it (its pre-forward hook
    # returns once the pre-backward hook has unsharded the block: _fsdp_state.py _pre_forward), so its cost stays
    overhead = overhead * xp.where(lay.full_ac, FULL_AC_PASSES,
                                   xp.where(lay.selective_ac & ~lay.compiled, stack.selective_ac_eager_launch_factor,
                                            1.0)) \
        + xp.where(alone, layers * stack.fsdp_one_rank_hooks_s_per_layer, 0.0)
    routed = moe.routing(model, stack, lay)
    if routed is not None and moe_layers is not None:
        # a MoE block's MLP part instead of the dense MLP's, on each of the rank's MoE blocks
        mt = moe.moe_times(model, hw, stack, routed, lay, gemm_s, hbm, recipe)
        dense_mlp = (w1 + w2) / async_eff
        dense_rec = xp.where(lay.full_ac, dense_mlp / FWD_BWD_GEMM,
                             xp.where(lay.selective_ac, (w1 / 2 if gated else 0.0) / FWD_BWD_GEMM / async_eff, 0.0))
        s_t = routed.shared_width / t
        gemm_attention = gemm_attention + moe_layers * (mt.gemm_s - dense_mlp)
        recompute = recompute + moe_layers * (mt.recompute_s - dense_rec)
        casts = casts + xp.where(lay.fp8, moe_layers * lay.tokens_mb
                                 * (_mlp_cast_elems(s_t) - _mlp_cast_elems(f_t)) * cast_bytes / hbm, 0.0)
        elem = elem + moe_layers * (lay.tokens_mb * stack.elementwise_passes * 2 / hbm * elem_factor
                                    * (routed.expert_rows * routed.width + s_t - F / t) + mt.elementwise_s)
        overhead = overhead + moe_layers * mt.sync_s
        a2a = moe_layers * mt.all_to_all_s
    # fp32 training (TP or PP without FSDP under torchtitan): matmuls and attention at the fp32 peak, elementwise
    # traffic twice as wide
    fp32 = fp32_compute(stack, lay)
    slower = xp.where(fp32, hw.peak_tflops_bf16 / fp32_peak_tflops(hw), 1.0)
    gemm_attention, recompute, attn = gemm_attention * slower, recompute * slower, attn * slower
    elem = elem * xp.where(fp32, 2.0, 1.0)
    # the weight gradients: one matmul of a trained linear's three (attention's core has no weights; LoRA's frozen
    # linears compute none, its adapters' are too small to count)
    weight_grad = xp.where(lay.lora, 0.0, xp.maximum(0.0, gemm_attention - layers * attn) / FWD_BWD_GEMM)
    return ComputeTimes(
        gemm_attention_s=gemm_attention,
        recompute_s=recompute,
        float8_casts_s=casts,
        elementwise_s=elem,
        overhead_s=overhead,
        fsdp_overhead_s=fsdp_overhead,
        attention_s=attn,
        all_to_all_s=a2a,
        dequant_s=dequant,
        weight_grad_s=weight_grad,
    )


# HBM bytes per fp32 trainable parameter of the optimizer phase, counted from the kernels and checked on one H100
# (data/measurements/h100-sxm-core-2026-11-27.csv: the phase took 20.8 ms for 1.24 B parameters and 50.4 ms for
# 3.21 B, 40.5 and 40.4 bytes a parameter at the profile's HBM bandwidth once the stack's step_overhead_s (2 ms) is
# off; the foreach runs of 2026-11-26: 44 ms for 1.24 B, 91 bytes). Halved in training dtype bfloat16 (state_scale).
ADAMW_KERNEL_BYTES = {
    "fused": 28.0,  # one kernel: reads p, g, m, v and writes p, m, v
    "foreach": 80.0,  # eight passes: lerp m, mul + addcmul v, sqrt, div, add eps, addcdiv p, weight decay
    "for-loop": 80.0,  # the same passes a tensor at a time
}
GRAD_CLIP_BYTES = 12.0  # clip_grad_norm_: the norm reads every gradient (4), the clip reads and writes it (8)


def optimizer_step_s(hw: HardwareProfile, stack: StackProfile, sharded_params: np.ndarray) -> np.ndarray:
    """The gradient clip and AdamW over the local shard of `sharded_params` trainable fp32 parameters, seconds:
    memory-bound at the HBM bandwidth of memory-bound kernels (ADAMW_KERNEL_BYTES of the stack's implementation +
    GRAD_CLIP_BYTES a parameter)."""
    per_param = ADAMW_KERNEL_BYTES[stack.optimizer_implementation] + GRAD_CLIP_BYTES
    return per_param * sharded_params / hbm_bytes_per_s(hw)

