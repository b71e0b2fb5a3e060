"""The configuration as float arrays: parallel degrees, microbatches per step, tokens one rank holds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.config import AC, COMPILE_LOSS, COMPILE_MODEL, RESHARD_POLICIES, FineTune, Float8


def as_float(x) -> np.ndarray:
    """`x` as float64 (the estimator computes in float64: bytes and FLOPs exceed int32); an array stays one, a
    single configuration's scalar stays a scalar (:mod:`meshplan.estimator.xp`)."""
    return xp.as_float(x)


@dataclass(frozen=True)
class Layout:
    """Degrees and sizes of each configuration (float arrays) and its mode flags (boolean arrays)."""

    c: ConfigArrays
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    vpp: np.ndarray
    dp_shard: np.ndarray
    dp_replicate: np.ndarray
    seq_len: np.ndarray  # tokens per sequence
    micro_batch: np.ndarray  # sequences per microbatch
    global_batch: np.ndarray  # sequences per optimizer step
    gpus_per_node: np.ndarray
    world: np.ndarray  # GPUs in the job
    microbatches: np.ndarray  # microbatches per step per DP rank (accumulation or pipeline microbatches)
    fsdp_ranks: np.ndarray  # FSDP shards over dp_shard x cp (torchtitan's dp_shard_cp mesh)
    ep: np.ndarray  # expert parallel degree (MoE): ranks carved from dp_shard x cp x tp
    expert_fsdp_ranks: np.ndarray  # FSDP shards of the routed experts: dp_shard x cp x tp / ep with EP, else fsdp_ranks
    tokens_mb: np.ndarray  # tokens of one microbatch held by one rank (sequence split over CP)
    full_ac: np.ndarray
    selective_ac: np.ndarray
    compiled: np.ndarray  # torch.compile compiles each block (compile on, compile_components has model)
    fp8: np.ndarray
    has_tp: np.ndarray
    single_stage: np.ndarray  # no pipeline parallelism
    finetune: np.ndarray  # starts from a pretrained checkpoint (full, LoRA or QLoRA fine-tuning)
    lora: np.ndarray  # LoRA or QLoRA: adapters train, the base weights are frozen
    qlora: np.ndarray  # the frozen base linears are NF4
    offload: np.ndarray  # FSDP2 CPU offload: sharded params, grads and optimizer state on the host
    lora_rank: np.ndarray
    bf16_state: np.ndarray  # training.dtype bfloat16: parameters, gradients and AdamW state in bf16
    loss_compiled: np.ndarray  # torch.compile compiles the loss (compile on, compile_components has loss)
    deepep: np.ndarray  # DeepEP or HybridEP dispatches the routed tokens (expert_parallel_comm_backend, ep > 1)
    hybridep: np.ndarray  # HybridEP does (its own link efficiencies, the same route as DeepEP's)
    force_balance: np.ndarray  # MoE tokens go round-robin (moe_force_load_balance): balanced, consecutive experts
    a2a_overlap: np.ndarray  # the EP all-to-all overlaps another microbatch's compute (Megatron's 1F1B overlap)
    flex_attention: np.ndarray  # the job calls FlexAttention (its own choice, else its stack's), not SDPA
    document_tokens: np.ndarray  # mean tokens of a packed document (0: one document a sequence)
    fsdp: np.ndarray  # FSDP2 wraps the model: it shards it (torchtitan's fsdp_enabled: dp_shard x cp > 1), or a stack
    # wraps every layout (`fsdp_every_layout`: one shard); else DDP / one device / TP or PP alone
    cost_balanced_split: bool = False  # the stack splits the blocks by compute cost (`pp_split`), not as torchtitan

    @property
    def float8(self) -> np.ndarray:
        """Float8 recipe codes (:class:`~meshplan.estimator.config.Float8`)."""
        return self.c.float8

    @property
    def schedule(self) -> np.ndarray:
        """Pipeline schedule codes (:class:`~meshplan.estimator.config.Schedule`)."""
        return self.c.schedule

    @property
    def async_tp(self) -> np.ndarray:
        return xp.as_bool(self.c.async_tp)

    @property
    def fsdp_one_rank(self) -> np.ndarray:
        """FSDP2 wraps the model on a mesh of one shard (dp_shard x cp = 1, `fsdp_every_layout`): torch's one-rank
        path casts and copies the parameters and gradients itself, no collective shards them."""
        return self.fsdp & (self.fsdp_ranks <= 1)


