"""One training configuration: parallel degrees (torchtitan's names), batch, AC, compile, Float8.

`TrainConfig.resolve()` checks it against a model and hardware profile and fills inferred fields
(`dp_shard = -1`, `vpp`, `gpus`), raising :class:`MeshplanError` with a one-line reason otherwise.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from meshplan.estimator.errors import ConfigError, InputError
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_SEQ_LEN, check_size
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.stages import DEFAULT_LESS, LESS_FIELDS

# The value types of the configuration, shared by TrainConfig, the plan file and the core's RunConfig; the
# tuples give each value its integer code in the estimator's arrays.
# torch.distributed.pipelining's schedules (torchtitan's parallelism.pipeline_parallel_schedule): GPipe, 1F1B and the
# looped ones, several stages per rank: Interleaved1F1B and InterleavedZeroBubble (ZB1P: each backward split into
# its input and weight gradients, the weight gradients filling the bubble)
PPSchedule = Literal["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"]
ACMode = Literal["none", "selective", "full"]
Float8Recipe = Literal["none", "tensorwise", "rowwise", "mxfp8"]
LRDecay = Literal["cosine", "linear", "constant"]
FineTuneMode = Literal["none", "full", "lora", "qlora"]
LoRATarget = Literal["q", "k", "v", "o", "w1", "w2", "w3"]
TrainingDtype = Literal["float32", "bfloat16"]
# torchtitan's parallelism.fsdp_reshard_after_forward: default (reshard without PP, keep a stage's parameters with
# PP), always, never (each block's gathered parameters stay until its backward: no second all-gather, more memory)
ReshardPolicy = Literal["default", "always", "never"]
# torchtitan's parallelism.expert_parallel_comm_backend (0.2.2; 0.3's model_registry moe_comm_backend): standard
# (all_to_all_single, one row per routed expert), deepep (DeepEP's kernels: a token once per destination rank,
# once per destination node over RDMA, forwarded over NVLink) or hybridep (NVIDIA's HybridEP, in DeepEP's hybrid-ep
# branch: the same two-level route with TMA copies, aware of multi-node NVLink domains; torchtitan 0.3)
EPCommBackend = Literal["standard", "deepep", "hybridep"]
# the attention kernel a job's language model calls: default (its stack's `attention_kernel`), sdpa
# (F.scaled_dot_product_attention: FlashAttention-2 or cuDNN's, the stack's `sdpa_backend`) or flex (FlexAttention,
# torchtitan's attn_backend "flex": a Triton kernel inductor autotunes)
AttentionKernel = Literal["default", "sdpa", "flex"]
# torchtitan's compile.components: what compile.enable compiles, each block of the model (per-block torch.compile)
# and the cross-entropy loss (build_cross_entropy_loss); torchtitan's default is both, some of its own configs
# (deepseek_v3_16b.toml in 2025) compile the loss only
CompileComponent = Literal["model", "loss"]
PP_SCHEDULES: tuple[str, ...] = get_args(PPSchedule)
# the looped schedules: vpp (2 by default, torchtitan's) stages per rank, microbatches in rounds of pp
LOOPED_SCHEDULES: tuple[str, ...] = ("Interleaved1F1B", "InterleavedZeroBubble")
AC_MODES: tuple[str, ...] = get_args(ACMode)
FLOAT8_RECIPES: tuple[str, ...] = get_args(Float8Recipe)
FINETUNE_MODES: tuple[str, ...] = get_args(FineTuneMode)
TRAINING_DTYPES: tuple[str, ...] = get_args(TrainingDtype)
RESHARD_POLICIES: tuple[str, ...] = get_args(ReshardPolicy)
EP_COMM_BACKENDS: tuple[str, ...] = get_args(EPCommBackend)
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
COMPILE_COMPONENTS: tuple[str, ...] = get_args(CompileComponent)
# compile.components as every model holding it keeps them: each once, in torchtitan's order (model, loss)
CompileComponents = Annotated[tuple[CompileComponent, ...],
                              AfterValidator(lambda v: tuple(t for t in COMPILE_COMPONENTS if t in v))]
# the linears LoRA can adapt: attention q / k / v / output (torchtune's q_proj, k_proj, v_proj, output_proj) and the
# MLP's w1 (gate), w2 (down), w3 (up); the default is every one of them
LORA_TARGETS: tuple[str, ...] = get_args(LoRATarget)


class Schedule(IntEnum):
    """Pipeline schedule as the estimator's arrays code it (index into PP_SCHEDULES)."""

    GPIPE = 0
    ONE_F_ONE_B = 1
    INTERLEAVED_1F1B = 2
    INTERLEAVED_ZERO_BUBBLE = 3


