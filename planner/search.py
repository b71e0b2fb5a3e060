"""Search: evaluate every configuration through the estimator's batched path, keep what fits, rank it.

`plan_search` returns a :class:`SearchResult` holding the whole sweep as arrays (valid and rejected,
with reasons), the ranking of what fits, and the Pareto front of throughput against memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshplan.estimator import intervals, rules
from meshplan.estimator.batch import GIB, ConfigArrays, estimate_arrays
from meshplan.estimator.config import (
    AC_MODES,
    EP_COMM_BACKENDS,
    FLOAT8_RECIPES,
    PP_SCHEDULES,
    RESHARD_POLICIES,
    TrainConfig,
)
from meshplan.estimator.errors import InputError, MeshplanError
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_SEQ_LEN, check_size
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.stages import less_fields
from meshplan.estimator.stack import StackProfile
from meshplan.planner.labels import OBJECTIVES, short_config
from meshplan.planner.space import (
    REASON_KEYS,
    SearchSpace,
    describe_reason,
    enumerate_space,
    even_split_variants,
    for_stack,
    rule_reasons,
)

CHUNK = 16_384  # configurations per estimator call: cache-sized arrays (250,000 spilled the cache; 16k measured 1.5-2x faster)


@dataclass
class SearchResult:
    model: ModelSpec
    hw: HardwareProfile
    stack: StackProfile
    world: int
    gpus_per_node: int
    seq_len: int
    global_batch: int  # the target (sequences); each configuration's own is configs.global_batch
    memory_margin: float
    objective: str
    configs: ConfigArrays
    reason: np.ndarray  # 0 = fits, 1..8 rule broken, 9 = does not fit in memory
    peak_gib: np.ndarray  # NaN where a rule was broken
    tps: np.ndarray  # tokens/s/GPU, NaN where a rule was broken
    step_s: np.ndarray
    mfu: np.ndarray
    ranked: np.ndarray  # indices of fitting configurations, best first
    pareto: np.ndarray  # indices on the throughput-vs-memory Pareto front (fitting only)
    host_gib: np.ndarray | None = None  # host RAM per node, NaN where a rule was broken
    finetune: dict | None = None  # the search's fine-tuning fields (TrainConfig names); None: pre-training
    space: SearchSpace | None = None  # what was searched (the fine-tuning comparison searches it again per mode)
    fit_confidence: float | None = None  # fits: P(measured peak <= limit) >= this; None: predicted peak <= limit
    fit_prob: np.ndarray | None = None  # P(measured peak <= limit_gib) from the cross-validated error, NaN if broken

    @property
    def evaluated(self) -> int:
        return len(self.reason)

    @property
    def rejected(self) -> int:
        return int((self.reason != 0).sum())

    @property
    def nvlink_gpus(self) -> int:
        """GPUs NVLink joins: a node, or the hardware's NVLink domain where it spans nodes (GB200 NVL72: 72)."""
        return self.hw.scale_up_gpus(self.gpus_per_node)

    @property
    def limit_gib(self) -> float:
        return self.hw.usable_hbm_gib * self.memory_margin

    def config(self, i: int) -> dict:
        """Configuration `i` with torchtitan's names (the plan's `parallel` block plus batch and world)."""
        c = self.configs
        return {
            "gpus": self.world,
            "gpus_per_node": self.gpus_per_node,
            "dp_replicate": int(c.dp_replicate[i]),
            "dp_shard": int(c.dp_shard[i]),
            "cp": int(c.cp[i]),
            "tp": int(c.tp[i]),
            "ep": int(c.ep[i]),
            "pp": int(c.pp[i]),
            "pp_schedule": PP_SCHEDULES[int(c.schedule[i])],
            "vpp": int(c.vpp[i]),
            "seq_len": self.seq_len,
            "global_batch_size": int(c.global_batch[i]),
            "micro_batch_size": int(c.micro_batch[i]),
            "ac": AC_MODES[int(c.ac[i])],
            "float8": FLOAT8_RECIPES[int(c.float8[i])],
            "compile": bool(c.compile[i]),
            "async_tp": bool(c.async_tp[i]),
            "cpu_offload": bool(c.cpu_offload[i]),
            **less_fields(int(c.pp_first_stage_less_layers[i]), int(c.pp_last_stage_less_layers[i])),
            **(self.finetune or {}),
            **({"dtype": "bfloat16"} if c.bf16_state[i] else {}),  # fp32 state (the default) reads as before
            # the default policy reads as before
            **({"fsdp_reshard_after_forward": RESHARD_POLICIES[int(c.reshard[i])]} if c.reshard[i] else {}),
            # set only where EP runs (enumerate_space): the standard backend reads as before the field existed
            **({"expert_parallel_comm_backend": EP_COMM_BACKENDS[int(c.ep_backend[i])]} if c.ep_backend[i] else {}),
            **({"document_tokens": int(c.documents[i])} if c.documents[i] else {}),
        }

    def train_config(self, i: int) -> TrainConfig:
        return TrainConfig(**self.config(i))

    def reason_text(self, i: int) -> str:
        code = int(self.reason[i])
        extra = {}
        if code == rules.MEMORY and self.fit_confidence is not None and self.fit_prob is not None:
            return (f"fits with probability {float(self.fit_prob[i]):.0%} < {self.fit_confidence:.0%} (--fit-confidence):"
                    f" peak {float(self.peak_gib[i]):.1f} GiB against {self.limit_gib:.1f} GiB")
        if code == rules.MEMORY:
            extra = dict(peak_gib=float(self.peak_gib[i]), limit_gib=self.limit_gib, margin=self.memory_margin,
                         usable_gib=self.hw.usable_hbm_gib)
        if code == rules.HOST_MEMORY:
            extra = dict(host_gib=float(self.host_gib[i]), host_limit_gib=self.hw.host_ram_gib_per_node,
                         host_what="the offloaded weights, gradients and AdamW state"
                         if bool(self.configs.cpu_offload[i]) else "sharded checkpoint state and the processes")
        return describe_reason(code, self.model, self.hw, self.config(i), extra)

    def reason_counts(self) -> dict[str, int]:
        codes, counts = np.unique(self.reason[self.reason > 0], return_counts=True)
        return {REASON_KEYS[int(k)]: int(v) for k, v in zip(codes, counts, strict=True)}


