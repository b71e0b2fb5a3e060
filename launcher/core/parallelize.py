"""Apply the plan's parallelism on one DeviceMesh (pp, dp_replicate, dp_shard, cp, tp), as torchtitan does.

Order per pipeline stage (torchtitan's): Float8 conversion -> TP (sequence + loss parallel) -> context
parallel -> activation checkpointing -> per-block torch.compile -> FSDP2 / HSDP -> materialise (to_empty +
seeded init).

Training dtype bfloat16 builds the parameters in bf16 (torchtitan's default dtype around its model build), so
FSDP2's MixedPrecisionPolicy (bf16 params, fp32 reduce on GPUs) casts nothing, the sharded gradients are bf16 and
AdamW's state, made like its parameters, is bf16: no fp32 master copy anywhere.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshplan.estimator.physics.stages import DEFAULT_LESS, stage_blocks
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.core.model import (
    PARAM_DTYPES,
    ContextParallel,
    Transformer,
    build_meta_model,
    default_dtype,
)
from meshplan.launcher.core.moe import moe_modules

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


# --- environment checks ------------------------------------------------------------------------------------
def check_environment(cfg: RunConfig) -> None:
    """Fail early, with one line, when the config asks for something this machine cannot do."""
    cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda:
        raise RuntimeError(
            "device 'cuda' requested but this machine has no usable CUDA GPU "
            "(torch.cuda.is_available() is False); use device: cpu"
        )
    if cfg.backend == "nccl":
        if cfg.device != "cuda":
            raise RuntimeError("backend 'nccl' needs device 'cuda'; on CPU use backend gloo (or auto)")
        if not dist.is_nccl_available():
            raise RuntimeError("backend 'nccl' requested but this torch build has no NCCL; use backend gloo")
    if cfg.async_tp and cfg.device != "cuda":
        raise RuntimeError(
            "async_tp needs CUDA GPUs with symmetric memory (NCCL); it is not supported on CPU"
        )
    if cfg.float8 == "mxfp8":
        if cfg.device != "cuda" or torch.cuda.get_device_capability() < (10, 0):
            raise RuntimeError(
                "float8 'mxfp8' needs a Blackwell GPU (CUDA compute capability >= 10.0); "
                "use tensorwise or rowwise"
            )
    elif cfg.float8 != "none" and cfg.device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        raise RuntimeError(
            "float8 training needs CUDA compute capability >= 8.9 (H100/Ada); use float8: none"
        )
    if cfg.float8 == "tensorwise" and cfg.tp > 1 and cfg.device != "cuda":
        raise RuntimeError(
            "float8 tensorwise with tp > 1 all-gathers float8 tensors, which gloo (CPU) cannot carry; "
            "it runs on CUDA with NCCL (on CPU use float8: rowwise, or tp 1)"
        )
    if (
        cfg.compile
        and cfg.device == "cpu"
        and not any(shutil.which(c) for c in ("gcc", "cc", "clang", "g++"))
    ):
        raise RuntimeError(
            "compile on CPU needs a C compiler (gcc/clang) on PATH; install one or set compile: false"
        )


def backend_for(cfg: RunConfig) -> str:
    """The process group's backend: NCCL on GPUs, gloo on CPU; with CPU offload on GPUs both (the gradients and
    the optimizer live on the host, and the gradient norm reduces there: torchtitan's and torchtune's choice)."""
    if cfg.backend != "auto":
        return cfg.backend
    if cfg.device == "cuda" and cfg.cpu_offload:
        return "cuda:nccl,cpu:gloo"
    return "nccl" if cfg.device == "cuda" else "gloo"


# --- mesh --------------------------------------------------------------------------------------------------
@dataclass
class Parallel:
    """The device mesh and the coordinates this rank needs."""

    cfg: RunConfig
    mesh: DeviceMesh
    fsdp_view: DeviceMesh
    device: torch.device
    # (pp, dp_replicate, efsdp, ep): the expert-parallel ranks carved from dp_shard x cp x tp (torchtitan 0.3's
    # sparse mesh), None without EP; and (pp, stage) for what every rank of a pipeline stage reduces together
    sparse_view: DeviceMesh | None = None
    stage_view: DeviceMesh | None = None
    # FSDP2 mixed precision (bf16 params, fp32 reduce); None: on CUDA only. The memory trace sets it on CPU
    # so that its fake tensors have the dtypes of the GPU run.
    mixed_precision: bool | None = None

    @property
    def mixed(self) -> bool:
        """Whether the model computes in bf16 as on the GPU (FSDP2's policy, or autocast without FSDP): on CUDA,
        or where the memory trace asks for it on the CPU (`mixed_precision`)."""
        return self.device.type == "cuda" if self.mixed_precision is None else self.mixed_precision

    def size(self, dim: str) -> int:
        return self.mesh[dim].size()

    def coord(self, dim: str) -> int:
        return self.mesh[dim].get_local_rank()

    @property
    def dp_rank(self) -> int:
        """Index of this rank's data shard among dp_replicate*dp_shard."""
        return self.coord("dp_replicate") * self.cfg.dp_shard + self.coord("dp_shard")

    @property
    def pp_rank(self) -> int:
        return self.coord("pp")

    @property
    def cp_rank(self) -> int:
        return self.coord("cp")

    @property
    def ep_mesh(self) -> DeviceMesh | None:
        return self.sparse_view["ep"] if self.sparse_view is not None else None

    @property
    def expert_fsdp_mesh(self) -> DeviceMesh | None:
        """FSDP mesh of the routed experts under EP: efsdp (with dp_replicate for HSDP); None without EP."""
        if self.sparse_view is None:
            return None
        if self.cfg.dp_replicate > 1:
            return self.sparse_view["dp_replicate", "efsdp"]
        return self.sparse_view["efsdp"]

    @property
    def ddp_mesh(self) -> DeviceMesh | None:
        """The dp_replicate mesh where the plan replicates through DDP, as torchtitan did before 2026-04 (0.2.2's
        apply_ddp): dp_replicate is the whole mesh and the stack does not wrap FSDP2 on every layout; else None."""
        return self.mesh["dp_replicate"] if self.cfg.ddp else None

    @property
    def fsdp_mesh(self) -> DeviceMesh | None:
        """FSDP shards over dp_shard*cp (cp ranks share the weights); HSDP adds dp_replicate. With fsdp_one_rank a
        mesh of one rank, so FSDP2's hooks, copies and collectives run with nothing to shard. None where FSDP2 does
        not wrap the model (`RunConfig.fsdp`: nothing shards without fsdp_one_rank, or DDP's replicas)."""
        cfg = self.cfg
        if not cfg.fsdp:
            return None
        if cfg.dp_replicate > 1:
            return self.fsdp_view["dp_replicate", "dp_shard_cp"]
        return self.fsdp_view["dp_shard_cp"]


def build_parallel(cfg: RunConfig, device: torch.device) -> Parallel:
    """One world mesh viewed as (pp, dp_replicate, dp_shard, cp, tp) like torchtitan's, plus the FSDP view
    (pp, dp_replicate, dp_shard_cp, tp) in which cp ranks shard the weights together with dp_shard."""
    world = init_device_mesh(device.type, (cfg.world_size,), mesh_dim_names=("world",))
    sizes = (cfg.pp, cfg.dp_replicate, cfg.dp_shard, cfg.cp, cfg.tp)
    mesh = world._unflatten(0, sizes, MESH_DIMS)
    fsdp_view = world._unflatten(
        0,
        (cfg.pp, cfg.dp_replicate, cfg.dp_shard * cfg.cp, cfg.tp),
        ("pp", "dp_replicate", "dp_shard_cp", "tp"),
    )
    sparse = None
    if cfg.ep > 1:
        efsdp = cfg.dp_shard * cfg.cp * cfg.tp // cfg.ep
        sparse = world._unflatten(0, (cfg.pp, cfg.dp_replicate, efsdp, cfg.ep), ("pp", "dp_replicate", "efsdp", "ep"))
    stage = world._unflatten(0, (cfg.pp, cfg.world_size // cfg.pp), ("pp", "stage"))
    return Parallel(cfg, mesh, fsdp_view, device, sparse_view=sparse, stage_view=stage)


# --- stages ------------------------------------------------------------------------------------------------
def stage_layers(layers: int, stages: int, first_less: int = DEFAULT_LESS,
                 last_less: int = DEFAULT_LESS) -> list[list[int]]:
    """Layer indices of each stage, split as torchtitan splits them (the plan's estimate assumes the same): the
    embedding and the output count as `first_less` / `last_less` layers (estimator/physics/stages.py)."""
    out, start = [], 0
    for n in stage_blocks(layers, stages, first_less, last_less):
        out.append(list(range(start, start + n)))
        start += n
    return out


def stage_ids(cfg: RunConfig, pp_rank: int) -> list[int]:
    """Pipeline stages owned by a pp rank: loop style, `pp_rank + k*pp` for k < vpp."""
    return [pp_rank + k * cfg.pp for k in range(cfg.vpp)]


Materialize = Callable[[Transformer], None]


def build_model_parts(
    cfg: RunConfig, par: Parallel, materialize: Materialize | None = None, init_weights: bool = True
) -> tuple[list[Transformer], list[int], Any]:
    """The model parts this rank owns (one, or vpp pipeline stages), parallelised and materialised, with what
    loading `cfg.init_from` did (hf_weights.LoadStats; None without it).

    `materialize` replaces the default materialisation (to_empty on the device + seeded init); the memory
    trace passes one that allocates fake tensors."""
    n_stages = cfg.pp * cfg.vpp
    ids = stage_ids(cfg, par.pp_rank) if cfg.pp > 1 else [0]
    split = stage_layers(cfg.model.layers, n_stages, cfg.pp_first_stage_less_layers, cfg.pp_last_stage_less_layers)
    pretrained = open_pretrained(cfg) if cfg.init_from and init_weights and materialize is None else None
    parts = []
    for sid in ids:
        part = build_meta_model(cfg.model, cfg.seq_len, PARAM_DTYPES[cfg.dtype])
        if cfg.pp > 1:
            part.keep_stage(split[sid], first=sid == 0, last=sid == n_stages - 1)
        if pretrained is not None:
            pretrained.configure(part)
        parts.append(parallelize_part(part, cfg, par, materialize, init_weights, pretrained))
    if pretrained is not None:
        pretrained.load(parts)
    return parts, ids, pretrained.stats if pretrained is not None else None


class Pretrained:
    """A Hugging Face checkpoint the run starts from (`init_from`): its RoPE and norm settings go onto the model,
    its weights into each rank's shards (hf_weights.load_into reads only a rank's slices); QLoRA's NF4 weights
    are quantized from whole tensors, one at a time, before FSDP shards them."""

    def __init__(self, cfg: RunConfig) -> None:
        from meshplan.launcher.core import hf_weights

        self.cfg = cfg
        self.ckpt = hf_weights.HFCheckpoint(cfg.init_from)
        hf_weights.check_spec(self.ckpt, cfg.model)
        self.rope = hf_weights.rope_settings(self.ckpt)
        self.norm_eps = float(self.ckpt.config.get("rms_norm_eps") or 1e-5)
        self.stats: Any = None

    def configure(self, part: Transformer) -> None:
        """The checkpoint's RoPE base and scaling and its RMSNorm epsilon (every norm, QK-norms included)."""
        part.rope_theta, part.rope_scaling = self.rope["rope_theta"], self.rope["rope_scaling"]
        for module in part.modules():
            if isinstance(module, nn.RMSNorm):
                module.eps = self.norm_eps

    def value(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The whole tensor of core parameter `name` (QLoRA quantizes it before FSDP shards it)."""
        from meshplan.launcher.core import hf_weights

        key = hf_weights.hf_key(name, self.cfg.model)
        return hf_weights.read_local(self.ckpt, key, torch.empty(shape, device="meta"))

    def load(self, parts: list[Transformer]) -> None:
        from meshplan.launcher.core import hf_weights
        from meshplan.launcher.core.lora import is_nf4

        self.stats = hf_weights.load_into(parts, self.ckpt, self.cfg.model, skip=lambda name, p: is_nf4(p))


def open_pretrained(cfg: RunConfig) -> Pretrained:
    return Pretrained(cfg)


def parallelize_part(
    model: Transformer, cfg: RunConfig, par: Parallel, materialize: Materialize | None = None,
    init_weights: bool = True, pretrained: Pretrained | None = None,
) -> Transformer:
    """LoRA -> Float8 -> TP -> CP -> AC -> compile -> (QLoRA's NF4) -> FSDP -> materialise, on one model part."""
    mixed = par.mixed
    if cfg.finetune in ("lora", "qlora"):
        from meshplan.launcher.core.lora import apply_lora

        with default_dtype(PARAM_DTYPES[cfg.dtype]):  # bf16 training: the adapters bf16 too (torchtitan 0.3.0's)
            apply_lora(model, cfg.lora_rank, cfg.lora_alpha, tuple(cfg.lora_targets),
                       torch.bfloat16 if mixed else None)
    if cfg.float8 != "none":
        convert_float8(model, cfg.float8)
    for moe in moe_modules([model]):
        moe.force_balance, moe.aux_loss_coef = cfg.moe_force_balance, cfg.moe_aux_loss_coef
    if cfg.tp > 1:
        apply_tp(model, par.mesh["tp"], async_tp=cfg.async_tp, float8_tensorwise=cfg.float8 == "tensorwise",
                 ep=cfg.ep)
    if par.ep_mesh is not None:
        apply_ep(model, par.ep_mesh, cfg.tp)
    if cfg.cp > 1:
        model.set_context_parallel(
            ContextParallel(par.mesh["cp"].get_group(), cfg.seq_len, par.cp_rank, cfg.cp)
        )
    for block in model.layers.values():
        block.ac = cfg.ac
        if cfg.compile_model:
            if block.moe:  # routing makes data-dependent shapes: graph breaks around the dispatch
                torch._dynamo.config.capture_scalar_outputs = True
                block.compile()
            else:
                block.compile(fullgraph=True)
    qlora = cfg.finetune == "qlora" and materialize is None
    if qlora:  # NF4 base weights from whole values, one at a time, before FSDP shards each block
        from meshplan.launcher.core.lora import quantize_block_linears
        from meshplan.launcher.core.model import init_region

        def value_of(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            if pretrained is not None:
                return pretrained.value(name, shape)
            return init_region(name, shape, (0,) * len(shape), shape, cfg.model, cfg.seed, par.device)

        for key, block in model.layers.items():
            quantize_block_linears(block, value_of, f"layers.{key}", par.device)
    mesh = par.fsdp_mesh
    emesh = par.expert_fsdp_mesh
    reshard = reshard_after_forward(cfg)
    if emesh is not None:  # the routed experts first: their own FSDP unit on the expert mesh
        apply_expert_fsdp(model, emesh, cuda=mixed, reshard_after_forward=reshard)
    offload = cfg.cpu_offload and materialize is None
    if mesh is not None:
        apply_fsdp(model, mesh, cuda=mixed, reshard_after_forward=reshard,
                   offload=offload, pin_memory=par.device.type == "cuda")
    if materialize is not None:
        materialize(model)
        return model
    if par.ddp_mesh is not None:
        apply_ddp(model, par.ddp_mesh, cfg.compile_model)
    # CPU offload: FSDP2 wants the weights materialised on the host (torchtitan's init_device "cpu")
    weights_device = torch.device("cpu") if offload else par.device
    if qlora:
        from meshplan.launcher.core.lora import to_empty_except_nf4

        to_empty_except_nf4(model, weights_device)
    else:
        model.to_empty(device=weights_device)
    if init_weights:
        model.init_weights(cfg.seed, weights_device, rope_device=par.device,
                           skip=(lambda name: not name.endswith(("lora_a.weight", "lora_b.weight")))
                           if pretrained is not None else None)
    else:  # the checkpoint fills the parameters; only the RoPE buffers are computed
        model.init_rope(par.device)
    return model


def float8_filter(module: nn.Module, fqn: str) -> bool:
    """Convert block Linears whose dims divide by 16; never the output projection or a MoE router (torchtitan
    keeps `router.gate` in high precision); the routed experts are not Linears and stay bf16."""
    if not isinstance(module, nn.Linear) or fqn.split(".")[-1] in ("output", "router") or fqn == "output":
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert_float8(model: nn.Module, recipe: str) -> None:
    """torchao Float8 training (dynamic scaling) on the eligible Linears."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=float8_filter)


def tp_styles(float8_tensorwise: bool) -> tuple[type, type, type]:
    """(ColwiseParallel, RowwiseParallel, PrepareModuleInput) for the blocks, as torchtitan picks them: torchao's
    Float8 styles under tensorwise Float8 (the all-gathers move float8 with one scale per tensor); the plain
    styles otherwise (rowwise and MX recipes scale the local shards inside the converted Linear)."""
    if float8_tensorwise:
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    return ColwiseParallel, RowwiseParallel, PrepareModuleInput


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, async_tp: bool, float8_tensorwise: bool = False,
             ep: int = 1) -> None:
    """Megatron-style TP with sequence parallel (norms, residual stream sharded on seq) and loss parallel.
    The embeddings and output projection stay in high precision, so they take the plain styles. MLA and MoE
    blocks take torchtitan's plans (`mla_tp_plan`, `moe_tp_plan`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    colwise, rowwise, prepare_input = tp_styles(float8_tensorwise)

    top: dict[str, Any] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
        )
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attention_norm": SequenceParallel(),
            "attention": prepare_input(
                input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
            ),
            "attention.wo": rowwise(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
        }
        if block.attention.__class__.__name__ == "MLAttention":
            plan.update(mla_tp_plan(block.attention, tp_mesh, colwise))
        else:
            plan.update({"attention.wq": colwise(), "attention.wk": colwise(), "attention.wv": colwise()})
        if block.moe:
            plan.update(moe_tp_plan(block.feed_forward, tp_mesh, ep, colwise, rowwise))
        else:
            plan.update({
                "feed_forward": prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": colwise(),
                "feed_forward.w2": rowwise(output_layouts=Shard(1)),
            })
            if block.feed_forward.w3 is not None:
                plan["feed_forward.w3"] = colwise()
        if block.post_attention_norm is not None:  # Gemma's sandwich norms: on the sequence-sharded outputs
            plan["post_attention_norm"] = SequenceParallel(use_local_output=True)
            plan["post_ffn_norm"] = SequenceParallel(use_local_output=True)
        if getattr(block.attention, "k_norm", None) is not None:  # QK-norm: per head, heads sharded by TP (dim 2)
            plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        parallelize_module(block, tp_mesh, plan)
    if async_tp:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        torch._inductor.config._micro_pipeline_tp = True
        enable_symm_mem_for_group(tp_mesh.get_group().group_name)


def mla_tp_plan(attn: nn.Module, tp_mesh: DeviceMesh, colwise: type) -> dict[str, Any]:
    """torchtitan's deepseek_v3 plan: the up-projections column-parallel (local heads), the down-projections into
    the latents and their norms whole on every rank (their gradients arrive reduced through the column-parallel
    inputs; the RoPE key, shared by all heads, has its gradient all-reduced in `MLAttention`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    attn.tp_group = tp_mesh.get_group()
    plan: dict[str, Any] = {
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                        desired_input_layouts=(Replicate(), None, None), use_local_output=True),
        "attention.wkv_b": colwise(),
    }
    plan["attention.wq" if attn.wq is not None else "attention.wq_b"] = colwise()
    return plan


def moe_tp_plan(moe: nn.Module, tp_mesh: DeviceMesh, ep: int, colwise: type, rowwise: type) -> dict[str, Any]:
    """A MoE block under TP, as torchtitan 0.3 shards it. Without EP the routed experts are TP-sharded like a dense
    MLP (w1/w3 on their inner width, w2 on its input) on the gathered input, whose output partial sums are
    reduce-scattered back to the sequence shards. With EP (carved from the TP ranks too) each rank routes its own
    sequence shard to whole experts; only the shared expert gathers its input, and the router runs on the shard."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleInputOutput,
        SequenceParallel,
    )

    def gather_reduce() -> PrepareModuleInputOutput:
        return PrepareModuleInputOutput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                        use_local_input=True, output_layouts=(Partial(),),
                                        desired_output_layouts=(Shard(1),), use_local_output=True)

    plan: dict[str, Any] = {}
    if moe.shared_experts is not None:
        plan.update({"feed_forward.shared_experts.w1": colwise(), "feed_forward.shared_experts.w3": colwise(),
                     "feed_forward.shared_experts.w2": rowwise(output_layouts=Partial())})
    if ep > 1:
        plan["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                                  use_local_output=True)
        plan["feed_forward.router"] = SequenceParallel(sequence_dim=0, use_local_output=True)
        if moe.shared_experts is not None:
            plan["feed_forward.shared_experts"] = gather_reduce()
        return plan
    plan["feed_forward"] = gather_reduce()

    def shard_experts(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for pname, p in list(module.named_parameters(recurse=False)):
            dim = 2 if pname == "w2" else 1  # w1/w3 [E, F, h]: F; w2 [E, h, F]: F
            module.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, [Shard(dim)], src_data_rank=None)))

    distribute_module(moe.experts, tp_mesh, shard_experts)
    moe.tp_group = tp_mesh.get_group()  # the experts' partial input gradients are summed over TP
    return plan


def apply_ep(model: Transformer, ep_mesh: DeviceMesh, tp: int) -> None:
    """Expert parallelism: every MoE block's routed experts sharded on the expert dimension over the ep ranks
    (torchtitan's ExpertParallel partition), and the block told its ep group for the all-to-all.

    An expert's gradient already sums the tokens of its whole ep group (the all-to-all's backward), and FSDP then
    averages it over the expert FSDP ranks (dp_shard x cp x tp / ep); the data-parallel mean it must equal divides
    by dp_shard x cp instead, so the experts' gradients are scaled by tp / ep (torchtitan divides the loss by the
    global token count and turns FSDP's division off, to the same effect)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    for block in model.layers.values():
        if not block.moe:
            continue
        moe = block.feed_forward
        for pname, p in list(moe.experts.named_parameters(recurse=False)):
            moe.experts.register_parameter(
                pname, nn.Parameter(distribute_tensor(p, ep_mesh, [Shard(0)], src_data_rank=None)))
        moe.ep_group, moe.ep_size, moe.ep_rank = ep_mesh.get_group(), ep_mesh.size(), ep_mesh.get_local_rank()
        moe.experts.grad_scale = tp / ep_mesh.size()


def reshard_after_forward(cfg) -> bool:
    """FSDP2's reshard_after_forward for a run (`cfg`: a RunConfig), as torchtitan's fsdp_reshard_after_forward
    policy sets it: default frees each block's gathered weights after its forward without PP and keeps a stage's
    for the step with PP; always and never say so."""
    return {"always": True, "never": False}.get(cfg.fsdp_reshard_after_forward, cfg.pp == 1)


def apply_expert_fsdp(model: Transformer, mesh: DeviceMesh, cuda: bool, reshard_after_forward: bool) -> None:
    """FSDP2 of each MoE block's routed experts over the expert FSDP mesh (torchtitan 0.2's separate unit), on
    their inner dimension (dim 1), so it composes with the ep sharding of dim 0."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cuda
          else MixedPrecisionPolicy())
    for block in model.layers.values():
        if block.moe:
            fully_shard(block.feed_forward.experts, mesh=mesh, mp_policy=mp,
                        reshard_after_forward=reshard_after_forward, shard_placement_fn=lambda p: Shard(1))