class AC(IntEnum):
    """Activation checkpointing mode as the estimator's arrays code it (index into AC_MODES)."""

    NONE = 0
    SELECTIVE = 1
    FULL = 2


class Float8(IntEnum):
    """Float8 recipe as the estimator's arrays code it (index into FLOAT8_RECIPES)."""

    NONE = 0
    TENSORWISE = 1
    ROWWISE = 2
    MXFP8 = 3


class FineTune(IntEnum):
    """Training mode as the estimator's arrays code it (index into FINETUNE_MODES): pre-training, full
    fine-tuning, LoRA adapters on frozen bf16 weights, LoRA on frozen NF4 weights (QLoRA)."""

    NONE = 0
    FULL = 1
    LORA = 2
    QLORA = 3


def looped(schedule):
    """Whether schedule codes (an int, or the estimator's array of them) are looped schedules (LOOPED_SCHEDULES)."""
    first, *rest = (schedule == PP_SCHEDULES.index(name) for name in LOOPED_SCHEDULES)
    for other in rest:
        first = first | other
    return first


def compile_mask(components) -> int:
    """The compiled components as a bitmask over COMPILE_COMPONENTS (model = 1, loss = 2)."""
    return sum(1 << COMPILE_COMPONENTS.index(t) for t in set(components))


# the bits of `compile_mask` the estimator's arrays test: the blocks compiled, the loss compiled
COMPILE_MODEL = compile_mask(("model",))
COMPILE_LOSS = compile_mask(("loss",))


def compile_label(compile_: bool, components) -> str:
    """What compile compiles, as the reports say it: off, on (model and loss), or "<component> only"."""
    if not compile_:
        return "off"
    return "on" if len(components) > 1 else f"{components[0]} only"


def lora_mask(targets) -> int:
    """The LoRA targets as a bitmask over LORA_TARGETS (q = 1, k = 2, v = 4, o = 8, w1 = 16, w2 = 32, w3 = 64)."""
    return sum(1 << LORA_TARGETS.index(t) for t in set(targets))


# the codes are the positions of the names in the value types (one definition, checked at import)
assert [m.name.lower() for m in AC] == list(AC_MODES)
assert [m.name.lower() for m in Float8] == list(FLOAT8_RECIPES)
assert len(Schedule) == len(PP_SCHEDULES) and PP_SCHEDULES[Schedule.INTERLEAVED_1F1B] == "Interleaved1F1B"
assert PP_SCHEDULES[Schedule.INTERLEAVED_ZERO_BUBBLE] == "InterleavedZeroBubble"
assert [m.name.lower() for m in FineTune] == list(FINETUNE_MODES)


