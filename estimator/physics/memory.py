"""Peak GPU memory of the worst rank, by category: the four moments of a step and the worst pipeline stage.

The allocated peak is the largest of four moments of a step (the traced timeline of launcher/trace.py
shows each; summing every term as if all were live at once overshoots it by 8-39 %):

- loss: every saved activation + the logits buffers of the loss (last stage only);
- block backward: the saved activations + the temporaries of the block in backward (its activation gradients,
  MLP weight gradients, what AC recomputes) + the unsharded parameters (current + prefetched block, the root) +
  the reduce-scatter input of the block before it (FSDP2 holds it until the next reduce-scatter);
- end of backward: every sharded gradient + the root's parameters and bf16 weight gradients (a whole-model compiled
  graph without FSDP, under gradient accumulation: + the backward's new gradients, all of them, before they are
  added to the accumulated ones);
- optimizer step: every gradient + the optimizer's temporaries (foreach AdamW: a moment-sized list; fused: none).

Parameters, optimizer state and (from the second microbatch on) sharded gradients are live in all four.
Fine-tuning (physics/finetune.py): under LoRA / QLoRA only the adapters have fp32 weights, gradients and AdamW
state; the frozen base weights are their own category (bf16, NF4 for QLoRA); under CPU offload all four live on
the host and the GPU holds only what FSDP gathers and the activations.
Reserved memory is the allocated peak x (1 + fragmentation), the caching allocator's share: lower where every
allocation is on the compute stream (one GPU, DDP). Bytes throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.config import Schedule
from meshplan.estimator.hardware import GIB, HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics import finetune
from meshplan.estimator.physics.activations import Activations
from meshplan.estimator.physics.layout import Layout, reduces_every_microbatch, resharded, sequence_shards
from meshplan.estimator.physics.pipeline import (
    head_microbatches,
    layers_in_flight,
    microbatches_in_flight,
    receive_buffer_bytes,
)
from meshplan.estimator.physics.shapes import RankParams
from meshplan.estimator.physics.state import BF16, GRAD_BYTES, state_scale, weight_copy_bytes
from meshplan.estimator.stack import StackProfile

# the categories of the allocated peak, in the order they are reported (they sum to the allocated bytes)
ALLOCATED_CATEGORIES = (
    "params_fp32",
    "frozen_params",
    "grads_fp32",
    "optimizer_states",
    "unsharded_params",
    "unsharded_grads",
    "activations",
    "logits_loss",
    "transient",
)
MEMORY_CATEGORIES = (*ALLOCATED_CATEGORIES, "fragmentation")
PEAK_PHASES = ("loss", "block backward", "end of backward", "optimizer step")


@dataclass(frozen=True)
class Phase:
    """What one phase holds beyond parameters and optimizer state (bytes, float arrays)."""

    grads_fp32: np.ndarray
    unsharded_params: np.ndarray
    unsharded_grads: np.ndarray
    activations: np.ndarray
    logits_loss: np.ndarray
    transient: np.ndarray

    def total(self) -> np.ndarray:
        return (self.grads_fp32 + self.unsharded_params + self.unsharded_grads + self.activations
                + self.logits_loss + self.transient)


@dataclass(frozen=True)
class StageMemory:
    """The peak of one pipeline stage (or the worst one) for every configuration; bytes unless named."""

    allocated_bytes: np.ndarray
    parts: dict[str, np.ndarray]  # ALLOCATED_CATEGORIES -> bytes at the peak phase
    saved_activations_bytes: np.ndarray  # every saved activation at the end of a forward (loss phase)
    grads_after_backward_bytes: np.ndarray  # sharded fp32 gradients once the step's backward is done
    peak_phase: np.ndarray  # index into PEAK_PHASES (float array)
    unsharded_params_max_bytes: np.ndarray  # all-gathered bf16 parameters at their most (a block's backward)
    # autocast's bf16 weight copies (no FSDP: one device, DDP) cached at the end of a forward and saved for backward
    weight_copies_bytes: np.ndarray

    def where(self, worse: np.ndarray, other: StageMemory) -> StageMemory:
        """Element-wise: `other` where `worse`, else this."""
        return StageMemory(
            allocated_bytes=xp.where(worse, other.allocated_bytes, self.allocated_bytes),
            parts={k: xp.where(worse, other.parts[k], v) for k, v in self.parts.items()},
            saved_activations_bytes=xp.where(worse, other.saved_activations_bytes, self.saved_activations_bytes),
            grads_after_backward_bytes=xp.where(worse, other.grads_after_backward_bytes,
                                                self.grads_after_backward_bytes),
            peak_phase=xp.where(worse, other.peak_phase, self.peak_phase),
            unsharded_params_max_bytes=xp.where(worse, other.unsharded_params_max_bytes,
                                                self.unsharded_params_max_bytes),
            weight_copies_bytes=xp.where(worse, other.weight_copies_bytes, self.weight_copies_bytes),
        )


@dataclass(frozen=True)
class Unsharded:
    """FSDP2's all-gathered bf16 parameters (bytes) at each moment, and the reduce-scatter input it holds."""

    current: np.ndarray  # the root and the block running
    backward: np.ndarray  # in a block's backward: the root, the current and the prefetched block
    loss: np.ndarray  # at the loss: the output projection (last stage)
    end: np.ndarray  # at the end of the backward: the root
    stage: np.ndarray  # at the end of a pipeline stage's backward: the whole stage (0 without PP or FSDP)
    reduce_scatter_input: np.ndarray  # the previous block's reduce-scatter input (reduce dtype)


