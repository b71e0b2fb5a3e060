"""Stack profiles: how a training framework behaves (overlap, buffers, fusion), kept in `data/stacks/*.yaml`.

A stack profile describes a framework's behaviour (torchtitan's FSDP2 vs llm-foundry's FSDP1), never
individual runs. Every constant carries a comment in its YAML on where it comes from.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from meshplan.estimator import data_files
from meshplan.estimator.config import (
    AC_MODES,
    FINETUNE_MODES,
    FLOAT8_RECIPES,
    LOOPED_SCHEDULES,
    PP_SCHEDULES,
    ACMode,
    PPSchedule,
)
from meshplan.estimator.errors import MeshplanError


class Float8Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gemm_factor: float = Field(gt=0, le=1, description="scaled-GEMM throughput / plain fp8 GEMM throughput")
    cast_bytes_per_element: float = Field(ge=0, description="HBM bytes per activation element for scale+cast")
    fp8_all_gather: bool = Field(description="FSDP all-gathers weights in fp8 (1 byte) instead of bf16")


class DeepEPBehaviour(BaseModel):
    """DeepEP's normal (training) dispatch and combine kernels, or HybridEP's, as fractions of the links they run
    on; every field documented in the stack YAML."""

    model_config = ConfigDict(extra="forbid")

    nvlink_efficiency: float = Field(gt=0, le=1, description="DeepEP's NVLink bandwidth / the profile's achievable "
                                                             "ring bandwidth (intra_node_gbs x intra_node_efficiency)")
    rdma_efficiency: float = Field(gt=0, le=1.2, description="DeepEP's RDMA bandwidth per GPU / its NIC line rate "
                                                             "(inter_node_gbps / 8)")


class MoEBehaviour(BaseModel):
    """How a stack runs mixture-of-experts layers (token-choice top-k routing, dropless, expert parallelism by
    all-to-all dispatch and combine); every field documented in the stack YAML."""

    model_config = ConfigDict(extra="forbid")

    grouped_gemm_factor: float = Field(gt=0, le=1, description="grouped-GEMM throughput / dense GEMM of the "
                                                                "same total shape")
    all_to_all_efficiency: float = Field(gt=0, le=1, description="all-to-all bandwidth / ring-collective bandwidth")
    load_imbalance: float = Field(ge=1, description="routed rows on the busiest EP rank / the mean")
    sync_s_per_layer: float = Field(ge=0, description="device-to-host sync of the split sizes, per MoE layer "
                                                      "forward (seconds)")
    permute_passes: float = Field(ge=0, description="bf16 passes over the hidden width per routed row, fwd+bwd")
    router_passes: float = Field(ge=0, description="fp32 passes over the expert scores per routed token, fwd+bwd")
    selective_ac_saves_all_to_all: bool = Field(description="op-level SAC keeps the all-to-all outputs")
    recompute_fragmentation: float = Field(
        default=0.0, ge=0, description="extra reserved / allocated where activation checkpointing recomputes MoE "
        "layers: the reserved peak is the allocated peak x (1 + fragmentation) x (1 + this)")
    deepep: DeepEPBehaviour | None = Field(default=None, description="the stack's DeepEP backend "
                                           "(expert_parallel_comm_backend deepep); none: it has none")
    hybridep: DeepEPBehaviour | None = Field(default=None, description="the stack's HybridEP backend "
                                             "(expert_parallel_comm_backend hybridep); none: it has none")


class FineTuneBehaviour(BaseModel):
    """How a stack runs LoRA / QLoRA fine-tuning and FSDP2 CPU offload; every field documented in the stack YAML."""

    model_config = ConfigDict(extra="forbid")

    nf4_dequant_bytes_per_param: float = Field(gt=0, description="HBM bytes moved per NF4 parameter dequantized")
    cpu_optimizer_efficiency: float = Field(gt=0, le=1, description="CPU AdamW's share of the host DRAM bandwidth")


class ReplicatedState(BaseModel):
    """Bytes per parameter a rank keeps when no FSDP shards the model (data parallel by replicas, TP or PP alone, one
    device) in fp32 training dtype; every field documented in the stack YAML."""

    model_config = ConfigDict(extra="forbid")

    weights: float = Field(4.0, gt=0, description="the model's own weights (fp32 under autocast, bf16 when the model "
                                                  "is kept in bf16 beside an fp32 master copy)")
    weight_copies: float = Field(2.0, ge=0, description="bf16 copies autocast casts of the matmul weights")
    grads: float = Field(4.0, ge=0, description="gradients (or the fp32 buffer they accumulate into)")
    grad_buckets: float = Field(4.0, ge=0, description="a second copy of the gradients data parallel keeps for its "
                                                       "all-reduce (DDP's flat buckets), with replicas only")
    master: float = Field(0.0, ge=0, description="fp32 master weights the optimizer holds")
    optimizer: float = Field(8.0, ge=0, description="AdamW's moments")
    zero1: bool = Field(False, description="the master weights and optimizer state are sharded over the replicas "
                                           "(ZeRO-1)")


Float8Name = Literal["tensorwise", "rowwise", "mxfp8"]  # a Float8 recipe (config.Float8Recipe without none)
FineTuneName = Literal["full", "lora", "qlora"]  # a fine-tuning mode (config.FineTuneMode without none)


class FrameworkRuns(BaseModel):
    """What a framework can run, of the knobs meshplan models: `meshplan plan` searches only these under the profile,
    and `meshplan estimate` refuses the rest in one line (a list left out: every value meshplan models). Each
    profile's YAML says where in the framework's code it read them."""

    model_config = ConfigDict(extra="forbid")

    on_core: bool = Field(
        default=True, description="meshplan's training core (torchtitan's semantics) runs this profile's plans as "
        "estimated: the torchtitan exports and `meshplan launch` take them; false for another framework's profile, "
        "whose plans they refuse")
    pp_schedules: list[PPSchedule] | None = Field(
        default=None, description="pipeline schedules (empty: no pipeline parallelism)")
    ac: list[ACMode] | None = Field(default=None, description="activation checkpointing")
    float8: list[Float8Name] | None = Field(
        default=None, description="Float8 recipes (torchao's names; empty: none)")
    compile: bool = Field(default=True, description="torch.compile of the blocks (or the whole model)")
    tp: bool = Field(default=True, description="tensor parallelism")
    cp: bool = Field(default=True, description="context parallelism")
    async_tp: bool = Field(default=True, description="async TP as meshplan models it (TP collectives overlapped "
                                                     "with the linears' GEMMs)")
    ep: bool = Field(default=True, description="expert parallelism (mixture-of-experts models)")
    cpu_offload: bool = Field(default=True, description="FSDP's CPU offload of parameters, gradients and optimizer "
                                                        "state")
    finetune: list[FineTuneName] | None = Field(
        default=None, description="fine-tuning modes beside pre-training (empty: pre-training only)")

    def schedules(self) -> tuple[str, ...]:
        return PP_SCHEDULES if self.pp_schedules is None else tuple(self.pp_schedules)

    def ac_modes(self) -> tuple[str, ...]:
        return AC_MODES if self.ac is None else tuple(self.ac)

    def float8_recipes(self) -> tuple[str, ...]:
        """The recipes it runs, "none" first (always)."""
        return ("none", *(tuple(f for f in FLOAT8_RECIPES if f != "none") if self.float8 is None else self.float8))

    def finetune_modes(self) -> tuple[str, ...]:
        """The fine-tuning modes, "none" (pre-training) first (always)."""
        return ("none", *(tuple(f for f in FINETUNE_MODES if f != "none") if self.finetune is None else self.finetune))

    def allowed(self, knob: str) -> tuple | None:
        """The values of configuration knob `knob` (TrainConfig's and SearchSpace's names: tp, pp, cp, ep, vpp,
        pp_schedule, ac, float8, compile, async_tp, cpu_offload, finetune) the framework runs; None: any. A
        parallelism it lacks keeps degree 1 alone, a feature it lacks off alone."""
        degrees = {"tp": self.tp, "cp": self.cp, "ep": self.ep, "pp": bool(self.schedules()),
                   "vpp": any(s in LOOPED_SCHEDULES for s in self.schedules())}
        if knob in degrees:
            return None if degrees[knob] else (1,)
        features = {"compile": self.compile, "async_tp": self.async_tp, "cpu_offload": self.cpu_offload}
        if knob in features:
            return None if features[knob] else (False,)
        return {"pp_schedule": self.schedules(), "ac": self.ac_modes(), "float8": self.float8_recipes(),
                "finetune": self.finetune_modes()}[knob]

    def keep(self, knob: str, values: list) -> list:
        """`values` of `knob` the framework runs, in their order."""
        allowed = self.allowed(knob)
        return list(values) if allowed is None else [v for v in values if v in allowed]


class StackProfile(BaseModel):
    """Behaviour of a training stack that the estimator needs; all fields documented in the YAML."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    family: str | None = Field(
        default=None, description="framework this profile is a release of (validate's `framework` column)"
    )
    until: str | None = Field(
        default=None, pattern=r"^20\d\d-(0[1-9]|1[0-2])$",
        description="YYYY-MM: last month of runs this (older) release describes; none for the current release",
    )
    fsdp: Literal["fsdp2", "fsdp1", "none"] = Field(
        description="the framework's FSDP (none: data parallelism is replicas only, DDP or ZeRO-1: validate reads a "
                    "row's dp_shard as replicas)")
    default_compile: bool
    reshard_after_forward: bool
    tp_shards_embedding: bool = Field(
        default=True,
        description="TP shards the token embedding over its ranks (torchtitan's RowwiseParallel); false: every TP "
                    "rank holds the whole embedding",
    )
    compile_whole_model: bool = Field(
        default=False,
        description="compile wraps the whole model in one graph (torch.compile(model)), not each block: where no FSDP "
                    "hook breaks it, the compiled backward returns every gradient at once, so under gradient "
                    "accumulation a second copy of the rank's gradients is live at the end of each backward after the "
                    "first (AccumulateGrad adds them then)",
    )
    pp_reshard_after_forward: bool = Field(
        default=False,
        description="with PP, FSDP2 frees a block's gathered parameters after its forward (all-gathers again in its "
                    "backward and for every microbatch) instead of keeping the stage's for the step",
    )
    grad_sync_every_microbatch: bool
    replicate_sync_every_microbatch: bool | None = Field(
        default=None,
        description="DDP without FSDP under gradient accumulation: all-reduce after every microbatch's backward "
                    "(true) or the last one's only (false: no_sync before it); none: grad_sync_every_microbatch",
    )
    prefetch_blocks: int = Field(ge=1)
    reduce_bytes: float = Field(gt=0, description="bytes per gradient element in reduce-scatter")
    loss_parallel: bool
    repeat_kv: bool = Field(description="K/V expanded to all query heads before attention (GQA)")
    logits_bytes_per_element: float = Field(gt=0)
    loss_parallel_bytes_per_element: float = Field(gt=0)
    compiled_loss_bytes_per_element: float | None = Field(
        default=None, gt=0,
        description="logits bytes per element when compile also compiles the (non-parallel) loss; none: never",
    )
    loss_saved_bytes_per_element: float = Field(
        default=4.0, ge=0,
        description="bytes per logit element the loss keeps from its forward to its backward (an eager cross-entropy: "
        "its fp32 log-softmax; vocab-sharded under loss parallelism): what a pipeline's last stage holds for each "
        "microbatch whose backward has not run (GPipe: all of them)")
    compiled_loss_saved_bytes_per_element: float = Field(
        default=2.0, ge=0,
        description="the same for a compiled (non-parallel) loss, which saves its bf16 input and a log-sum-exp per row")
    fragmentation: float = Field(ge=0, description="reserved / allocated - 1 of the caching allocator")
    fragmentation_one_stream: float | None = Field(
        default=None, ge=0,
        description="reserved / allocated - 1 where no collective allocates per-step buffers on a side stream (one "
                    "GPU or DDP: no FSDP, TP, CP, EP or pipeline); none: `fragmentation`",
    )
    compile_activation_factor: float = Field(gt=0, le=1)
    compile_elementwise_factor: float = Field(gt=0, le=1)
    compile_overhead_factor: float = Field(gt=0, le=1)
    elementwise_passes: float = Field(ge=0, description="bf16 passes over (h + F) per token per layer")
    launch_overhead_s_per_layer: float = Field(ge=0, description="CPU seconds to launch one block's kernels per "
                                              "microbatch, fwd+bwd, eager; exposed only beyond the GPU's work")
    fsdp_overhead_s_per_layer: float = Field(default=0.0, ge=0, description="seconds per block per microbatch, "
                                             "fwd+bwd, that runs with FSDP add beyond compute and exposed collectives")
    selective_ac_eager_launch_factor: float = Field(
        default=1.0, ge=1.0, description="the CPU's launch time a block under op-level selective AC in eager mode, "
        "over `launch_overhead_s_per_layer`: the checkpoint's policy sees every op of the forward and its recompute "
        "in Python (1: no such policy)")
    fsdp_one_rank_hooks_s_per_layer: float = Field(
        default=0.0, ge=0, description="CPU seconds per block per microbatch, fwd+bwd, of FSDP2's hooks where it wraps "
        "a mesh of one shard (`fsdp_every_layout`): exposed, as the kernel launches are, only beyond the GPU's work "
        "(where FSDP shards, `fsdp_overhead_s_per_layer` stands for them)")
    fsdp_overhead_calibrated_share: float | None = Field(
        default=None, ge=0, lt=1,
        description="the largest share of a step `fsdp_overhead_s_per_layer` takes in the runs it was fitted to; "
                    "beyond it an estimate extrapolates (warned, its interval widened); none: not fitted")
    sdpa_backend: Literal["flash", "cudnn"] = Field(
        default="flash", description="the attention kernel SDPA runs: flash (FlashAttention-2, the hardware profile's "
                                     "`attention`) or cudnn (cuDNN's fused attention, its `attention_cudnn` where the "
                                     "profile has one)")
    attention_kernel: Literal["sdpa", "flex"] = Field(
        default="sdpa", description="the attention its language models call: sdpa (F.scaled_dot_product_attention, "
                                    "the kernel `sdpa_backend` names) or flex (FlexAttention, a Triton kernel)")
    flex_attention_factor: float = Field(
        default=0.87, gt=0, le=1.5, description="FlexAttention's fwd+bwd throughput / FlashAttention-2's on the same "
                                                "causal shape (the hardware profile's `attention`)")
    step_overhead_s: float = Field(ge=0, description="seconds a step spends beyond its kernels' work: the optimizer "
                                   "phase's launches, the loss read back for logging")
    dtensor_optimizer_s_per_layer: float = Field(
        default=0.0, ge=0, description="CPU seconds a block adds to the optimizer phase where its parameters are "
                                       "DTensors (FSDP2, TP): the gradient clip's and AdamW's dispatch per tensor")
    optimizer_implementation: Literal["fused", "foreach", "for-loop"] = Field(
        default="fused",
        description="torch AdamW's kernels (torchtitan's optimizer.implementation): foreach materialises one "
                    "moment-sized temporary over every parameter in the step (sqrt of exp_avg_sq); fused and "
                    "for-loop none worth counting")
    fsdp_overlap: float = Field(ge=0, le=1)
    fsdp_copy_bytes_per_param: float = Field(
        default=0.0, ge=0, description="HBM bytes per gathered parameter FSDP copies out of each all-gather on the "
                                       "compute stream (FSDP2: read + write of bf16 = 4; FSDP1's flat views: 0)")
    comm_compute_slowdown: float = Field(ge=0)
    tp_overlap: float = Field(ge=0, le=1)
    sp_copy_bytes_per_element: float = Field(
        default=0.0, ge=0,
        description="HBM bytes per activation element each sequence-parallel collective copies on the compute "
                    "stream (DTensor Shard(1): funcol's chunk + cat, a bf16 read + write = 4; 0: none)")
    tp_sequence_parallel_off_for: list[Literal["pipeline", "tied_embeddings", "moe"]] = Field(
        default_factory=list,
        description="where the stack's TP runs without sequence parallelism and without sharding the output head: "
                    "on pipeline stages, for models with tied embeddings, for MoE models (KempnerForge: all three). "
                    "There a TP rank runs its norms and residuals on the whole sequence, all-reduces each block's "
                    "outputs and holds the whole output head")
    tp_gathered_qk_bytes_per_element: tuple[float, float] | None = Field(
        default=None,
        description="a TP plan that all-gathers the query and key heads after QK-norm (torchtitan's Qwen3 plan of "
                    "Aug-Oct 2025: NoParallel(use_local_output=False) on q_norm / k_norm): the HBM bytes per query "
                    "or key element (forward, backward) every TP rank then moves in RoPE and repeat_kv on all heads, "
                    "where a sharded plan moves 1/tp of them; none: the plan keeps the heads sharded")
    async_tp_overlap: float = Field(ge=0, le=1)
    async_tp_gemm_factor: float = Field(gt=0, le=1)
    pp_overhead_s_per_microbatch: float = Field(ge=0, description="schedule + P2P wait per stage per microbatch")
    pp_p2p_exposed: float = Field(ge=0, le=1, description="share of the stage-to-stage transfer time not hidden")
    pp_p2p_overlap: Literal["none", "interleaved"] = Field(
        default="none",
        description="where the schedule posts each chunk's sends and receives before computing it and waits only "
                    "on the stream (Megatron-Core's overlap_p2p_comm, on for interleaved schedules): there a chunk's "
                    "transfers and schedule step hide behind its compute and only what outlasts it shows; none: "
                    "pp_p2p_exposed and pp_overhead_s_per_microbatch hold for every schedule")
    pp_split: Literal["torchtitan", "cost_balanced"] = Field(
        default="torchtitan",
        description="how a pipeline splits the blocks over its stages: torchtitan (the embedding and the output count "
                    "as pp_first / pp_last_stage_less_layers blocks, the layers split evenly, physics/stages.py), "
                    "cost_balanced (nanotron: the blocks walked in order by compute cost, the output head costing "
                    "vocab x hidden against a block's 4 hidden^2 + 3 ffn x hidden, a stage closing once the running "
                    "cost passes its share; schedules without virtual stages only)")
    pp_receive_buffers: Literal["every_microbatch", "in_flight"] = Field(
        default="every_microbatch",
        description="which stage-to-stage receive buffers a pipeline stage holds: every_microbatch (torch.distributed."
                    "pipelining's PipelineStage allocates one activation and one gradient buffer per microbatch of the "
                    "step and keeps them until it ends: torchtitan), in_flight (the schedule allocates each receive "
                    "when it posts it: nanotron's and Megatron-Core's P2P; only the microbatches in flight hold one)")
    dp_replicate_overlap_share: float = Field(
        ge=0, le=1, description="the DP-replicate all-reduce hides behind this share of fsdp_overlap"
    )
    loss_passes: float = Field(ge=0, description="fp32 passes over the logits per token in the loss, fwd+bwd")
    eager_float8_cast_factor: float = Field(
        ge=1, description="Float8 cast traffic without compile / with it (unfused amax, scale and cast)"
    )
    cp_overlap: float = Field(ge=0, le=1)
    cp_attention_penalty: float = Field(ge=0, description="attention slowdown per extra CP rank")
    attention_factor: float = Field(gt=0, le=1.5, description="attention kernel vs flash-attention 2")
    gemm_efficiency: float = Field(gt=0, le=1, description="model-shape GEMM throughput / best-shape (MAMF)")
    gemm_half_gflop: float = Field(gt=0, description="GEMM size (GFLOP) at which efficiency halves")
    gemm_half_dim: float = Field(gt=0, description="narrowest GEMM dimension at which efficiency halves")
    process_host_gib: float = Field(ge=0, description="host RAM per training process, GiB")
    mixed_precision_needs_fsdp: bool = Field(
        default=False, description="TP or PP without FSDP/HSDP/CP trains in fp32 (torchtitan's maybe_enable_amp)")
    ddp_runs_alone: bool = Field(
        default=False, description="DDP (dp_replicate without FSDP) runs only as the whole mesh, never beside TP or PP "
        "(torchtitan's parallelize before fsdp_every_layout: 'DDP has not supported > 1D parallelism')")
    fsdp_every_layout: bool = Field(
        default=False, description="FSDP2 wraps the model on every layout, on a mesh of one shard where dp_shard x cp "
        "is 1 (one GPU, DDP-style dp_replicate, TP or PP alone): its MixedPrecisionPolicy trains them in bf16, no "
        "autocast, no fp32 compute (torchtitan since 2026-04-09, 0.3.0)")
    splits_tied_embeddings: bool = Field(
        default=False, description="TP and PP split a model whose embedding and output share weights (Megatron, "
        "nanotron: vocab-parallel, a copy on the first and last stage); torchtitan cannot")
    stage_counts_like_torchtitan: bool = Field(
        default=True, description="only the stage counts torchtitan's pipeline_parallel_layers_per_stage can give "
        "run (false: the framework splits any pp x vpp its layers fill, Megatron-LM's virtual stages)")
    pads_vocab: bool = Field(
        default=False, description="the vocabulary is padded to a multiple of tp (Megatron-LM's "
        "make_vocab_size_divisible_by x tp, nanotron's _vocab_size_with_padding); torchtitan refuses a tp that does "
        "not divide it")
    async_tp_needs_compile: bool = Field(
        default=True, description="async TP is a torch.compile pass (torchtitan's micro-pipeline TP); false where the "
        "framework's own TP linears overlap their collectives (nanotron, Megatron-LM)")
    replicated_state: ReplicatedState = Field(
        default_factory=ReplicatedState, description="what a rank keeps without FSDP (DDP, TP or PP alone)")
    float8: dict[str, Float8Recipe]
    runs: FrameworkRuns = Field(
        default_factory=FrameworkRuns, description="the knobs' values the framework runs (none given: all)")
    moe: MoEBehaviour | None = Field(default=None, description="mixture-of-experts behaviour; none: dense only")
    finetune: FineTuneBehaviour | None = Field(default=None, description="LoRA / QLoRA / CPU offload behaviour")
    error_table: str | None = Field(
        default=None,
        description="the table of data/accuracy/intervals.yaml whose error its estimates' 80 % intervals take (none: "
                    "the framework's its id names, else all)")
    sources: dict[str, str] = Field(default_factory=dict)

    @property
    def ddp_sync_every_microbatch(self) -> bool:
        """Whether DDP without FSDP all-reduces after every microbatch's backward under gradient accumulation."""
        if self.replicate_sync_every_microbatch is None:
            return self.grad_sync_every_microbatch
        return self.replicate_sync_every_microbatch

    def attention_of(self, kernel: str = "default") -> str:
        """The attention a job calls: its configuration's `kernel` (sdpa, flex), or this stack's for "default"."""
        return self.attention_kernel if kernel == "default" else kernel


