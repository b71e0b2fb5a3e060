"""The one set of rules a parallel configuration must pass: the contract between the estimator, the planner's
search, the plan file and the training core (`launcher.core.config.RunConfig`), like torchtitan's
`ParallelDims` validation in one place.

A rule is a predicate over a :class:`~meshplan.estimator.arrays.ConfigArrays` (so the planner checks 10^5 configurations
in one pass and a single configuration is the length-1 case) with a message about the user's inputs. A
configuration the planner ranks therefore passes every check the core and the exported torchtitan job make.

Rules whose `needs_hw` is set look at the hardware profile (Float8 tensor cores, MX formats); the training
core, which has no profile, skips them and checks the device it really runs on instead.

Not every rule is about validity. Some configurations frameworks do run, only poorly or not with every schedule
(fewer pipeline microbatches than stages: torchtitan warns and runs GPipe and Interleaved1F1B, torch's
Schedule1F1B refuses). The estimator predicts those (`predicted`: the estimate carries the rule's message as a
warning and the bubble shows the cost); a `ranking` rule is one only the planner applies (a plan file and the
core accept it), with its message as the reason the configuration is not ranked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.config import (
    ATTENTION_KERNELS,
    COMPILE_COMPONENTS,
    COMPILE_MODEL,
    EP_COMM_BACKENDS,
    FINETUNE_MODES,
    FLOAT8_RECIPES,
    LORA_TARGETS,
    PP_SCHEDULES,
    FineTune,
    Float8,
    Schedule,
    compile_mask,
    looped,
    lora_mask,
)
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.stages import DEFAULT_LESS, LESS_FIELDS, stage_share

ZERO_BUBBLE = int(Schedule.INTERLEAVED_ZERO_BUBBLE)
MXFP8 = int(Float8.MXFP8)


@dataclass(frozen=True)
class Rule:
    """One rule: `bad(model, c, hw)` marks the configurations that break it; `message` is formatted with the
    configuration's values (see :func:`values`)."""

    code: int
    key: str
    message: str
    bad: Callable[[ModelSpec, ConfigArrays, HardwareProfile | None], np.ndarray]
    needs_hw: bool = False
    policy: bool = False  # a search preference (not a validity rule): only the planner applies it
    predicted: bool = False  # the estimator predicts such configurations, warning with the message
    ranking: bool = False  # only the planner's ranking rejects it: plan files and the training core accept it