def unsharded(stack: StackProfile, lay: Layout, rp: RankParams, w: finetune.Weights, prank, root,
              last) -> Unsharded:
    """Unsharded parameters of a stage holding `prank` parameters and `root` root parameters. Without PP FSDP2
    reshards after forward (the stack's policy) and gathers one block at a time; with PP it keeps the stage
    (unless the stack reshards there too: `pp_reshard_after_forward`); a configuration's
    `fsdp_reshard_after_forward` always / never overrides both (`layout.resharded`).
    A block gathers in bf16 (QLoRA: its linears in NF4) with its LoRA adapters; only trainable weights have a
    reduce-scatter input (the adapters under LoRA).
    Without FSDP nothing is gathered: under autocast (DDP, one device) each matmul's bf16 weight copy is cached for
    the forward and the loss and saved for its backward (with AC a block's copies are made again in its recompute);
    in fp32 or bf16 training the weights are used as they are."""
    per_block = resharded(stack, lay)
    whole = BF16 * prank
    block = w.block_gather_bytes_per_param * rp.block + BF16 * w.adapters_block
    block_trainable = xp.where(lay.lora, w.adapters_block, rp.block - xp.where(lay.ep > 1, rp.routed_block, 0.0))
    fsdp = lay.fsdp
    cast = weight_copy_bytes(stack, lay)  # autocast's bf16 copies (no FSDP) of the matmuls' weights:
    # every weight but the embedding's; LoRA's frozen base weights are bf16 already (only its adapters are cast)
    matmuls = cast * xp.where(lay.lora, w.adapters, prank - root + xp.where(last, rp.output, 0.0))
    cast_backward = xp.where(lay.full_ac | lay.selective_ac, cast * rp.block, matmuls)
    return Unsharded(
        current=xp.where(fsdp, xp.where(per_block, block + BF16 * root, whole), matmuls),
        backward=xp.where(fsdp, xp.where(per_block, stack.prefetch_blocks * block + BF16 * root, whole), cast_backward),
        loss=xp.where(fsdp, xp.where(per_block, BF16 * xp.where(last, rp.output, 0.0), whole), matmuls),
        # without PP each block's backward reshards it (FSDP2's reshard_after_backward), whatever its forward did;
        # a pipeline stage's stay gathered until the step's gradient reduction (above)
        end=xp.where(fsdp, xp.where(lay.single_stage, BF16 * root, whole), 0.0),
        # torch.distributed.pipelining's stage backward sets reshard_after_backward(False) until the step's last
        # (stage.py backward_maybe_with_nosync): a backward leaves every block it reaches gathered, so at the end of
        # one the whole stage is, however its forward resharded (traced: `meshplan trace`)
        stage=xp.where(fsdp & xp.logical_not(lay.single_stage), whole, 0.0),
        # with EP the block's routed experts are their own FSDP unit, reduce-scattered (and freed) inside the block's
        # backward: the block's own reduce-scatter input, held until the next one, is the rest
        reduce_scatter_input=xp.where(fsdp & (per_block | lay.single_stage),
                                      stack.reduce_bytes * block_trainable, 0.0),
    )


