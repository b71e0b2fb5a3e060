"""Activation memory in bytes: what each AC mode saves for backward, the backward's temporaries, the logits.

Per token and layer on one rank (bf16 = 2 bytes per element), the way torchtitan's Llama block saves them:
no AC keeps every intermediate, op-level selective AC (op-SAC) keeps the outputs of every second matmul and
the attention, full AC keeps only the block input. Under TP (+ sequence parallel) the norms' tensors are
sequence-sharded and the column-parallel linears save their all-gathered input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics import finetune, moe
from meshplan.estimator.physics.layout import Layout, sequence_shards
from meshplan.estimator.physics.shapes import RankParams
from meshplan.estimator.physics.state import fp32_compute, weight_copy_bytes
from meshplan.estimator.stack import StackProfile

# fp32 weights under torch.autocast keep the residual stream in fp32: bytes per token per unit of hidden a block saves
# beyond bf16's without AC (its norms' inputs and the residual sums) and with AC (the block input), and the head's
# (the final norm's input); counted by tracing the core's eager blocks under autocast, the same at hidden 512 and 1024
AUTOCAST_FP32_STREAM_NONE = 8.0
AUTOCAST_FP32_STREAM_AC = 2.0
AUTOCAST_FP32_HEAD = 2.0


@dataclass(frozen=True)
class Activations:
    """Activation terms of every configuration (float arrays, bytes unless named otherwise)."""

    saved_per_token_layer: np.ndarray  # saved for backward per token per block, the configuration's AC mode
    block_bytes: np.ndarray  # one block's saved activations for one microbatch
    backward_temp_bytes: np.ndarray  # the backward's temporaries of one block (one microbatch)
    logits_bytes: np.ndarray  # the loss's logits buffers of one microbatch (last stage)
    loss_saved_bytes: np.ndarray  # what the loss of one microbatch keeps for its backward (last stage)
    head_per_token: np.ndarray  # the head's saved inputs per token (last stage)
    first_block_unsaved_per_token: np.ndarray  # what the first block does not save (LoRA, no AC; 0 otherwise)
    vocab_rank: np.ndarray  # vocabulary entries one rank computes the loss over (vocab / tp when loss-parallel)


def attention_saved(model: ModelSpec, stack: StackProfile, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(bytes the attention part of a block saves per token without AC, with op-level selective AC), its input
    norm included. GQA: q, K/V (expanded to every head with repeat_kv), the output and its log-sum-exp; MLA
    (DeepSeek): the query and KV latents and their norms (unsharded under TP), the up-projected heads, RoPE'd q/k."""
    h, q, kv = float(model.hidden), float(model.q_dim), float(model.kv_dim)
    heads, t, has_tp = float(model.heads), lay.tp, lay.has_tp
    seq_t = sequence_shards(stack, model, lay)  # the norm's input: sequence-sharded under sequence parallelism
    gathered = xp.where(has_tp, 2 * h, 2 * h / t)  # SP all-gather output saved by column-parallel linears
    rs_out = xp.where(has_tp, 2 * h / seq_t, 0.0)  # the reduce-scatter (all-reduce) output op-SAC keeps under TP
    if model.mla is not None:
        a, v = model.mla, float(model.v_dim)
        ql, kvl, rope = float(a.q_lora_rank), float(a.kv_lora_rank), float(a.qk_rope_head_dim)
        latents = 4 * ql + 2 * (kvl + rope) + 2 * kvl
        heads_none = (2 * q + 2 * heads * (a.qk_nope_head_dim + a.v_head_dim) + 2 * q + 2 * q + 2 * v + 2 * v) / t
        none = 2 * h / seq_t + gathered + latents + heads_none + 4 * heads / t
        sel = 2 * h / seq_t + 2 * ql + 2 * (kvl + rope) + (2 * v + 4 * heads) / t + rs_out
        return none, sel
    kv_attn = q if stack.repeat_kv else kv  # K/V width fed to attention
    none = 2 * h / seq_t + gathered + (2 * q + 4 * kv_attn + 2 * q + 2 * q) / t + 4 * heads / t
    # op-SAC: block input, wq and wv outputs, attention output (+lse), and with TP wo's reduce-scatter output
    sel = 2 * h / seq_t + (2 * q + 2 * kv + 2 * q + 4 * heads) / t + rs_out
    return none, sel