def stack_names() -> list[str]:
    return data_files.names("stacks")


def load_stack(name_or_path: str) -> StackProfile:
    """A built-in stack id (`torchtitan`, `llm-foundry`, ...) or a path to a stack YAML.

    A YAML may start with `extends: <stack id or path>` and list only what differs from that profile (an
    older release of the same framework, say)."""
    return data_files.load_named("stacks", name_or_path, StackProfile, "stack profile", prepare=_extends)


_EXTENDING: set[str] = set()  # profiles whose `extends:` chain is being resolved (a cycle is an error)


@cache
def _builtin(name: str) -> StackProfile:
    """Profiles read once (release lookup and `extends:` bases); callers must not mutate them."""
    if name in _EXTENDING:
        raise MeshplanError(f"stack profile '{name}' extends itself (through 'extends:'); break the cycle")
    _EXTENDING.add(name)
    try:
        return load_stack(name)
    finally:
        _EXTENDING.discard(name)


def _extends(raw: dict, path: Path) -> dict:
    """The YAML mapping with the profile it `extends:` filled in underneath (float8, moe, sources and runs merged); a
    relative path there is read from `path`'s folder first (the file that extends it), then from the current one."""
    base_id = raw.pop("extends", None)
    if base_id is None:
        return raw
    if not isinstance(base_id, str) or base_id == raw.get("id"):
        raise MeshplanError(f"stack profile {path.name}: 'extends' must name another stack profile")
    base_id = data_files.beside(base_id, path)  # a relative path from the extending file's folder
    base = _builtin(base_id).model_dump()
    base.update(family=base.get("family") or base["id"], until=None)
    return data_files.over_base(raw, base, ("float8", "moe", "sources", "runs"))