def stage_memory(model: ModelSpec, stack: StackProfile, lay: Layout, rp: RankParams, act: Activations,
                 stage: np.ndarray) -> StageMemory:
    """The allocated peak of pipeline stage `stage` (0-based), at whichever phase is largest."""
    p, m = lay.pp, lay.microbatches
    first, last = stage == 0, stage == p - 1
    prank = rp.of_stage(first, last)
    w = finetune.weights(model, lay, rp)
    state = finetune.stage_state(w, lay, rp, prank, stack)
    gf = state.grads_bytes
    single = lay.single_stage
    # FSDP2 + PP: unsharded bf16 params kept for the step, fp32 grads accumulated unsharded across microbatches; the
    # same gradients without PP where the stack skips the reduce-scatter before the last microbatch (FSDP2's
    # set_requires_gradient_sync(False): each parameter's unsharded gradient is kept, in the reduce dtype,
    # FSDPParam.to_accumulated_grad_if_needed, until the last microbatch reduces it)
    held = xp.logical_not(reduces_every_microbatch(stack, lay))
    acc = xp.where(held & (m > 1) & lay.fsdp, stack.reduce_bytes * w.trainable(lay, prank), 0.0)
    root = rp.root(first, last)
    up = unsharded(stack, lay, rp, w, prank, root, last)
    recv = receive_buffer_bytes(lay, float(model.hidden), first, sequence_shards(stack, model, lay))
    if stack.pp_receive_buffers == "every_microbatch":  # PipelineStage's buffers: every microbatch's, to the end
        recv_all = recv_grads = recv_end = m * recv
    else:  # allocated as each receive is posted: the microbatches in flight hold theirs, the gradients pass through
        recv_all, recv_grads, recv_end = recv * microbatches_in_flight(lay, stage), 0.0, 0.0
    acts_blocks = act.block_bytes * layers_in_flight(lay, rp.layers, stage) + recv_all \
        - xp.where(first, act.first_block_unsaved_per_token * lay.tokens_mb, 0.0)
    acc = acc + recv_grads
    # the last stage: the head's saved inputs of every microbatch in flight (GPipe: all), and the saved loss of each
    # one but the microbatch at its loss (whose buffers are logits_loss)
    in_flight = head_microbatches(lay)
    head = xp.where(last, act.head_per_token * lay.tokens_mb * in_flight + act.loss_saved_bytes * (in_flight - 1), 0.0)

    # DDP's buckets (state.bucket_bytes, part of gf) exist from the model's wrapping on: in the first forward too
    buckets = state.bucket_bytes
    loss = Phase(grads_fp32=xp.where(single & (m > 1), gf, buckets), unsharded_params=up.loss, unsharded_grads=acc,
                 activations=acts_blocks + head, logits_loss=xp.where(last, act.logits_bytes, 0.0),
                 transient=xp.zeros_like(p))
    # the block just reduced keeps its sharded fp32 gradients on the GPU (not under CPU offload)
    grad_bytes = GRAD_BYTES * state_scale(lay)
    block_grads = xp.where(lay.offload, 0.0, grad_bytes * rp.sharded_block(lay))
    block_grads = xp.where(lay.lora, xp.where(lay.offload, 0.0, grad_bytes * w.adapters_block / lay.fsdp_ranks),
                           block_grads)
    # GPipe runs every forward before the first backward, whose first blocks therefore meet all the activations but
    # no accumulated gradient yet (the unsharded fp32 gradients and the received inputs' gradients appear with it);
    # 1F1B's later backwards meet both (its microbatches in flight stay in flight)
    gpipe = xp.logical_not(single) & (lay.schedule == int(Schedule.GPIPE))
    acc_first = xp.where(gpipe, 0.0, acc)
    backward = backward_phase(lay, rp, act, up, gf, acc, acts_blocks, block_grads, w.dequant_bf16_bytes, acc_first,
                              buckets)
    # end of the backward, at the root: every sharded grad, the root's parameters and its bf16 weight gradients
    # (under TP the embedding's is a Partial of the whole vocabulary: DTensor has no vocab-sharded embedding
    # backward), the first block's reduce-scatter input, and the gradient arriving at the embedding output
    # (full sequence, bf16) with its copy
    # (under LoRA the root is frozen: no weight gradients, and no gradient flows into the embedding)
    trains_root = xp.logical_not(lay.lora)
    root_grads = xp.where(trains_root, BF16 * root + xp.where(first, BF16 * model.vocab * model.hidden
                                                               - BF16 * rp.embedding, 0.0), 0.0)
    # FSDP under PP: the step's one reduction turns the unsharded gradients into sharded ones a block at a time
    # (the sharded ones were freed by the last zero_grad): the two are never both whole, the block's shard beside
    # the rest of `acc` at most (without FSDP the gradients are the parameters' own, whole at the end)
    end_grads = xp.where(xp.logical_not(single) & lay.fsdp, xp.minimum(gf, block_grads), gf)
    end = Phase(grads_fp32=end_grads, unsharded_params=up.end,
                unsharded_grads=acc + up.reduce_scatter_input + root_grads,
                activations=recv_end,  # every_microbatch: the buffers held to the step's end; in_flight: none left
                logits_loss=xp.zeros_like(p),
                transient=xp.where(first & trains_root, 2 * BF16 * model.hidden * lay.tokens_mb, 0.0)
                + whole_graph_gradients(stack, lay, gf))

    zero = xp.zeros_like(p)
    step = Phase(grads_fp32=gf, unsharded_params=up.end, unsharded_grads=zero, activations=zero, logits_loss=zero,
                 transient=optimizer_temporary_bytes(stack, state.optimizer_bytes) + zero)

    base = state.params_bytes + state.optimizer_bytes + state.frozen_bytes
    phases = (loss, backward, end, step)
    totals = [base + ph.total() for ph in phases]
    phase = xp.where(last, xp.argmax_of(totals), xp.argmax_of(totals[1:]) + 1)
    parts = {"params_fp32": state.params_bytes, "frozen_params": state.frozen_bytes,
             "optimizer_states": state.optimizer_bytes}
    for name in ALLOCATED_CATEGORIES:
        if name not in parts:
            parts[name] = xp.choose(phase, [getattr(ph, name) for ph in phases])
    return StageMemory(
        allocated_bytes=xp.choose(phase, totals),
        parts={k: parts[k] for k in ALLOCATED_CATEGORIES},
        # saved for backward at the end of a forward: the receive buffers of the microbatches in flight only
        saved_activations_bytes=acts_blocks - recv_all
        + recv * microbatches_in_flight(lay, stage) + head,
        grads_after_backward_bytes=gf,
        peak_phase=xp.as_float(phase),
        unsharded_params_max_bytes=xp.maximum(up.backward, up.stage),
        weight_copies_bytes=xp.where(lay.fsdp, 0.0, up.loss),
    )