RANK_BAND = 0.01  # configurations within 1 % throughput of each other rank by lower memory


def _order(tps: np.ndarray, peak: np.ndarray, idx: np.ndarray, offload: np.ndarray | None = None) -> np.ndarray:
    """Best first: highest tokens/s/GPU in 1 % bands (the estimate is not finer than that), then without CPU
    offload (it pins host RAM and moves the optimizer to the CPU: taken only where it pays), then lowest memory,
    then highest exact throughput. With the world size and hardware fixed, time-to-train and cost order the same
    way as throughput."""
    if len(idx) == 0:
        return idx
    band = np.floor(np.log(tps[idx]) / np.log1p(RANK_BAND))
    off = np.zeros(len(idx)) if offload is None else offload[idx]
    return idx[np.lexsort((-tps[idx], peak[idx], off, -band))]


def pareto_front(tps: np.ndarray, peak: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Indices in `idx` not dominated in (higher tokens/s/GPU, lower memory), by increasing memory."""
    if len(idx) == 0:
        return idx
    order = idx[np.lexsort((-tps[idx], peak[idx]))]
    best = -np.inf
    keep = []
    for i in order:
        if tps[i] > best:
            keep.append(i)
            best = tps[i]
    return np.asarray(keep, dtype=np.int64)


def plan_search(
    model: ModelSpec,
    hw: HardwareProfile,
    stack: StackProfile,
    world: int,
    gpus_per_node: int,
    seq_len: int,
    global_batch: int,
    memory_margin: float = 0.9,
    objective: str = "throughput",
    space: SearchSpace | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    fit_confidence: float | None = None,
) -> SearchResult:
    """Evaluate every configuration; `progress(done, total)` is called per chunk on large spaces.

    A configuration fits when its predicted peak is at most `memory_margin` x usable HBM or, with
    `fit_confidence` (a probability), when the measured peak stays within that limit with at least that
    probability, given the estimator's cross-validated memory error (:mod:`meshplan.estimator.intervals`)."""
    if world < 1 or gpus_per_node < 1:
        raise MeshplanError("the cluster needs at least one node of at least one GPU")
    if seq_len < 1 or global_batch < 1:
        raise MeshplanError("seq_len and the global batch must be positive")
    check_size(world, "the world size (GPUs)", MAX_GPUS)
    check_size(gpus_per_node, "gpus_per_node", MAX_GPUS_PER_NODE)
    check_size(seq_len, "seq_len", MAX_SEQ_LEN)
    check_size(global_batch, "the global batch (sequences)", MAX_GLOBAL_BATCH)
    if not 0 < memory_margin <= 1:
        raise InputError(f"memory_margin must be in (0, 1], got {memory_margin}", field="memory_margin")
    if fit_confidence is not None and not 0 < fit_confidence < 1:
        raise InputError(f"the fit confidence is a probability in (0, 1), got {fit_confidence}", field="fit_confidence")
    if objective not in OBJECTIVES:
        raise InputError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}", field="objective")
    space = space if space is not None else SearchSpace()
    if not 0 <= space.batch_tolerance < 1:
        raise InputError(f"the batch tolerance is a fraction in [0, 1), got {space.batch_tolerance}",
                         field="batch_tolerance")
    space = for_stack(space, stack)  # only what the stack's framework runs
    configs, reason = enumerate_space(model, hw, world, gpus_per_node, seq_len, global_batch, space)
    reason = _stack_rules(model, hw, stack, space, configs, reason)
    limit = hw.usable_hbm_gib * memory_margin
    found = _evaluate(model, hw, stack, configs, reason, progress)
    configs, reason, found = _with_even_splits(model, hw, stack, space, configs, reason, found, limit)
    peak, tps, step, mfu, host = (found[k] for k in ("peak", "tps", "step", "mfu", "host"))
    fit_prob = intervals.fit_probability(peak, limit, stack.id, model.moe is not None)
    too_big = (fit_prob < fit_confidence) if fit_confidence is not None else (peak > limit)
    reason[(reason == 0) & too_big] = rules.MEMORY
    reason[(reason == 0) & (host > hw.host_ram_gib_per_node)] = rules.HOST_MEMORY
    fits = np.flatnonzero(reason == 0)
    ranked = _order(tps, peak, fits, configs.cpu_offload)
    return SearchResult(
        model=model, hw=hw, stack=stack, world=world, gpus_per_node=gpus_per_node, seq_len=seq_len,
        global_batch=global_batch, memory_margin=memory_margin, objective=objective, configs=configs,
        reason=reason, peak_gib=peak, tps=tps, step_s=step, mfu=mfu, ranked=ranked,
        pareto=pareto_front(tps, peak, fits), host_gib=host,
        finetune=space.finetune_fields() or None, space=space, fit_confidence=fit_confidence, fit_prob=fit_prob,
    )