def dense_mlp_saved(model: ModelSpec, lay: Layout, seq_t) -> tuple[np.ndarray, np.ndarray]:
    """(bytes a dense MLP saves per token without AC, with op-level selective AC), its input norm included
    (sequence-sharded `seq_t` ways: `layout.sequence_shards`)."""
    h, F, t, has_tp = float(model.hidden), float(model.ffn_hidden), lay.tp, lay.has_tp
    gathered = xp.where(has_tp, 2 * h, 2 * h / t)
    if model.gated_mlp:
        mlp_none = 8 * F / t  # w1, w3, the activation, the product
        mlp_sel = 2 * F / t  # w1 output (3rd of 4 saved mms, torchtitan op-SAC)
    else:
        mlp_none = 4 * F / t  # fc1, gelu
        mlp_sel = 2 * F / t
    # op-SAC also keeps w2's (partial) output and, with TP, its reduce-scatter output
    return 2 * h / seq_t + gathered + mlp_none, mlp_sel + 2 * h + xp.where(has_tp, 2 * h / seq_t, 0.0)


def saved_per_token_layer(model: ModelSpec, stack: StackProfile, lay: Layout, moe_share=0.0,
                          routed: moe.Routing | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(bytes saved per token per block for the configuration's AC mode, the same without AC), averaged over the
    rank's blocks when a share `moe_share` of them are MoE blocks (`routed`)."""
    h = float(model.hidden)
    seq_t = sequence_shards(stack, model, lay)
    attn_none, attn_sel = attention_saved(model, stack, lay)
    mlp_none, mlp_sel = dense_mlp_saved(model, lay, seq_t)
    if routed is not None:
        moe_none, moe_sel = moe.mlp_saved(model, routed, lay)
        mlp_none = mlp_none + moe_share * (2 * h / seq_t + moe_none - mlp_none)
        mlp_sel = mlp_sel + moe_share * (moe_sel - mlp_sel)
    lora_none, lora_sel = finetune.lora_saved_delta(model, lay)  # LoRA's adapters (0 otherwise)
    a_none = attn_none + mlp_none + lora_none
    a_sel = attn_sel + mlp_sel + lora_sel
    a_full = 2 * h / seq_t
    act = xp.where(lay.full_ac, a_full, xp.where(lay.selective_ac, a_sel, a_none))
    act = act * xp.where(lay.compiled & xp.logical_not(lay.full_ac), stack.compile_activation_factor, 1.0)
    return act, a_none


def backward_temporaries(model: ModelSpec, lay: Layout, a_none: np.ndarray) -> np.ndarray:
    """Bytes of one (dense) block's backward temporaries: its activation gradients, the bf16 weight gradients of
    the MLP (none when LoRA freezes it), and what the checkpoint recomputes (op-SAC: the unsaved MLP tensors;
    full AC: the whole block)."""
    h, F, t = float(model.hidden), float(model.ffn_hidden), lay.tp
    if model.gated_mlp:
        grad_tok = 6 * F / t  # gradients of the w2 input, the silu output and w3's output
        sac_tok = 8 * F / t  # w3 output, silu, product and silu's gradient temporaries recomputed
        mlp_w = 3 * h * F / t
    else:
        grad_tok = 4 * F / t
        sac_tok = 4 * F / t
        mlp_w = 2 * h * F / t
    ac_tok = xp.where(lay.full_ac, a_none + 4 * F / t - grad_tok, xp.where(lay.selective_ac, sac_tok, 0.0))
    return (grad_tok + ac_tok) * lay.tokens_mb + xp.where(lay.lora, 0.0, 2 * mlp_w)


def loss_buffers(model: ModelSpec, stack: StackProfile, lay: Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes of the loss's logits buffers for one microbatch, bytes of them the loss keeps from its forward to its
    backward, vocabulary entries per rank): the stack's bytes per logit element, loss-parallel under TP
    (vocab-sharded) or, when compile compiles the loss (compile_components), the compiled loss's. What it keeps is an eager cross-entropy's fp32
    log-softmax (a compiled loss: its bf16 input); traced on the training core (eager, GPipe on 4 stages), the last
    stage held 3.95 bytes per element for each microbatch still waiting for its backward."""
    loss_par = lay.has_tp & bool(stack.loss_parallel)
    vocab_rank = float(model.vocab) / xp.where(loss_par, lay.tp, 1.0)
    per_el = xp.where(loss_par, stack.loss_parallel_bytes_per_element, stack.logits_bytes_per_element)
    saved_el = stack.loss_saved_bytes_per_element
    if stack.compiled_loss_bytes_per_element is not None:  # compile.components has the loss (not loss-parallel)
        compiled = lay.loss_compiled & xp.logical_not(loss_par)
        per_el = xp.where(compiled, stack.compiled_loss_bytes_per_element, per_el)
        saved_el = xp.where(compiled, stack.compiled_loss_saved_bytes_per_element, saved_el)
    elements = lay.tokens_mb * vocab_rank
    return per_el * elements, saved_el * elements, vocab_rank


def activations(model: ModelSpec, stack: StackProfile, lay: Layout, rp: RankParams) -> Activations:
    """Every activation term of the configurations `lay` (the rank's blocks `rp`: some may be MoE blocks)."""
    routed = moe.routing(model, stack, lay)
    share = rp.moe_layers / rp.layers
    act, a_none = saved_per_token_layer(model, stack, lay, share, routed)
    temp = backward_temporaries(model, lay, a_none)
    if routed is not None:  # the block in backward is a MoE block where the rank has any
        moe_none, _ = moe.mlp_saved(model, routed, lay)
        attn_none, _ = attention_saved(model, stack, lay)
        moe_temp = moe.backward_temp_bytes(model, routed, lay, rp.routed_block, attn_none + moe_none)
        temp = xp.where(rp.moe_layers > 0, xp.maximum(temp, moe_temp), temp)
    logits, loss_saved, vocab_rank = loss_buffers(model, stack, lay)
    h = float(model.hidden)
    # the head's saved inputs on the last stage: the final norm's input (sequence-sharded under TP) and the
    # output projection's input (all-gathered under TP; not saved when LoRA freezes the projection), bf16
    seq_t = sequence_shards(stack, model, lay)
    head = xp.where(lay.has_tp, 2 * h / seq_t + 2 * h, 4 * h) - xp.where(lay.lora, 2 * h, 0.0)
    attn_none, _ = attention_saved(model, stack, lay)
    lora_none, _ = finetune.lora_saved_delta(model, lay)
    attn_lora = attn_none + xp.minimum(lora_none, 0.0)  # LoRA's removals are the attention's and MLP's inputs
    wide = xp.where(fp32_compute(stack, lay), 2.0, 1.0)  # fp32 training: every activation twice as wide
    act, temp, head = act * wide, temp * wide, head * wide
    # fp32 weights under torch.autocast (one device or DDP, torchtitan 0.2.2): the embedding's output, so the residual
    # stream and the norms' inputs, stay fp32 (only matmuls cast to bf16): bytes per token per unit of hidden beyond
    # bf16's, traced on the core's blocks (`meshplan trace`, tests/launcher/test_trace.py, exact at two widths)
    # (eager: a compiled block saves what its partitioner picks, `compile_activation_factor`, measured on GPUs)
    cast = (weight_copy_bytes(stack, lay) > 0) & xp.logical_not(lay.compiled)
    fp32_stream = xp.where(lay.full_ac | lay.selective_ac, AUTOCAST_FP32_STREAM_AC, AUTOCAST_FP32_STREAM_NONE)
    act = act + xp.where(cast, fp32_stream * h / seq_t, 0.0)
    head = head + xp.where(cast, AUTOCAST_FP32_HEAD * h / seq_t, 0.0)
    return Activations(
        saved_per_token_layer=act, block_bytes=act * lay.tokens_mb,
        backward_temp_bytes=temp, logits_bytes=logits, loss_saved_bytes=loss_saved,
        head_per_token=head, vocab_rank=vocab_rank,
        first_block_unsaved_per_token=finetune.first_block_unsaved(model, lay, attn_lora),
    )