def whole_graph_gradients(stack: StackProfile, lay: Layout, grads_bytes):
    """Bytes of the gradients a whole-model compiled backward returns at once (`stack.compile_whole_model`), live
    beside the accumulated ones from the second microbatch on, until AccumulateGrad adds them: measured on one H100
    (torch 2.11, a 16-block bf16 model of 1 GiB, 3 microbatches): the backward's peak above the weights was 2.02 GiB
    from the second microbatch on compiled whole, 1.45 GiB eager or compiled a block at a time (README "Measured on
    an H100 and an H200"). FSDP's hooks split the graph a block at a time, so only runs without FSDP hold them, and
    pipeline stages, whose schedule runs each microbatch's backward on its own, are left out."""
    whole = stack.compile_whole_model & lay.compiled & xp.logical_not(lay.fsdp) & lay.single_stage
    return xp.where(whole & (lay.microbatches > 1), grads_bytes, 0.0)


def optimizer_temporary_bytes(stack: StackProfile, optimizer_bytes):
    """Bytes torch's AdamW allocates on the GPU beyond its state during the step (`optimizer_bytes`: the rank's two
    moments on the GPU). foreach (`_multi_tensor_adamw`) computes sqrt(exp_avg_sq) for every parameter at once:
    one moment-sized list, in the moments' dtype. fused works in place; for-loop holds one tensor's at a time."""
    return optimizer_bytes * (0.5 if stack.optimizer_implementation == "foreach" else 0.0)