def _evaluate(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, configs: ConfigArrays, reason: np.ndarray,
              progress: Callable[[int, int], None] | None) -> dict[str, np.ndarray]:
    """Peak (GiB), tokens/s/GPU, step (s), MFU and host RAM per node (GiB) of every configuration no rule rejects
    (NaN for the others), in cache-sized chunks."""
    n = len(reason)
    found = {k: np.full(n, np.nan) for k in ("peak", "tps", "step", "mfu", "host")}
    valid = np.flatnonzero(reason == 0)
    for start in range(0, len(valid), CHUNK):
        idx = valid[start : start + CHUNK]
        r = estimate_arrays(model, hw, stack, configs.take(idx))
        found["peak"][idx] = r["peak_bytes"] / GIB
        found["tps"][idx] = r["tokens_per_sec_per_gpu"]
        found["step"][idx] = r["step_time_s"]
        found["mfu"][idx] = r["mfu"]
        found["host"][idx] = r["host_bytes_per_node"] / GIB
        if progress:
            progress(min(start + CHUNK, len(valid)), len(valid))
    return found


# how far above the memory limit a pipeline with torchtitan's default split may peak and still have its even split
# tried: the even split takes at most one block off the heaviest rank, which holds 4 or more where it matters
EVEN_SPLIT_REACH = 1.25