class TrainConfig(BaseModel):
    """Field names follow torchtitan's job config so a plan maps one-to-one onto a launch."""

    model_config = ConfigDict(extra="forbid")

    gpus: int | None = Field(default=None, description="world size; default: product of the degrees")
    gpus_per_node: int | None = Field(default=None, description="default: the hardware profile's")
    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = Field(default=1, description="expert parallel degree (MoE): carved from dp_shard x cp x tp, as torchtitan")
    pp_schedule: PPSchedule = "1F1B"
    vpp: int | None = Field(default=None, description="stages per pipeline rank; the looped schedules (Interleaved1F1B, "
                               "InterleavedZeroBubble) default 2")
    pp_first_stage_less_layers: int = Field(
        default=DEFAULT_LESS, description="torchtitan's pipeline_parallel_first_stage_less_layers: the embedding counts "
        "as this many layers when the blocks are split over the stages, so the first stage holds that many fewer")
    pp_last_stage_less_layers: int = Field(
        default=DEFAULT_LESS, description="torchtitan's pipeline_parallel_last_stage_less_layers: the final norm and "
        "output count as this many layers, so the last stage holds that many fewer blocks")
    seq_len: int = 8192
    global_batch_size: int = Field(default=0, description="sequences per optimizer step; 0: one per DP rank")
    micro_batch_size: int = 1
    ac: ACMode = "selective"
    compile: bool = False
    compile_components: CompileComponents = Field(
        default=COMPILE_COMPONENTS, description="torchtitan's compile.components: what compile compiles, the model "
        "(each block) and / or the loss")
    float8: Float8Recipe = "none"
    async_tp: bool = False
    finetune: FineTuneMode = Field(default="none", description="none (pre-training), full, lora or qlora")
    lora_rank: int = Field(default=16, description="LoRA rank r (lora / qlora)")
    lora_alpha: float = Field(default=32.0, gt=0, description="LoRA scale alpha (the update is alpha / r x B A)")
    lora_targets: tuple[LoRATarget, ...] = Field(default=LORA_TARGETS, description="linears LoRA adapts")
    cpu_offload: bool = Field(default=False, description="FSDP2 CPUOffloadPolicy: params, grads and optimizer "
                                                         "state on the host, the optimizer step on the CPU")
    dtype: TrainingDtype = Field(default="float32", description="torchtitan's training.dtype: float32 keeps fp32 "
                                 "parameters, gradients and AdamW state (mixed precision computes in bf16); "
                                 "bfloat16 keeps all of them in bf16, without an fp32 master copy")
    fsdp_reshard_after_forward: ReshardPolicy = Field(
        default="default", description="torchtitan's parallelism.fsdp_reshard_after_forward: default (free each "
        "block's gathered parameters after its forward without PP, keep them for the step with PP), always, or "
        "never (keep every block's gathered bf16 parameters from its forward to its backward: one all-gather a "
        "microbatch instead of two, the whole stage's parameters in memory)")
    moe_force_load_balance: bool = Field(
        default=False, description="torchtitan's debug.moe_force_load_balance (MoE): route round-robin, token t to "
        "experts t*k .. t*k+k-1, every expert the same rows: the balanced benchmark routing of torchtitan's and NeMo "
        "AutoModel's published MoE runs, not learned routing")
    attention_kernel: AttentionKernel = Field(
        default="default", description="the attention kernel the job calls: default (the stack's: torchtitan 0.3 "
        "runs FlexAttention, older releases and meshplan's core SDPA), sdpa or flex; `validate` reads it from a "
        "row's `attention_kernel` column")
    document_tokens: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="mean tokens of a training document packed into the sequences: "
        "FlexAttention's block-causal mask (torchtitan 0.3) attends within documents only, so shorter documents cost "
        "less attention; None: one document a sequence (the most attention a sequence can cost; SDPA's causal mask "
        "always costs it)")
    moe_a2a_overlap: bool = Field(
        default=False, description="Megatron-Core's overlap_moe_expert_parallel_comm (MoE with ep > 1): one "
        "microbatch's dispatch and combine run while another's compute does (1F1B all-to-all overlap). For `validate` "
        "rows of frameworks that run it; torchtitan has no counterpart, so the planner never plans it")
    expert_parallel_comm_backend: EPCommBackend = Field(
        default="standard", description="torchtitan's parallelism.expert_parallel_comm_backend (MoE with ep > 1): "
        "standard (PyTorch all-to-all), deepep (DeepEP's dispatch and combine kernels) or hybridep (HybridEP's, "
        "torchtitan 0.3); both NVIDIA GPUs with the deep_ep package installed")

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def microbatches(self) -> int:
        """Microbatches per optimizer step on one DP rank (gradient accumulation or pipeline microbatches)."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    def rule_fields(self) -> dict:
        """The torchtitan-named values `estimator.rules` checks."""
        return self.model_dump(exclude={"gpus", "lora_alpha"})

    def resolve(self, model: ModelSpec, hw: HardwareProfile, skip: frozenset[str] = frozenset()) -> TrainConfig:
        """Return a copy with inferred fields set; raise MeshplanError naming the first problem. `skip`: keys of
        torchtitan's rules the stack that runs it lifts (`rules.stack_skips`)."""
        c = self.model_copy()
        for name in ("dp_replicate", "tp", "pp", "cp", "ep", "micro_batch_size", "seq_len", "lora_rank"):
            if getattr(c, name) < 1:
                raise InputError(f"{name} must be a positive integer, got {getattr(c, name)}", field=name)
        # absurd sizes are a one-line error here, before they overflow the estimator's int64 arrays
        for name, limit in (("gpus", MAX_GPUS), ("gpus_per_node", MAX_GPUS_PER_NODE), ("dp_replicate", MAX_GPUS),
                            ("dp_shard", MAX_GPUS), ("tp", MAX_GPUS), ("pp", MAX_GPUS), ("cp", MAX_GPUS), ("ep", MAX_GPUS),
                            ("vpp", MAX_GPUS), ("seq_len", MAX_SEQ_LEN), ("global_batch_size", MAX_GLOBAL_BATCH),
                            ("micro_batch_size", MAX_GLOBAL_BATCH)):
            check_size(getattr(c, name), name, limit)
        if c.gpus is not None and c.gpus < 1:
            raise InputError(f"gpus must be a positive integer, got {c.gpus}", field="gpus")
        if c.gpus_per_node is None:
            c.gpus_per_node = hw.gpus_per_node
        if c.gpus_per_node < 1:
            raise InputError(f"gpus_per_node must be a positive integer, got {c.gpus_per_node}", field="gpus_per_node")
        others = c.dp_replicate * c.tp * c.pp * c.cp
        if c.dp_shard == -1:
            world = c.gpus if c.gpus is not None else c.gpus_per_node
            if world % others:
                raise ConfigError(
                    f"cannot infer dp_shard: dp_replicate*tp*pp*cp = {others} does not divide {world} GPUs"
                )
            c.dp_shard = world // others
        elif c.dp_shard < 1:
            raise InputError(f"dp_shard must be a positive integer or -1 (infer), got {c.dp_shard}", field="dp_shard")
        product = others * c.dp_shard
        if c.gpus is None:
            c.gpus = product
        check_size(c.gpus, "the world size (GPUs)", MAX_GPUS)
        if product != c.gpus:
            raise ConfigError(
                f"degrees multiply to {product} (dp_replicate {c.dp_replicate} x dp_shard {c.dp_shard} x cp {c.cp}"
                f" x tp {c.tp} x pp {c.pp}) but the world size is {c.gpus} GPUs"
            )
        if c.gpus > c.gpus_per_node and c.gpus % c.gpus_per_node:
            raise ConfigError(f"{c.gpus} GPUs is not a whole number of {c.gpus_per_node}-GPU nodes")
        if c.vpp is None:
            c.vpp = 2 if c.pp_schedule in LOOPED_SCHEDULES else 1
        if c.vpp < 1:
            raise InputError(f"vpp must be a positive integer, got {c.vpp}", field="vpp")
        dp = c.dp_replicate * c.dp_shard
        if c.global_batch_size == 0:
            c.global_batch_size = dp * c.micro_batch_size * max(1, c.pp if c.pp > 1 else 1)
        if c.global_batch_size < 0:
            raise InputError(f"global_batch_size must be positive, got {c.global_batch_size}",
                             field="global_batch_size")
        check_size(c.global_batch_size, "global_batch_size", MAX_GLOBAL_BATCH)
        if not c.compile_components:
            raise InputError("compile_components is empty: name model, loss or both (or set compile false)",
                             field="compile_components")
        if not c.lora_targets:
            raise InputError("lora_targets is empty: name at least one of " + ", ".join(LORA_TARGETS),
                             field="lora_targets")
        from meshplan.estimator import (
            rules,  # the one validator shared with the planner, the plan file and the core
        )
        from meshplan.estimator.arrays import ConfigArrays

        problem = rules.check(model, hw, c.rule_fields(), predict=True, c=ConfigArrays.single(c), skip=skip)
        if problem:  # the pipeline split's weights are named by the rule's message: the CLI names their flag
            raise ConfigError(problem, field=next((f for f in LESS_FIELDS if problem.startswith(f)), None))
        return c