def backward_phase(lay: Layout, rp: RankParams, act: Activations, up: Unsharded, gf, acc, acts_blocks,
                   block_grads, dequant, acc_first, buckets=0.0) -> Phase:
    """A block's backward: in the first block to run (every activation, the next block prefetched, no
    reduce-scatter yet) or in the second (its predecessor's activations freed, that block's reduce-scatter
    input held, the one after it prefetched if the stage has three or more), or, on a pipeline stage, at the end
    of a microbatch's backward, whichever holds more. `acc`: the accumulated unsharded bytes (gradients, received
    inputs' gradients); `acc_first`: what of them the backward's first blocks meet (GPipe: none yet);
    `block_grads`: the sharded gradients of one block on the GPU; `dequant`: QLoRA's dequantized bf16 weight;
    `buckets`: DDP's gradient buckets, there from the start."""
    m, pp_nosync = lay.microbatches, xp.logical_not(lay.single_stage)
    # sharded grads: all of them from the second microbatch on, else the block just reduced; none with PP
    # (the schedule's microbatches accumulate unsharded until the last one); DDP's buckets in any case
    g_first = xp.where(pp_nosync, buckets, xp.where(m > 1, gf, buckets))
    g_prev = xp.where(pp_nosync, buckets, xp.where(m > 1, gf, block_grads + buckets))
    up_last = xp.where(rp.layers >= 2, up.backward, up.current)
    up_prev = xp.where(rp.layers >= 3, up.backward, up.current)
    temp = act.backward_temp_bytes + dequant
    in_last = g_first + up_last + acc_first + acts_blocks + temp
    in_prev = g_prev + up_prev + acc_first + acts_blocks - act.block_bytes + up.reduce_scatter_input + temp
    prev = (rp.layers >= 2) & (in_prev > in_last)
    # a pipeline stage at the end of a microbatch's backward: that microbatch's activations (one chunk's blocks)
    # freed, every block gathered (Unsharded.stage)
    one_mb = act.block_bytes * rp.layers / lay.vpp
    in_end = up.stage + acc + acts_blocks - one_mb
    end = pp_nosync & (in_end > xp.where(prev, in_prev, in_last))
    return Phase(
        grads_fp32=xp.where(end, 0.0, xp.where(prev, g_prev, g_first)),
        unsharded_params=xp.where(end, up.stage, xp.where(prev, up_prev, up_last)),
        unsharded_grads=xp.where(end, acc, acc_first + xp.where(prev, up.reduce_scatter_input, 0.0)),
        activations=acts_blocks - xp.where(end, one_mb, xp.where(prev, act.block_bytes, 0.0)),
        logits_loss=xp.zeros_like(gf),
        transient=xp.where(end, 0.0, temp) + xp.zeros_like(gf),
    )


