"""Activation memory in bytes: what each AC mode saves for backward, the backward's temporaries, the logits.

Per token and layer on one rank (bf16 = 2 bytes per element), the way torchtitan's Llama block saves them:
no AC keeps every intermediate, op-level selective AC (op-SAC) keeps the outputs of every second matmul and
the attention, full AC keeps only the block input. Under TP (+ sequence parallel) the norms' tensors are
sequence-sharded and the column-parallel linears save their all-gathered input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.layout import Layout
from meshplan.estimator.stack import StackProfile


@dataclass(frozen=True)
class Activations:
    """Activation terms of every configuration (float arrays, bytes unless named otherwise)."""

    saved_per_token_layer: np.ndarray  # saved for backward per token per block, the configuration's AC mode
    block_bytes: np.ndarray  # one block's saved activations for one microbatch
    backward_temp_bytes: np.ndarray  # the backward's temporaries of one block (one microbatch)
    logits_bytes: np.ndarray  # the loss's logits buffers of one microbatch (last stage)
    head_per_token: np.ndarray  # the head's saved inputs per token (last stage)
    vocab_rank: np.ndarray  # vocabulary entries one rank computes the loss over (vocab / tp when loss-parallel)


def saved_per_token_layer(model: ModelSpec, stack: StackProfile, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(bytes saved per token per block for the configuration's AC mode, the same without AC)."""
    h, q, kv, F = float(model.hidden), float(model.q_dim), float(model.kv_dim), float(model.ffn_hidden)
    heads, t, has_tp = float(model.heads), lay.tp, lay.has_tp
    kv_attn = q if stack.repeat_kv else kv  # K/V width fed to attention
    gathered = np.where(has_tp, 2 * h, 2 * h / t)  # SP all-gather output saved by column-parallel linears
    if model.gated_mlp:
        mlp_none = 8 * F / t  # w1, w3, the activation, the product
        mlp_sel = 2 * F / t  # w1 output (3rd of 4 saved mms, torchtitan op-SAC)
    else:
        mlp_none = 4 * F / t  # fc1, gelu
        mlp_sel = 2 * F / t
    attn_none = (2 * q + 4 * kv_attn + 2 * q + 2 * q) / t + 4 * heads / t
    a_none = 4 * h / t + 2 * gathered + attn_none + mlp_none
    # op-SAC: block input, wq and wv outputs, attention output (+lse), w1 output, w2 partial output,
    # and with TP the reduce-scatter outputs.
    a_sel = (
        2 * h / t
        + (2 * q + 2 * kv + 2 * q + 4 * heads) / t
        + mlp_sel
        + np.where(has_tp, 2 * h + 4 * h / t, 2 * h)
    )
    a_full = 2 * h / t
    act = np.where(lay.full_ac, a_full, np.where(lay.selective_ac, a_sel, a_none))
    act = act * np.where(lay.compiled & ~lay.full_ac, stack.compile_activation_factor, 1.0)
    return act, a_none


def backward_temporaries(model: ModelSpec, lay: Layout, a_none: np.ndarray) -> np.ndarray:
    """Bytes of one block's backward temporaries: its activation gradients, the bf16 weight gradients of the
    MLP, and what the checkpoint recomputes (op-SAC: the unsaved MLP tensors; full AC: the whole block)."""
    h, F, t = float(model.hidden), float(model.ffn_hidden), lay.tp
    if model.gated_mlp:
        grad_tok = 6 * F / t  # gradients of the w2 input, the silu output and w3's output
        sac_tok = 8 * F / t  # w3 output, silu, product and silu's gradient temporaries recomputed
        mlp_w = 3 * h * F / t
    else:
        grad_tok = 4 * F / t
        sac_tok = 4 * F / t
        mlp_w = 2 * h * F / t
    ac_tok = np.where(lay.full_ac, a_none + 4 * F / t - grad_tok, np.where(lay.selective_ac, sac_tok, 0.0))
    return (grad_tok + ac_tok) * lay.tokens_mb + 2 * mlp_w


def loss_buffers(model: ModelSpec, stack: StackProfile, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(bytes of the loss's logits buffers for one microbatch, vocabulary entries per rank): the stack's bytes
    per logit element, loss-parallel under TP (vocab-sharded) or, with compile, the compiled loss's."""
    loss_par = lay.has_tp & np.bool_(stack.loss_parallel)
    vocab_rank = float(model.vocab) / np.where(loss_par, lay.tp, 1.0)
    per_el = np.where(loss_par, stack.loss_parallel_bytes_per_element, stack.logits_bytes_per_element)
    if stack.compiled_loss_bytes_per_element is not None:  # compile also compiles the loss (not loss-parallel)
        per_el = np.where(lay.compiled & ~loss_par, stack.compiled_loss_bytes_per_element, per_el)
    return per_el * lay.tokens_mb * vocab_rank, vocab_rank


def activations(model: ModelSpec, stack: StackProfile, lay: Layout) -> Activations:
    """Every activation term of the configurations `lay`."""
    act, a_none = saved_per_token_layer(model, stack, lay)
    logits, vocab_rank = loss_buffers(model, stack, lay)
    h, t = float(model.hidden), lay.tp
    # the head's saved inputs on the last stage: the final norm's input (sequence-sharded under TP) and the
    # output projection's input (all-gathered under TP), bf16
    head = np.where(lay.has_tp, 2 * h / t + 2 * h, 4 * h)
    return Activations(
        saved_per_token_layer=act, block_bytes=act * lay.tokens_mb,
        backward_temp_bytes=backward_temporaries(model, lay, a_none), logits_bytes=logits,
        head_per_token=head, vocab_rank=vocab_rank,
    )