def apply_ddp(model: Transformer, mesh: DeviceMesh, compiled: bool) -> None:
    """torchtitan 0.2.2's apply_ddp: torch's composable replicate (DDP) over the dp_replicate mesh, 100 MB gradient
    buckets; the model stays fp32 and trains under torch.autocast (the training loop's amp context). Applied before
    the weights are materialised: DDP builds its buckets at the first forward."""
    from torch.distributed._composable.replicate import replicate

    if compiled:
        torch._dynamo.config.optimize_ddp = "ddp_optimizer"
    replicate(model, device_mesh=mesh, bucket_cap_mb=100)


def apply_fsdp(model: Transformer, mesh: DeviceMesh, cuda: bool, reshard_after_forward: bool,
               offload: bool = False, pin_memory: bool = True) -> None:
    """FSDP2 per block plus the root (embeddings, final norm, output); bf16 params / fp32 reduce when `cuda`
    (the GPU run's mixed precision); with `offload` FSDP2's CPUOffloadPolicy keeps the sharded weights,
    gradients and (through the optimizer built on them) AdamW's state in host memory, pinned on GPU machines."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cuda
        else MixedPrecisionPolicy()
    )
    policy = CPUOffloadPolicy(pin_memory=pin_memory) if offload else OffloadPolicy()
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward,
                    offload_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward, offload_policy=policy)