def _with_even_splits(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, space: SearchSpace,
                      configs: ConfigArrays, reason: np.ndarray, found: dict[str, np.ndarray], limit: float):
    """The configurations, reasons and results with the even-split variants (`even_split_variants`: both split
    weights 0) of the uneven pipelines that pass every rule and peak within EVEN_SPLIT_REACH of `limit` (GiB)
    appended and evaluated: the search size grows by those only. None under a stack that splits its own way."""
    if stack.pp_split != "torchtitan":  # the framework splits its own way (nanotron's cost walk): no weights to set
        return configs, reason, found
    near = np.flatnonzero((reason == 0) & (found["peak"] <= limit * EVEN_SPLIT_REACH))
    variants = even_split_variants(model, configs, near)
    if not len(variants):
        return configs, reason, found
    extra = _stack_rules(model, hw, stack, space, variants, rule_reasons(model, hw, variants, space.allow_tp_across_nodes))
    more = _evaluate(model, hw, stack, variants, extra, None)
    return (configs.concat(variants), np.concatenate([reason, extra]),
            {k: np.concatenate([v, more[k]]) for k, v in found.items()})


def _stack_rules(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, space: SearchSpace,
                 configs: ConfigArrays, reason: np.ndarray) -> np.ndarray:
    """Reasons with the rules that do not hold for `stack` lifted (`rules.plan_skips`: those plan files and the
    training core accept): the configurations one rejected are checked again against every other rule."""
    skip = rules.plan_skips(stack)
    codes = [r.code for r in rules.RULES if r.key in skip]
    again = np.flatnonzero(np.isin(reason, codes))
    if len(again):
        reason = reason.copy()
        reason[again] = rules.violations(model, configs.take(again), hw, policies=not space.allow_tp_across_nodes,
                                         planner=True, skip=skip)
    return reason


def explain_empty(res: SearchResult) -> str:
    """Why nothing fits: the closest configuration and what the rules rejected."""
    counts = res.reason_counts()
    mem = np.flatnonzero(res.reason == rules.MEMORY)
    host = np.flatnonzero(res.reason == rules.HOST_MEMORY)
    if len(host) and (not len(mem) or np.nanmin(res.host_gib[host]) <= res.hw.host_ram_gib_per_node * 4):
        i = host[np.nanargmin(res.host_gib[host])]
        return (
            f"no configuration of {res.model.name} fits on {res.world} x {res.hw.id}: those that fit in GPU memory "
            f"need host RAM, at least {res.host_gib[i]:,.0f} GiB per node > the node's "
            f"{res.hw.host_ram_gib_per_node:,.0f} GiB with {short_config(res.config(i))}; add nodes, use nodes "
            "with more host RAM, or train fewer weights (--finetune lora / qlora)"
        )
    if len(mem) and res.fit_confidence is not None:
        i = mem[np.nanargmin(res.peak_gib[mem])]
        return (
            f"no configuration of {res.model.name} fits on {res.world} x {res.hw.id} with probability "
            f">= {res.fit_confidence:.0%}: the smallest peak, {res.peak_gib[i]:.1f} GiB with "
            f"{short_config(res.config(i))}, stays within {res.limit_gib:.1f} GiB with probability "
            f"{float(res.fit_prob[i]):.0%}; lower --fit-confidence, add nodes, or pick a larger-memory GPU"
        )
    if len(mem):
        i = mem[np.nanargmin(res.peak_gib[mem])]
        return (
            f"no configuration of {res.model.name} fits on {res.world} x {res.hw.id}: the smallest peak is "
            f"{res.peak_gib[i]:.1f} GiB > {res.limit_gib:.1f} GiB ({res.memory_margin:.0%} of usable) with "
            f"{short_config(res.config(i))}; add nodes, pick a larger-memory GPU, or shorten the sequence"
        )
    if not counts:
        return "the search space is empty"
    worst = max(counts, key=counts.get)
    return (
        f"no configuration of {res.model.name} is valid on {res.world} GPUs: every candidate breaks a rule "
        f"(most often {worst}: e.g. {res.reason_text(int(np.flatnonzero(res.reason > 0)[0]))})"
    )
