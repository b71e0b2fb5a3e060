"""The search space: every configuration of one model on one cluster, as arrays, with the reason each
rejected configuration breaks a rule.

Degrees are enumerated so that dp_replicate x dp_shard x cp x tp x pp equals the world size, from the divisors of
the world (so 3, 5, 6, 12 or 24 nodes plan as well as powers of two: PP 3 or 5, HSDP over 3 replicas); a
mixture-of-experts model adds the expert-parallel degree (a divisor of its experts and of dp_shard x cp x tp,
torchtitan's rule). The other knobs (schedule, stages per rank, micro-batch, AC, Float8, compile, async TP) are
crossed with them; the fine-tuning mode and the training dtype are the user's, one for the whole search. Pipelines split as torchtitan does by default (the first and last stage one block lighter:
physics/stages.py); :func:`even_split_variants` gives the same configurations with both weights 0 where that
default leaves a rank with more blocks, which the search tries for those that (nearly) fit.

The global batch is a target: each layout takes the nearest batch (in sequences) that its dp x micro-batch divides
and its pipeline can fill, within `batch_tolerance` of the target (:func:`nearest_batch`); the search result says
which batch each configuration trains with. Rule violations are kept, not dropped, so a user can see why a
configuration is not on the list.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass, field

import numpy as np

from meshplan.estimator import rules
from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.config import (
    AC_MODES,
    EP_COMM_BACKENDS,
    FINETUNE_MODES,
    FLOAT8_RECIPES,
    LOOPED_SCHEDULES,
    LORA_TARGETS,
    PP_SCHEDULES,
    RESHARD_POLICIES,
    looped,
    lora_mask,
)
from meshplan.estimator.errors import InputError
from meshplan.estimator.framework_runs import KNOBS, not_run
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.stages import DEFAULT_LESS, LESS_FIELDS, uneven
from meshplan.estimator.stack import FrameworkRuns, StackProfile

# Rejection reasons, by code (0 = valid): the shared rules of `estimator.rules` plus the planner's memory rule.
REASONS = {r.code: r.message for r in rules.RULES}
REASONS[rules.MEMORY] = "does not fit: peak {peak_gib:.1f} GiB > {limit_gib:.1f} GiB ({margin:.0%} of {usable_gib:.1f} usable)"
REASONS[rules.HOST_MEMORY] = ("host RAM {host_gib:,.0f} GiB per node > the node's {host_limit_gib:,.0f} GiB "
                              "({host_what})")
REASON_KEYS = {r.code: r.key for r in rules.RULES}
REASON_KEYS[rules.MEMORY] = "memory"
REASON_KEYS[rules.HOST_MEMORY] = "host_memory"


DEFAULT_BATCH_TOLERANCE = 0.1  # a 512-sequence target may train 461..563 (504 on dp 24, 510 on dp 30)


@dataclass
class SearchSpace:
    """Which values each knob may take; a field left None takes every valid value."""

    tp: list[int] | None = None
    pp: list[int] | None = None
    cp: list[int] | None = None
    ep: list[int] | None = None
    dp_replicate: list[int] | None = None
    pp_schedule: list[str] | None = None
    vpp: list[int] | None = None
    micro_batch_size: list[int] | None = None
    ac: list[str] | None = None
    float8: list[str] | None = None
    compile: list[bool] | None = None
    async_tp: list[bool] | None = None
    cpu_offload: list[bool] | None = None  # None: off; fine-tuning also on where FSDP shards alone
    allow_tp_across_nodes: bool = False
    # the global batch may move this far (a fraction) from the target so that the layout divides it; 0: exact
    batch_tolerance: float = DEFAULT_BATCH_TOLERANCE
    pins: dict = field(default_factory=dict)
    # fine-tuning: one mode for the whole search (TrainConfig's names and defaults)
    finetune: str = "none"
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_targets: tuple[str, ...] = LORA_TARGETS
    # torchtitan's training.dtype, one for the whole search (no dimension of it): "float32" or "bfloat16"
    dtype: str = "float32"
    # torchtitan's parallelism.fsdp_reshard_after_forward, one for the whole search: "default", "always" or "never"
    fsdp_reshard_after_forward: str = "default"
    # torchtitan's parallelism.expert_parallel_comm_backend, one for the whole search: standard, deepep or hybridep
    expert_parallel_comm_backend: str = "standard"
    # mean tokens of a packed training document (FlexAttention's block-causal mask), one for the whole search
    document_tokens: int | None = None
    # what the stack's framework runs (its profile's `runs`; `for_stack` sets it): defaults outside it are not searched
    runs: FrameworkRuns | None = None
    # the framework has no FSDP (nanotron's DDP): every data-parallel rank is a replica
    replicas_only: bool = False

    def finetune_fields(self) -> dict:
        """The search's fine-tuning settings as TrainConfig fields (empty for pre-training)."""
        if self.finetune == "none":
            return {}
        return {"finetune": self.finetune, "lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha,
                "lora_targets": tuple(self.lora_targets)}