def layout_of(c: ConfigArrays, stack=None) -> Layout:
    """The float view of configurations `c` the physics modules compute with; `stack` (a StackProfile) says whether
    FSDP2 wraps layouts it does not shard (`fsdp_every_layout`) and how a pipeline splits the blocks (`pp_split`)."""
    every = bool(stack is not None and stack.fsdp_every_layout)
    cost_balanced = bool(stack is not None and stack.pp_split == "cost_balanced")
    flex_default = bool(stack is not None and stack.attention_of() == "flex")
    t, p, cp, v = as_float(c.tp), as_float(c.pp), as_float(c.cp), as_float(c.vpp)
    ds, dr, ep = as_float(c.dp_shard), as_float(c.dp_replicate), as_float(c.ep)
    s, mbs, gbs = as_float(c.seq_len), as_float(c.micro_batch), as_float(c.global_batch)
    return Layout(
        c=c, tp=t, pp=p, cp=cp, vpp=v, dp_shard=ds, dp_replicate=dr, seq_len=s, micro_batch=mbs, global_batch=gbs,
        gpus_per_node=as_float(c.gpus_per_node), world=ds * dr * t * p * cp,
        microbatches=gbs / (dr * ds * mbs), fsdp_ranks=ds * cp, tokens_mb=mbs * s / cp, ep=ep,
        expert_fsdp_ranks=xp.where(ep > 1, ds * cp * t / ep, ds * cp),
        full_ac=c.ac == int(AC.FULL), selective_ac=c.ac == int(AC.SELECTIVE), compiled=xp.as_bool(c.compile) & ((c.compile_components & COMPILE_MODEL) > 0),
        loss_compiled=xp.as_bool(c.compile) & ((c.compile_components & COMPILE_LOSS) > 0),
        fp8=c.float8 > int(Float8.NONE), has_tp=t > 1, single_stage=p == 1,
        finetune=c.finetune > int(FineTune.NONE), lora=c.finetune >= int(FineTune.LORA), qlora=c.finetune == int(FineTune.QLORA), offload=xp.as_bool(c.cpu_offload),
        lora_rank=as_float(c.lora_rank), bf16_state=xp.as_bool(c.bf16_state), fsdp=(ds * cp > 1) | every,
        deepep=(as_float(c.ep_backend) >= 1.0) & (ep > 1), hybridep=(as_float(c.ep_backend) == 2.0) & (ep > 1),
        force_balance=xp.as_bool(c.force_balance), a2a_overlap=xp.as_bool(c.a2a_overlap) & (ep > 1),
        flex_attention=(c.attention == 2) | ((c.attention == 0) & flex_default), document_tokens=as_float(c.documents),
        cost_balanced_split=cost_balanced,
    )


def sequence_shards(stack, model, lay: Layout) -> np.ndarray:
    """How many ways TP splits a block's sequence-wise activations (norm inputs, residuals, stage outputs) and the
    output head: tp under sequence parallelism; 1 where the stack runs TP without it (`stack`: a StackProfile, its
    `tp_sequence_parallel_off_for`: pipeline stages, models with tied embeddings, MoE models; `model`: a ModelSpec)."""
    off = stack.tp_sequence_parallel_off_for
    if ("tied_embeddings" in off and model.tied_embeddings) or ("moe" in off and model.moe is not None):
        return xp.full_like(lay.tp, 1.0)
    if "pipeline" in off:
        return xp.where(lay.single_stage, lay.tp, 1.0)
    return lay.tp


def resharded(stack, lay: Layout) -> np.ndarray:
    """Whether FSDP2 frees a block's gathered parameters after its forward (and gathers them again in its backward,
    every microbatch): the configuration's `fsdp_reshard_after_forward` where it says always or never, else
    (default) without PP the stack's `reshard_after_forward`, with PP its `pp_reshard_after_forward` (torchtitan
    keeps a stage's parameters for the step; `stack`: a StackProfile)."""
    policy = lay.c.reshard
    default = xp.where(lay.single_stage, bool(stack.reshard_after_forward), bool(stack.pp_reshard_after_forward))
    return xp.where(policy == RESHARD_POLICIES.index("always"), True,
                    xp.where(policy == RESHARD_POLICIES.index("never"), False, default))


def reduces_every_microbatch(stack, lay: Layout) -> np.ndarray:
    """Whether FSDP reduce-scatters the gradients after every microbatch's backward: without PP where the stack does
    (`grad_sync_every_microbatch`); else only after the last one, each unsharded gradient held until then (PP, or
    FSDP2's set_requires_gradient_sync(False) before the last microbatch; `stack`: a StackProfile)."""
    return lay.single_stage & bool(stack.grad_sync_every_microbatch)