_SOURCE_MONTH = re.compile(r"(?<!\d)(20\d\d)[-_]?(0[1-9]|1[0-2])(?!\d)")
_ARXIV_ID = re.compile(r"(?i)arxiv(?:\.org)?[: /]*(?:abs/|pdf/)?(\d\d)(0[1-9]|1[0-2])\.\d{4,5}")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_NAME = re.compile(r"(?i)\b(" + "|".join(_MONTHS) + r")[a-z]*\.?\s+(20\d\d)\b")


def source_month(source: str) -> str | None:
    """The YYYY-MM a source names for its run: a dated file or text (`llama3_h100_202412_torchtitan.md`,
    `2025-06`), an arXiv id (`arXiv:2410.06511` -> 2024-10) or a month name (`Dec 2024`); None if none."""
    source = source or ""
    if m := _SOURCE_MONTH.search(source):
        return f"{m.group(1)}-{m.group(2)}"
    if m := _ARXIV_ID.search(source):
        return f"20{m.group(1)}-{m.group(2)}"
    if m := _MONTH_NAME.search(source):
        return f"{m.group(2)}-{_MONTHS.index(m.group(1).lower()[:3]) + 1:02d}"
    return None


def stack_for_run(framework: str, month: str | None) -> str:
    """The stack profile id of `framework`'s release that ran a job dated `month` (YYYY-MM): the oldest
    release whose `until` is not before it; the current release when the date is unknown or later."""
    if month is None:
        return framework
    older = [
        s for s in (_builtin(n) for n in stack_names())
        if s.family == framework and s.until is not None and month <= s.until
    ]
    return min(older, key=lambda s: s.until).id if older else framework