def _micro(c: ConfigArrays) -> tuple[np.ndarray, np.ndarray]:
    """(global batch divides into dp x micro-batch, microbatches per step; 0 where it does not divide)."""
    dp_mb = xp.maximum(c.dp_replicate * c.dp_shard * c.micro_batch, 1)
    divisible = c.global_batch % dp_mb == 0
    return divisible, xp.where(divisible, c.global_batch // dp_mb, 0)


def _pp_fill(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    divisible, micro = _micro(c)
    return (c.pp > 1) & divisible & (micro < c.pp)


def _one_f_one_b_fill(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    # torch.distributed.pipelining's Schedule1F1B raises when n_microbatches < its stages (torch 2.13,
    # schedules.py); GPipe runs any count and Interleaved1F1B takes one round of fewer than pp
    return _pp_fill(m, c, hw) & (c.schedule == int(Schedule.ONE_F_ONE_B))


def _interleaved_rounds(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    # torch.distributed.pipelining's ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble: microbatches in
    # whole rounds of max(1, n // pp)
    divisible, micro = _micro(c)
    rounds = xp.maximum(1, micro // xp.maximum(c.pp, 1))
    return looped(c.schedule) & (c.pp > 1) & divisible & (micro % rounds != 0)


def _tp_widths(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    bad = (m.heads % c.tp != 0) | (m.kv_heads % c.tp != 0) | (m.ffn_hidden % c.tp != 0)
    if m.moe is not None:  # the shared expert is TP-sharded, and the routed experts too when ep is 1
        bad = bad | (m.moe.shared_ffn_hidden % c.tp != 0) | ((c.ep == 1) & (m.moe.expert_ffn_hidden % c.tp != 0))
    return bad


def _ep_dense(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    return (c.ep > 1) & (m.moe is None)


def _ep_experts(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    return (c.ep > 1) & (m.moe is not None) & ((m.moe.experts if m.moe else 1) % xp.maximum(c.ep, 1) != 0)


def _ep_ranks(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    return (c.ep > 1) & ((c.dp_shard * c.cp * c.tp) % xp.maximum(c.ep, 1) != 0)


def titan_layers_per_stage(layers, stages, first_less=DEFAULT_LESS, last_less=DEFAULT_LESS):
    """torchtitan's `pipeline_parallel_layers_per_stage` for `stages` stages, and whether it gives exactly that many
    (ints or arrays). torchtitan splits layers + first_less + last_less (the embedding and the output count as that
    many layers) into ceil((layers + first_less + last_less) / layers_per_stage) stages; the smallest value giving
    at most `stages` is the candidate."""
    total = layers + first_less + last_less
    lps = -(-total // stages)
    return lps, -(-total // lps) == stages


def _less(c: ConfigArrays) -> tuple[np.ndarray, np.ndarray]:
    return c.pp_first_stage_less_layers, c.pp_last_stage_less_layers


def _torchtitan_stages(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    # without layers_per_stage torchtitan takes its default (2 stages per rank for a looped schedule, 1 otherwise);
    # any other stage count must be one it can split into
    default = xp.where(looped(c.schedule), 2, 1)
    _, exact = titan_layers_per_stage(m.layers, xp.maximum(c.pp * c.vpp, 1), *_less(c))
    return (c.pp > 1) & (c.vpp != default) & xp.logical_not(exact)


def _stages_exceed_layers(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    # torchtitan splits the layers + the embedding's and output's weights (generate_llm_fqn_per_model_part refuses
    # more stages than those layer units), Megatron-LM the same with account_for_embedding / loss_in_pipeline_split:
    # a first stage of the embedding alone and a last of the norm and output alone run
    first, last = _less(c)
    return c.pp * c.vpp > m.layers + xp.maximum(first, 0) + xp.maximum(last, 0)


def _stage_less(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    # torchtitan refuses a weight above the smallest stage's share; a negative one means nothing anywhere
    first, last = _less(c)
    share = stage_share(m.layers, c.pp * c.vpp, first, last)
    return (first < 0) | (last < 0) | ((c.pp > 1) & ((first > share) | (last > share)))


NF4_BLOCK = 64 * 256  # torchao's to_nf4: 64-value blocks whose scales are quantized in groups of 256


def _lora(c: ConfigArrays) -> np.ndarray:
    return c.finetune >= int(FineTune.LORA)


def _lora_moe(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    return _lora(c) & ((m.moe is not None) | (m.mla is not None))


def _nf4_blocks(m: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None) -> np.ndarray:
    """QLoRA: every linear's FSDP shard (rows split over dp_shard x cp) must be whole NF4 blocks."""
    from meshplan.estimator.physics.finetune import linear_shapes

    if m.moe is not None or m.mla is not None:
        return xp.zeros_like(c.tp, dtype=np.bool_)
    shard = xp.maximum(c.dp_shard * c.cp, 1)
    bad = xp.zeros_like(c.tp, dtype=np.bool_)
    for k, n in linear_shapes(m).values():
        rows, cols = int(n), int(k)
        bad |= (rows % shard != 0) | ((rows // shard) * cols % NF4_BLOCK != 0)
    return (c.finetune == int(FineTune.QLORA)) & bad


RULES: tuple[Rule, ...] = (
    Rule(1, "tp_heads", "tp {tp} does not divide the {heads} attention heads, {kv_heads} KV heads and "
         "MLP width{mlp_widths}", _tp_widths),
    Rule(2, "tp_across_nodes", "tp {tp} spans nodes: NVLink joins {scale_up_gpus} GPUs (TP traffic would cross the "
         "network)", lambda m, c, hw: c.tp > (hw.scale_up_gpus(c.gpus_per_node) if hw is not None
                                              else c.gpus_per_node), policy=True),
    Rule(3, "pp_layers", "pp {pp} x vpp {vpp} = {stages} stages exceed the {layers} layers + {layer_units_extra} for "
         "the embedding and output (each stage needs one)", _stages_exceed_layers),
    Rule(31, "pp_stage_less", "{stage_less}", _stage_less),
    Rule(4, "pp_microbatches", "{microbatches} microbatches per step < pp {pp}: the pipeline cannot fill (each "
         "stage idles for pp - 1 of pp + microbatches - 1 microbatch times)", _pp_fill, predicted=True, ranking=True),
    Rule(28, "pp_1f1b_fill", "{microbatches} microbatches per step < pp {pp}: torch's Schedule1F1B refuses fewer "
         "microbatches than stages (GPipe and the looped schedules run them)", _one_f_one_b_fill, predicted=True),
    Rule(5, "cp_seq", "cp {cp} does not divide seq_len {seq_len} into 2*cp load-balanced chunks",
         lambda m, c, hw: (c.cp > 1) & (c.seq_len % (2 * c.cp) != 0)),
    Rule(6, "batch_divides", "global batch {global_batch} does not divide into dp {dp} x micro-batch {micro_batch}",
         lambda m, c, hw: xp.logical_not(_micro(c)[0])),
    Rule(7, "float8_unsupported", "float8 needs fp8 tensor cores; {hardware} has none",
         lambda m, c, hw: (c.float8 != int(Float8.NONE)) & (not hw.supports_fp8), needs_hw=True),
    Rule(8, "mxfp8_unsupported", "mxfp8 needs MX formats (Blackwell); {hardware} lacks them",
         lambda m, c, hw: (c.float8 == MXFP8) & (not hw.mx_formats), needs_hw=True),
    Rule(33, "deepep_unsupported", "expert_parallel_comm_backend {ep_comm_backend} needs NVIDIA GPUs (DeepEP's and "
         "HybridEP's kernels use NVLink and RDMA from the GPU); {hardware} is {vendor}: use standard",
         lambda m, c, hw: (c.ep_backend >= 1) & (hw.vendor != "nvidia"), needs_hw=True),
    Rule(34, "deepep_without_ep", "expert_parallel_comm_backend {ep_comm_backend} dispatches over expert "
         "parallelism, and ep is 1: set ep > 1 (torchtitan refuses it without EP) or use standard",
         lambda m, c, hw: (c.ep_backend >= 1) & (c.ep == 1) & (m.moe is not None)),
    Rule(35, "zero_bubble_compile", "InterleavedZeroBubble splits each backward into its input and weight "
         "gradients, which torch.compile'd blocks cannot (torch.distributed.pipelining refuses stages holding "
         "compiled modules): compile off, compile only the loss, or Interleaved1F1B",
         lambda m, c, hw: (c.schedule == ZERO_BUBBLE) & (c.pp > 1) & (c.compile > 0)
         & ((c.compile_components & COMPILE_MODEL) != 0)),
    Rule(10, "tp_vocab", "tp {tp} does not divide the vocabulary ({vocab}), which loss parallel shards",
         lambda m, c, hw: (c.tp > 1) & (m.vocab % c.tp != 0)),
    Rule(11, "seq_tp", "seq_len {seq_len} does not divide by cp x tp = {cp_tp} (sequence parallel shards it)",
         lambda m, c, hw: c.seq_len % (c.cp * c.tp) != 0),
    Rule(12, "tied_embeddings", "the model ties its input and output embeddings, which cannot be split by "
         "tp {tp} or pp {pp} (use tp 1 and pp 1)",
         lambda m, c, hw: ((c.tp > 1) | (c.pp > 1)) & bool(m.tied_embeddings)),
    Rule(14, "async_tp_tp1", "async TP needs tp > 1", lambda m, c, hw: (c.async_tp > 0) & (c.tp == 1)),
    Rule(13, "async_tp_compile", "async TP is a torch.compile pass: it needs compile on, with model "
         "in compile_components",
         lambda m, c, hw: (c.async_tp > 0) & ((c.compile == 0) | ((c.compile_components & COMPILE_MODEL) == 0))),
    Rule(15, "schedule_vpp", "pp schedule {pp_schedule} with vpp {vpp}: the looped schedules (Interleaved1F1B, "
         "InterleavedZeroBubble) take 2 or more stages per rank, the other schedules exactly 1",
         lambda m, c, hw: xp.where(looped(c.schedule), (c.pp > 1) & (c.vpp < 2), c.vpp != 1)),
    Rule(16, "interleaved_rounds", "{pp_schedule} runs microbatches in rounds of pp: {microbatches} microbatches"
         " is not a whole number of rounds for pp {pp}", _interleaved_rounds),
    Rule(17, "torchtitan_stages", "pp {pp} x vpp {vpp} = {stages} stages: torchtitan cannot split the {layers} "
         "layers (+ embedding and output) into that many stages", _torchtitan_stages),
    Rule(18, "ep_dense", "ep {ep}: expert parallelism needs a mixture-of-experts model; {model} is dense", _ep_dense),
    Rule(19, "ep_experts", "ep {ep} does not divide the {experts} routed experts", _ep_experts),
    Rule(20, "ep_ranks", "ep {ep} does not divide dp_shard x cp x tp = {sparse} (torchtitan carves the expert-parallel "
         "ranks from them)", _ep_ranks),
    Rule(21, "lora_layout", "{finetune} shards with FSDP only (as torchtune's recipes): use tp 1 and pp 1, not tp {tp}"
         " and pp {pp}", lambda m, c, hw: _lora(c) & ((c.tp > 1) | (c.pp > 1))),
    Rule(22, "lora_architecture", "{finetune} adapts dense attention and MLP linears; {model} has {arch}: fine-tune it "
         "with --finetune full", _lora_moe),
    Rule(23, "lora_float8", "{finetune} trains bf16 adapters beside frozen bf16 / NF4 weights, not Float8 linears: use "
         "float8 none", lambda m, c, hw: _lora(c) & (c.float8 != int(Float8.NONE))),
    Rule(24, "qlora_blocks", "QLoRA: an FSDP shard of {model}'s linears over dp_shard x cp = {shard} is not a whole "
         "number of torchao NF4 blocks of 64 x 256 values", _nf4_blocks),
    Rule(25, "offload_layout", "CPU offload (FSDP2's CPUOffloadPolicy) is planned and run with FSDP alone: use tp 1, "
         "pp 1 and ep 1, not tp {tp}, pp {pp}, ep {ep}",
         lambda m, c, hw: (c.cpu_offload > 0) & ((c.tp > 1) | (c.pp > 1) | (c.ep > 1))),
    Rule(27, "offload_fsdp", "CPU offload is FSDP2's: it needs dp_shard x cp > 1 (got {shard})",
         lambda m, c, hw: (c.cpu_offload > 0) & (c.dp_shard * c.cp < 2)),
    Rule(29, "fp32_without_fsdp", "tp {tp} x pp {pp} without FSDP (dp_shard x cp = 1): torchtitan 0.2.2 trains it "
         "in fp32 (mixed precision needs FSDP, HSDP or CP; TF32 stays off): use dp_shard >= 2, training dtype "
         "bfloat16, or --stack torchtitan (0.3.0 wraps FSDP2 with one shard and trains it in bf16)",
         lambda m, c, hw: ((c.tp > 1) | (c.pp > 1)) & (c.dp_shard * c.cp == 1) & (c.bf16_state == 0),
         predicted=True, ranking=True),
    Rule(32, "ddp_alone", "dp_replicate {dp_replicate} without FSDP (dp_shard x cp = 1) beside tp {tp} x pp {pp}: "
         "torchtitan 0.2.2's DDP runs only as the whole mesh (it raises 'DDP has not supported > 1D parallelism'): "
         "use dp_shard >= 2 (HSDP), or --stack torchtitan (0.3.0 wraps FSDP2 on it with one shard)",
         lambda m, c, hw: (c.dp_replicate > 1) & ((c.tp > 1) | (c.pp > 1)) & (c.dp_shard * c.cp == 1),
         predicted=True, ranking=True),
    Rule(26, "offload_float8", "CPU offload with Float8 is not supported (torchao's Float8 all-gather expects GPU "
         "shards): use float8 none", lambda m, c, hw: (c.cpu_offload > 0) & (c.float8 != int(Float8.NONE))),
)
MEMORY = 9  # the planner's own rule: the configuration does not fit in memory
HOST_MEMORY = 30  # the planner's own rule: the node's host RAM does not hold what the configuration keeps there
BY_CODE = {r.code: r for r in RULES}


def _applies(rule: Rule, hw: HardwareProfile | None, policies: bool, planner: bool, predict: bool) -> bool:
    return not ((rule.needs_hw and hw is None) or (rule.policy and not policies) or (rule.ranking and not planner)
                or (rule.predicted and predict))


def violations(
    model: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None, *, policies: bool = False, planner: bool = False,
    predict: bool = False, skip: frozenset[str] = frozenset(),
) -> np.ndarray:
    """Code of the first rule each configuration breaks (0: none), in RULES order: an array for arrays, an int for
    one configuration (:meth:`ConfigArrays.single`: the rules after the first it breaks are not evaluated).
    Hardware rules are skipped when `hw` is None; search policies (TP inside a node) only with `policies`; ranking
    rules only for the `planner`; rules whose configurations the estimator predicts are skipped with `predict`;
    rules whose key is in `skip` are skipped (:func:`stack_skips`)."""
    if not c.is_single:
        return _violations_of_arrays(model, c, hw, policies, planner, predict, skip)
    for rule in RULES:  # one configuration: the first rule it breaks, the others not evaluated
        if _applies(rule, hw, policies, planner, predict) and rule.key not in skip and rule.bad(model, c, hw):
            return rule.code
    return 0


def _violations_of_arrays(model: ModelSpec, c: ConfigArrays, hw: HardwareProfile | None, policies: bool,
                          planner: bool, predict: bool, skip: frozenset[str]) -> np.ndarray:
    reason = np.zeros(len(c), dtype=np.int64)
    for rule in RULES:
        if not _applies(rule, hw, policies, planner, predict) or rule.key in skip:
            continue
        reason = np.where((reason == 0) & rule.bad(model, c, hw), rule.code, reason)  # a scalar `bad` broadcasts
    return reason


def stack_skips(stack) -> frozenset[str]:
    """Keys of the rules that describe torchtitan's behaviour and do not hold for `stack` (a StackProfile): without
    FSDP a stack whose mixed precision does not need it (or that wraps FSDP2 on every layout) trains TP and PP in
    bf16, not fp32, and replicates beside them; a stack that splits tied embeddings runs a tied model with TP or
    PP; a stack whose TP linears overlap their own collectives runs async TP eager; a stack that pads the
    vocabulary runs any tp over it; a stack with its own virtual-stage split runs any pp x vpp its layers fill."""
    if stack is None:
        return frozenset()
    fp32_lifted = not stack.mixed_precision_needs_fsdp or stack.fsdp_every_layout
    return frozenset(key for key, lifted in (("fp32_without_fsdp", fp32_lifted),
                                             ("ddp_alone", not stack.ddp_runs_alone or stack.fsdp_every_layout),
                                             ("tied_embeddings", stack.splits_tied_embeddings),
                                             ("async_tp_compile", not stack.async_tp_needs_compile),
                                             ("tp_vocab", stack.pads_vocab),
                                             ("torchtitan_stages", not stack.stage_counts_like_torchtitan)) if lifted)


def plan_skips(stack) -> frozenset[str]:
    """The keys of :func:`stack_skips` the planner may lift too: only rules that plan files and the training core
    accept anyway (ranking or predicted ones), where the plans run on meshplan's core with torchtitan's semantics
    (which refuses, say, a tied embedding split by TP whatever framework was estimated). A profile whose plans are
    its own framework's (`runs.on_core` false: nanotron, Megatron-Core; the exports and launches refuse them) lifts
    them all, as `validate` does."""
    if stack is not None and not stack.runs.on_core:
        return stack_skips(stack)
    soft = {r.key for r in RULES if r.ranking or r.predicted}
    return stack_skips(stack) & soft


def values(model: ModelSpec, hw: HardwareProfile | None, cfg: dict) -> dict:
    """The fields rule messages are formatted with, from one configuration's torchtitan-named values."""
    out = dict(cfg)
    pp, vpp = cfg.get("pp", 1), cfg.get("vpp", 1) or 1
    dp = cfg.get("dp_replicate", 1) * cfg.get("dp_shard", 1)
    gb, mb = cfg.get("global_batch_size") or 0, cfg.get("micro_batch_size") or 1
    moe = model.moe
    widths = f" {model.ffn_hidden}"
    if moe is not None:
        widths = (f"s (dense {model.ffn_hidden}, expert {moe.expert_ffn_hidden}"
                  + (f", shared {moe.shared_ffn_hidden}" if moe.shared_ffn_hidden else "") + ")")
    out.update(
        heads=model.heads, kv_heads=model.kv_heads, ffn_hidden=model.ffn_hidden, layers=model.layers,
        vocab=model.vocab, hardware=hw.id if hw is not None else "this hardware", stages=pp * vpp, dp=dp,
        vendor=hw.vendor if hw is not None else "",
        ep_comm_backend=cfg.get("expert_parallel_comm_backend") or "standard",
        global_batch=gb, micro_batch=mb, cp_tp=cfg.get("cp", 1) * cfg.get("tp", 1), model=model.name,
        experts=moe.experts if moe else 0, mlp_widths=widths,
        sparse=cfg.get("dp_shard", 1) * cfg.get("cp", 1) * cfg.get("tp", 1),
        shard=cfg.get("dp_shard", 1) * cfg.get("cp", 1),
        arch="mixture-of-experts layers" if moe else "multi-head latent attention",
        finetune={"qlora": "QLoRA"}.get(cfg.get("finetune"), "LoRA"),
        scale_up_gpus=(hw.scale_up_gpus(cfg.get("gpus_per_node")) if hw is not None
                       else cfg.get("gpus_per_node") or 1),
    )
    out.update(_less_values(model, cfg, pp * vpp))
    out["layer_units_extra"] = sum(max(int(cfg.get(f, DEFAULT_LESS)), 0) for f in LESS_FIELDS)
    out.setdefault("ep", 1)
    out.setdefault("microbatches", gb // max(dp * mb, 1))
    return out


def _less_values(model: ModelSpec, cfg: dict, stages: int) -> dict:
    """`stage_less`: what is wrong with the pipeline split's weights, naming the first one at fault (the CLI turns
    the leading field name into its flag)."""
    first, last = (cfg.get(f, DEFAULT_LESS) for f in LESS_FIELDS)
    share = stage_share(model.layers, stages, first, last)
    for field, v in zip(LESS_FIELDS, (first, last), strict=True):
        if v < 0:
            return {"stage_less": f"{field} {v} is negative: it counts layers (0 or more)"}
        if v > share:
            return {"stage_less": f"{field} {v} exceeds {share}, the layers each of the {stages} stages gets at "
                                  f"least when torchtitan splits the {model.layers} layers + {first} + {last} over "
                                  "them (it refuses a larger weight)"}
    return {"stage_less": f"{LESS_FIELDS[0]} {first} and {LESS_FIELDS[1]} {last} are in range"}


def message(code: int, model: ModelSpec, hw: HardwareProfile | None, cfg: dict) -> str:
    """The text of rule `code` for one configuration (a dict of torchtitan-named values)."""
    return BY_CODE[code].message.format(**values(model, hw, cfg))


def arrays_of(cfg: dict) -> ConfigArrays:
    """One configuration's ConfigArrays (numpy scalars, :meth:`ConfigArrays.single`) from torchtitan-named values
    (pp_schedule, float8, ... as names)."""
    from meshplan.estimator.config import AC_MODES

    col = int

    return ConfigArrays(
        dp_replicate=col(cfg.get("dp_replicate", 1)), dp_shard=col(cfg.get("dp_shard", 1)), tp=col(cfg.get("tp", 1)),
        pp=col(cfg.get("pp", 1)), cp=col(cfg.get("cp", 1)), vpp=col(cfg.get("vpp") or 1),
        schedule=col(PP_SCHEDULES.index(cfg.get("pp_schedule", "1F1B"))), seq_len=col(cfg["seq_len"]),
        global_batch=col(cfg["global_batch_size"]), micro_batch=col(cfg.get("micro_batch_size", 1)),
        ac=col(AC_MODES.index(cfg.get("ac", "none"))), compile=col(bool(cfg.get("compile", False))),
        float8=col(FLOAT8_RECIPES.index(cfg.get("float8", "none"))), async_tp=col(bool(cfg.get("async_tp", False))),
        gpus_per_node=col(cfg.get("gpus_per_node") or 1), ep=col(cfg.get("ep", 1)),
        finetune=col(FINETUNE_MODES.index(cfg.get("finetune") or "none")), lora_rank=col(cfg.get("lora_rank") or 16),
        lora_targets=col(lora_mask(cfg.get("lora_targets") or LORA_TARGETS)),
        cpu_offload=col(bool(cfg.get("cpu_offload", False))), bf16_state=col(cfg.get("dtype") == "bfloat16"),
        ep_backend=col(EP_COMM_BACKENDS.index(cfg.get("expert_parallel_comm_backend") or "standard")),
        compile_components=col(compile_mask(cfg.get("compile_components") or COMPILE_COMPONENTS)),
        force_balance=col(bool(cfg.get("moe_force_load_balance", False))),
        a2a_overlap=col(bool(cfg.get("moe_a2a_overlap", False))),
        attention=col(ATTENTION_KERNELS.index(cfg.get("attention_kernel") or "default")),
        documents=col(cfg.get("document_tokens") or 0),
        **{f: col(cfg.get(f, DEFAULT_LESS)) for f in LESS_FIELDS},
    )


def check(model: ModelSpec, hw: HardwareProfile | None, cfg: dict, *, predict: bool = False,
          c: ConfigArrays | None = None, skip: frozenset[str] = frozenset()) -> str | None:
    """The first rule one configuration breaks, as a message; None when it passes every rule. Ranking rules are
    the planner's and not checked here; with `predict` (the estimator) neither are the rules of configurations
    frameworks run poorly (see :func:`predicted_warnings`). `c`: the same configuration as ConfigArrays, when the
    caller holds it (else built from `cfg`); `skip`: rule keys the stack lifts (:func:`stack_skips`)."""
    code = int(violations(model, c if c is not None else arrays_of(cfg), hw, predict=predict, skip=skip))
    return message(code, model, hw, cfg) if code else None


def predicted_warnings(model: ModelSpec, hw: HardwareProfile | None, cfg: dict,
                       c: ConfigArrays | None = None) -> list[tuple[str, str]]:
    """(rule key, message) of the rules one configuration breaks that the estimator still predicts (it runs,
    poorly, in fp32 or not with every schedule). `c`: the same configuration as ConfigArrays, when the caller
    holds it (else built from `cfg`)."""
    c = c if c is not None else arrays_of(cfg)
    return [(r.key, message(r.code, model, hw, cfg)) for r in RULES
            if r.predicted and _applies(r, hw, False, True, False) and bool(r.bad(model, c, hw))]