def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def _divisors(n: int) -> list[int]:
    """Every divisor of n, ascending, in O(sqrt n) steps (a world of 10^6 GPUs takes 10^3)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def _replicas(dp: int) -> list[int]:
    """dp_replicate candidates for `dp` data-parallel ranks: powers of two, dp itself, and any divisor leaving a
    power-of-two shard group (3 replicas of 8 on 3 nodes)."""
    return [d for d in _divisors(dp) if d & (d - 1) == 0 or d == dp or (dp // d) & (dp // d - 1) == 0]


@functools.lru_cache(maxsize=4096)  # a search asks the same few (dp, micro-batch, pp) thousands of times
def nearest_batch(target: int, dp: int, micro_batch: int, pp: int, interleaved: bool, tolerance: float) -> int:
    """The global batch (sequences) nearest `target` that dp x micro-batch divides, with at least `pp` microbatches
    per step and, for a looped schedule (Interleaved1F1B, InterleavedZeroBubble), whole rounds of them; within `tolerance` (a fraction) of the target. Ties go
    to the smaller batch. Returns `target` itself when none qualifies (the rules then say why)."""
    unit = max(dp * micro_batch, 1)
    lo = max(1, -(-int(target * (1 - tolerance)) // unit))
    hi = int(target * (1 + tolerance)) // unit
    k0 = min(max(round(target / unit), lo), hi) if lo <= hi else 0
    if k0 == 0:
        return target
    for step in range(0, hi - lo + 2):
        for k in sorted({k0 - step, k0 + step}, key=lambda k: (abs(k * unit - target), k)):
            if not lo <= k <= hi:
                continue
            if pp > 1 and (k < pp or (interleaved and k % max(1, k // pp))):
                continue
            return k * unit
        if k0 - step < lo and k0 + step > hi:
            break
    return target


def for_stack(space: SearchSpace, stack: StackProfile) -> SearchSpace:
    """`space` limited to what `stack`'s framework runs (its profile's `runs`; replicas only where it has no FSDP):
    a copy whose unpinned knobs search only those values. A pinned value the framework does not run is an
    InputError naming it (the planner would otherwise rank a layout the framework cannot launch)."""
    for knob in KNOBS:
        pinned = [space.finetune] if knob == "finetune" else getattr(space, knob) or []
        what = not_run(stack, knob, pinned)
        if what:
            raise InputError(f"stack {stack.id} does not run {what} (see `runs` in its profile); plan with another "
                             "--stack or without that pin", field=knob)
    if stack.fsdp == "none" and space.cpu_offload and True in space.cpu_offload:
        raise InputError(f"stack {stack.id} has no FSDP, so no FSDP CPU offload", field="cpu_offload")
    return dataclasses.replace(space, runs=stack.runs, replicas_only=stack.fsdp == "none")


def enumerate_space(
    model: ModelSpec,
    hw: HardwareProfile,
    world: int,
    gpus_per_node: int,
    seq_len: int,
    global_batch: int,
    space: SearchSpace | None = None,
) -> tuple[ConfigArrays, np.ndarray]:
    """All configurations (ConfigArrays) and a reason code per configuration (0 = passes every rule)."""
    sp = space or SearchSpace()
    runs = sp.runs or FrameworkRuns()
    big = max(world, gpus_per_node)
    divisors = _divisors(world)
    # TP: powers of two (the rules say why one does not divide the heads), other divisors only where they do
    tps = sp.tp or runs.keep("tp", [t for t in divisors if t <= min(big, 64)
                                    and (t & (t - 1) == 0 or (model.heads % t == 0 and model.kv_heads % t == 0))])
    pps = sp.pp or runs.keep("pp", [p for p in divisors if p <= min(max(model.layers, 1), 128)])
    # CP: powers of two (a sequence that does not split shows the rule), other divisors only where it does split
    cps = sp.cp or runs.keep("cp", sorted(set(_pow2_upto(min(world, 32)))
                                          | {c for c in divisors if c <= 32 and seq_len % (2 * c) == 0}))
    experts = model.moe.experts if model.moe is not None else 1
    ep_all = sp.ep or runs.keep("ep", _divisors(experts))
    structural = []  # (dr, ds, cp, tp, pp, ep)
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        # without FSDP every data-parallel rank is a replica: a pinned dp_replicate holds only where it is all of dp
        drs = [d for d in (sp.dp_replicate or [dp]) if d == dp] if sp.replicas_only else sp.dp_replicate or _replicas(dp)
        for dr in drs:
            if dp % dr:
                continue
            ds = dp // dr
            # EP takes ranks of dp_shard x cp x tp; pinned values that do not divide them stay (the rules say why)
            eps = [e for e in ep_all if sp.ep or (ds * cp * tp) % e == 0] or [1]
            structural.extend((dr, ds, cp, tp, pp, e) for e in eps)
    sched_opts = []  # (schedule code, vpp) for pp > 1
    for name in sp.pp_schedule or runs.keep("pp_schedule", PP_SCHEDULES):
        code = PP_SCHEDULES.index(name)
        vpps = (sp.vpp or [2, 4]) if name in LOOPED_SCHEDULES else [1]
        for v in vpps:
            if name in LOOPED_SCHEDULES and v < 2:
                continue
            sched_opts.append((code, v))
    ac_codes = [AC_MODES.index(a) for a in (sp.ac or runs.keep("ac", AC_MODES))]
    f8_names = sp.float8 or runs.keep("float8", ["none", "tensorwise", "rowwise"] + (["mxfp8"] if hw.mx_formats else []))
    f8_codes = [FLOAT8_RECIPES.index(f) for f in f8_names]
    comp = [int(c) for c in (sp.compile if sp.compile is not None else runs.keep("compile", [False, True]))]
    mbs_all = sp.micro_batch_size or [1, 2, 4, 8, 16]

    rows = []
    tol = max(float(sp.batch_tolerance), 0.0)
    for dr, ds, cp, tp, pp, ep in structural:
        # micro-batches up to the local batch (at the most the tolerance allows)
        local = int(global_batch * (1 + tol)) // (dr * ds)
        mbs_opts = [m for m in mbs_all if m <= max(local, 1)] or [1]
        scheds = sched_opts if pp > 1 else [(PP_SCHEDULES.index("1F1B"), 1)]
        atps = [int(a) for a in (sp.async_tp if sp.async_tp is not None else runs.keep("async_tp", [False, True]))
                ] if tp > 1 else [0]
        # CPU offload is FSDP's alone: for fine-tuning it is a second option where no other dimension shards
        # (pre-training searches it only when pinned: --cpu-offload on)
        fsdp_only = tp == 1 and pp == 1 and ep == 1 and sp.finetune != "none" and runs.cpu_offload
        offs = [int(o) for o in sp.cpu_offload] if sp.cpu_offload is not None else ([0, 1] if fsdp_only else [0])
        for (sc, v), mb in itertools.product(scheds, mbs_opts):
            gb = nearest_batch(global_batch, dr * ds, mb, pp, bool(looped(sc)), tol)
            rows.append((dr, ds, cp, tp, pp, v, sc, mb, atps, ep, offs, gb))
    # cross the per-structure rows with AC x float8 x compile (x async TP, x CPU offload) in numpy
    base = []
    for dr, ds, cp, tp, pp, v, sc, mb, atps, ep, offs, gb in rows:
        for a, off in itertools.product(atps, offs):
            base.append((dr, ds, cp, tp, pp, v, sc, mb, a, ep, off, gb))
    if not base:
        base = [(1, world, 1, 1, 1, 1, 1, 1, 0, 1, 0, global_batch)]
    b = np.asarray(base, dtype=np.int64)
    knobs = np.asarray(list(itertools.product(ac_codes, f8_codes, comp)), dtype=np.int64)
    nb, nk = len(b), len(knobs)
    bi = np.repeat(np.arange(nb), nk)
    ki = np.tile(np.arange(nk), nb)
    n = nb * nk
    col = lambda j: b[bi, j]  # noqa: E731
    arrays = ConfigArrays(
        dp_replicate=col(0), dp_shard=col(1), cp=col(2), tp=col(3), pp=col(4), vpp=col(5), schedule=col(6),
        micro_batch=col(7), async_tp=col(8), ac=knobs[ki, 0], float8=knobs[ki, 1], compile=knobs[ki, 2],
        seq_len=np.full(n, seq_len, dtype=np.int64), global_batch=col(11),
        gpus_per_node=np.full(n, gpus_per_node, dtype=np.int64), ep=col(9), cpu_offload=col(10),
        finetune=np.full(n, FINETUNE_MODES.index(sp.finetune), dtype=np.int64),
        lora_rank=np.full(n, sp.lora_rank, dtype=np.int64),
        lora_targets=np.full(n, lora_mask(sp.lora_targets), dtype=np.int64),
        bf16_state=np.full(n, sp.dtype == "bfloat16", dtype=np.int64),
        reshard=np.full(n, RESHARD_POLICIES.index(sp.fsdp_reshard_after_forward), dtype=np.int64),
        # the search's dispatch backend where EP runs; a layout without EP has no experts' tokens to send
        ep_backend=np.where(col(9) > 1, EP_COMM_BACKENDS.index(sp.expert_parallel_comm_backend), 0).astype(np.int64),
        documents=np.full(n, sp.document_tokens or 0, dtype=np.int64),
    )
    return arrays, rule_reasons(model, hw, arrays, sp.allow_tp_across_nodes)


def even_split_variants(model: ModelSpec, c: ConfigArrays, idx: np.ndarray) -> ConfigArrays:
    """The configurations at `idx` whose pipeline torchtitan's default split leaves a rank with more blocks than
    the others, with both split weights 0 instead (the first and last stage as heavy as the rest)."""
    sub = c.take(idx)
    keep = (sub.pp > 1) & (sub.pp_first_stage_less_layers == DEFAULT_LESS) \
        & (sub.pp_last_stage_less_layers == DEFAULT_LESS) & uneven(model.layers, sub.pp, sub.vpp)
    variants = sub.take(keep)
    for f in LESS_FIELDS:
        setattr(variants, f, np.zeros_like(getattr(variants, f)))
    return variants


def rule_reasons(model: ModelSpec, hw: HardwareProfile, c: ConfigArrays, allow_tp_across_nodes: bool) -> np.ndarray:
    """Reason code per configuration for the first rule it breaks (0: none), in `estimator.rules` order."""
    return rules.violations(model, c, hw, policies=not allow_tp_across_nodes, planner=True)


def describe_reason(code: int, model: ModelSpec, hw: HardwareProfile, cfg: dict, extra: dict | None = None) -> str:
    """Human text for one configuration's reason code."""
    if code == 0:
        return ""
    values = rules.values(model, hw, cfg)
    values.update(extra or {})
    return REASONS[code].format(**values)
