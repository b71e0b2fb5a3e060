"""Vectorised estimator: memory and step time for many configurations of one model on one hardware.

:func:`estimate_arrays` reads the physics modules (`estimator/physics/`, one per term) in the order a step
does, over arrays of configurations (one element per configuration), so the planner evaluates hundreds of
thousands of configurations per second and a single estimate is the same code on arrays of length one.
Units: bytes, seconds, tokens, FLOPs (plain numbers, not GiB).

Memory follows torchtitan's semantics: the number reported is the caching allocator's peak *reserved*
memory of the worst rank (`torch.cuda.max_memory_reserved`, max over ranks).
"""

from __future__ import annotations

from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.hardware import GIB, HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics import finetune
from meshplan.estimator.physics.activations import activations
from meshplan.estimator.physics.host import (
    full_load_bytes_per_node,
    host_bytes_per_node,
    offloaded_bytes_per_node,
)
from meshplan.estimator.physics.layout import layout_of, sequence_shards
from meshplan.estimator.physics.memory import (
    ALLOCATED_CATEGORIES,
    MEMORY_CATEGORIES,
    PEAK_PHASES,
    reserved_bytes,
    worst_stage_memory,
)
from meshplan.estimator.physics.shapes import rank_params
from meshplan.estimator.physics.step import TIME_CATEGORIES, step_time
from meshplan.estimator.stack import StackProfile

GIB = float(GIB)
__all__ = ["GIB", "MEMORY_CATEGORIES", "PEAK_PHASES", "TIME_CATEGORIES", "ConfigArrays", "estimate_arrays"]


def estimate_arrays(
    model: ModelSpec, hw: HardwareProfile, stack: StackProfile, c: ConfigArrays, stage=None
) -> dict:
    """Estimate every configuration in `c`. Returns a dict of float arrays (bytes, seconds, tokens/s).

    Memory is for the worst pipeline stage (the first, the second or the last), or for pipeline stage
    `stage` (an int or an array of ints, 0-based) when given.
    Keys: one per MEMORY_CATEGORIES entry (bytes at the peak phase, worst rank; they sum to
    `peak_bytes`), `peak_bytes` (reserved), `allocated_bytes`, `peak_phase` (index into PEAK_PHASES),
    `saved_activations` (bytes saved for backward at the end of a forward), `grads_after_backward` and
    `unsharded_params_max` (bytes), `host_bytes_per_node`, `host_offload_bytes_per_node` (what CPU offload pins),
    `host_full_load_bytes_per_node`, `trainable_params_rank` (after FSDP), one per
    TIME_CATEGORIES entry (seconds per optimizer step; they sum to `step_time_s`), `step_time_s`,
    `tokens_per_sec_per_gpu`, `mfu`, `worst_stage` (0-based pipeline stage index), `microbatches`,
    `microbatch_time_s`, `fsdp_overhead_s` (seconds per step of the stack's per-block FSDP cost, inside
    `overhead`). Each stage's rank holds the blocks torchtitan's split gives it (physics/stages.py); the
    step is timed on the rank holding the most (`shapes.rank_params`).
    """
    lay = layout_of(c, stack)
    rp = rank_params(model, lay, stack.tp_shards_embedding, sequence_shards(stack, model, lay))
    act = activations(model, stack, lay, rp)
    mem, worst_stage = worst_stage_memory(model, stack, lay, rp, act, stage)
    reserved = reserved_bytes(hw, stack, mem.allocated_bytes, lay, model)
    step = step_time(model, hw, stack, lay, rp, act.vocab_rank)
    weights = finetune.weights(model, lay, rp)
    state = finetune.stage_state(weights, lay, rp, rp.most, stack)
    return {
        **{k: mem.parts[k] for k in ALLOCATED_CATEGORIES},
        "fragmentation": reserved - mem.allocated_bytes,
        "peak_bytes": reserved,
        "allocated_bytes": mem.allocated_bytes,
        "worst_stage": worst_stage,
        "saved_activations": mem.saved_activations_bytes,
        "grads_after_backward": mem.grads_after_backward_bytes,
        "peak_phase": mem.peak_phase,
        "unsharded_params_max": mem.unsharded_params_max_bytes,
        "weight_copies": mem.weight_copies_bytes,
        "host_bytes_per_node": host_bytes_per_node(stack, lay, state),
        "host_offload_bytes_per_node": offloaded_bytes_per_node(lay, state),
        "trainable_params_rank": state.trainable_sharded,
        "host_full_load_bytes_per_node": full_load_bytes_per_node(stack, lay, float(model.params)),
        **step.parts,
        "step_time_s": step.step_s,
        "tokens_per_sec_per_gpu": step.tokens_per_sec_per_gpu,
        "mfu": step.mfu,
        "microbatches": lay.microbatches,
        "microbatch_time_s": step.microbatch_s,
        "fsdp_overhead_s": step.fsdp_overhead_s,
    }