def worst_stage_memory(model: ModelSpec, stack: StackProfile, lay: Layout, rp: RankParams, act: Activations,
                       stage=None) -> tuple[StageMemory, np.ndarray]:
    """(the peak, the 0-based stage it is on): of pipeline stage `stage` when given (an int or an array), else of
    the worst stage — the first (most microbatches in flight, the embedding), the second (the most in flight
    among those holding receive buffers, and the most blocks of the middle stages: torchtitan gives the extra
    blocks to the first stages) or the last (the logits). Each stage's rank holds its own blocks (`rp.at_stage`)."""
    p = lay.pp
    if stage is not None:
        k = xp.minimum(stage if isinstance(stage, int) and not xp.is_array(p) else np.asarray(stage, dtype=np.float64), p - 1)
        return stage_memory(model, stack, lay, rp.at_rank(model, lay, k), act, k), k
    worst_stage = xp.zeros_like(p)
    worst = stage_memory(model, stack, lay, rp.at_stage(0), act, worst_stage)
    if xp.all_(p <= 1):  # no pipeline anywhere: the one stage is the worst
        return worst, worst_stage
    for i, k in ((1, xp.minimum(1.0, p - 1)), (2, p - 1)):
        cand = stage_memory(model, stack, lay, rp.at_stage(i), act, k)
        worse = cand.allocated_bytes > worst.allocated_bytes
        worst = worst.where(worse, cand)
        worst_stage = xp.where(worse, k, worst_stage)
    return worst, worst_stage


def one_stream(lay: Layout) -> np.ndarray:
    """Configurations whose step allocates on the compute stream alone: one GPU or DDP (its all-reduce runs in
    place on persistent buckets). FSDP's all-gathers and reduce-scatters, TP / CP / EP collectives and pipeline
    receives allocate on side streams, whose pools the compute stream cannot reuse."""
    return (xp.logical_not(lay.fsdp) & xp.logical_not(lay.has_tp) & lay.single_stage & (lay.cp <= 1)
            & (lay.ep <= 1))


def fragmentation(stack: StackProfile, lay: Layout) -> np.ndarray | float:
    """reserved / allocated - 1 of each configuration: the stack's one-stream figure where `one_stream`."""
    if stack.fragmentation_one_stream is None:
        return stack.fragmentation
    return xp.where(one_stream(lay), stack.fragmentation_one_stream, stack.fragmentation)


def reserved_bytes(hw: HardwareProfile, stack: StackProfile, allocated: np.ndarray, lay: Layout,
                   model: ModelSpec | None = None) -> np.ndarray:
    """The caching allocator's reserved bytes for an allocated peak: x (1 + `fragmentation`), and for a MoE model
    whose layers activation checkpointing recomputes x (1 + the stack's `moe.recompute_fragmentation`: dropless
    routing gives the routed tensors new sizes every layer and step, and the recomputed ones are allocated while
    the gradients are live), except near the limit, where the allocator frees cached blocks and retries instead of
    growing (capped at the usable HBM)."""
    usable = hw.usable_hbm_gib * GIB
    reserved = allocated * (1 + fragmentation(stack, lay))
    if model is not None and model.moe is not None and stack.moe is not None and stack.moe.recompute_fragmentation:
        recomputes = lay.full_ac | lay.selective_ac
        reserved = reserved * xp.where(recomputes, 1 + stack.moe.recompute_fragmentation, 1.0)
    return xp.where((reserved > usable) & (allocated <= usable), usable, reserved)
