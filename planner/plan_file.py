"""The plan file: the one artefact everything downstream consumes (exports, launcher, UIs).

A plan is YAML with a `version` field, validated by pydantic. It embeds the model spec and the
hardware profile it was made with, so it stays reproducible when presets change:
`meshplan estimate --plan plan.yaml` gives the same numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from meshplan.estimator import data_files
from meshplan.estimator.config import (
    COMPILE_COMPONENTS,
    LORA_TARGETS,
    ACMode,
    CompileComponents,
    EPCommBackend,
    Float8Recipe,
    LoRATarget,
    LRDecay,
    PPSchedule,
    ReshardPolicy,
    TrainConfig,
    TrainingDtype,
)
from meshplan.estimator.errors import InputError, MeshplanError
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.stages import DEFAULT_LESS, LESS_FIELDS
from meshplan.estimator.stack import StackProfile, load_stack

PLAN_VERSION = 1
DEFAULT_DTYPE = "float32"  # torchtitan's training.dtype default: left out of the YAML and the fingerprint
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class Parallel(BaseModel):
    """Parallel configuration with torchtitan's names."""

    model_config = ConfigDict(extra="forbid")

    dp_replicate: int = Field(default=1, ge=1)
    dp_shard: int = Field(ge=1)
    cp: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1, description="expert parallel degree (MoE); carved from dp_shard x cp x tp")
    pp_schedule: PPSchedule = "1F1B"
    vpp: int = Field(default=1, ge=1)
    pp_first_stage_less_layers: int = Field(default=DEFAULT_LESS, ge=0, description="torchtitan's pipeline_parallel_"
                                            "first_stage_less_layers: the first stage holds that many fewer blocks")
    pp_last_stage_less_layers: int = Field(default=DEFAULT_LESS, ge=0, description="torchtitan's pipeline_parallel_"
                                           "last_stage_less_layers: the last stage holds that many fewer blocks")
    micro_batch_size: int = Field(default=1, ge=1)
    ac: ACMode = "selective"
    float8: Float8Recipe = "none"
    compile: bool = False
    compile_components: CompileComponents = Field(
        default=COMPILE_COMPONENTS, min_length=1, description="torchtitan's compile.components: what compile "
        "compiles, model (each block) and / or loss")
    async_tp: bool = False
    cpu_offload: bool = Field(default=False, description="FSDP2 CPUOffloadPolicy: sharded weights, gradients and "
                                                         "optimizer state on the host, the optimizer step on the CPU")
    fsdp_reshard_after_forward: ReshardPolicy = Field(
        default="default", description="torchtitan's parallelism.fsdp_reshard_after_forward: default, always or never "
        "(keep each block's gathered weights from its forward to its backward)")
    expert_parallel_comm_backend: EPCommBackend = Field(
        default="standard", description="torchtitan's parallelism.expert_parallel_comm_backend: standard (PyTorch "
        "all-to-all), deepep (DeepEP's kernels) or hybridep (HybridEP's); torchtitan exports run them, meshplan's "
        "own core does not")

    @property
    def uses_deepep(self) -> bool:
        """The deep_ep package's kernels dispatch the experts' tokens: the backend says deepep or hybridep (HybridEP
        ships in DeepEP's hybrid-ep branch) and EP runs (without EP it has nothing to send)."""
        return self.expert_parallel_comm_backend != "standard" and self.ep > 1


class FineTuning(BaseModel):
    """Fine-tuning from a pretrained checkpoint (absent: pre-training from a random initialisation)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["full", "lora", "qlora"] = Field(description="full: every weight trains; lora: adapters on frozen "
                                                               "bf16 weights; qlora: adapters on frozen NF4 weights")
    init_from: str | None = Field(default=None, description="Hugging Face checkpoint folder (config.json + "
                                                            "*.safetensors) the run starts from")
    lora_rank: int = Field(default=16, ge=1)
    lora_alpha: float = Field(default=32.0, gt=0, allow_inf_nan=False)
    lora_targets: tuple[LoRATarget, ...] = Field(default=LORA_TARGETS, min_length=1)


class Optimizer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Literal["adamw"] = "adamw"
    lr: float = Field(default=3e-4, gt=0, allow_inf_nan=False)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0, allow_inf_nan=False)
    weight_decay: float = Field(default=0.1, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _betas(self) -> Optimizer:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"AdamW betas must each lie in [0, 1), got {list(self.betas)}")
        return self


class LRSchedule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    warmup_steps: int = Field(default=200, ge=0)
    decay: LRDecay = "cosine"
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)


class Training(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq_len: int = Field(ge=1)
    global_batch_size: int = Field(ge=1, description="sequences per optimizer step")
    steps: int = Field(default=1000, ge=1)
    tokens: int | None = Field(default=None, ge=1, description="token budget the steps were derived from")
    dtype: TrainingDtype = Field(default="float32", description="torchtitan's training.dtype: float32 keeps fp32 "
                                 "parameters, gradients and AdamW state (bf16 mixed-precision compute); bfloat16 "
                                 "keeps all of them in bf16, without an fp32 master copy (RoPE and the loss in fp32)")
    grad_clip: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    seed: int = 0
    moe_force_load_balance: bool = Field(default=False, description="torchtitan's debug.moe_force_load_balance "
                                         "(MoE): round-robin routing, every expert the same rows (benchmarks)")
    document_tokens: int | None = Field(default=None, ge=1, description="mean tokens of a training document packed "
                                        "into the sequences (FlexAttention's block-causal mask attends within "
                                        "documents); none: one document a sequence")
    checkpoint_interval: int = Field(default=500, ge=1, description="steps between DCP checkpoints")
    optimizer: Optimizer = Field(default_factory=Optimizer)
    lr_schedule: LRSchedule = Field(default_factory=LRSchedule)


class Plan(BaseModel):
    """A launchable training plan (schema version 1)."""

    model_config = ConfigDict(extra="forbid")

    version: int = PLAN_VERSION
    name: str = Field(default="meshplan-run", pattern=SAFE_NAME, description="job name: letters, digits, . _ -")
    model_source: str = Field(description="the preset name or path the model came from")
    model: ModelSpec
    hardware: HardwareProfile
    stack: str = Field(default="torchtitan", description="the stack profile it was made with: a built-in id, or the "
                       "path of the YAML file it was read from (its contents are in stack_profile)")
    stack_profile: StackProfile | None = Field(
        default=None, description="the profile a plan made with a stack YAML file keeps, so it estimates, exports and "
        "launches the same where that file is not (another folder, the cluster); none for a built-in stack")
    cluster: Cluster
    parallel: Parallel
    training: Training
    finetune: FineTuning | None = None
    estimate: dict | None = None

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.version != PLAN_VERSION:
            raise ValueError(f"plan version {self.version} is not supported (this meshplan reads {PLAN_VERSION})")
        p = self.parallel
        product = p.dp_replicate * p.dp_shard * p.cp * p.tp * p.pp
        if product != self.cluster.gpus:
            raise ValueError(
                f"parallel degrees multiply to {product} but the cluster has {self.cluster.gpus} GPUs"
            )
        from meshplan.estimator import (
            rules,  # the one validator: what the planner ranks, the core and torchtitan run
        )

        problem = rules.check(self.model, self.hardware, self.rule_fields())
        if problem:
            raise ValueError(problem)
        return self

    def stack_of(self) -> StackProfile:
        """The stack profile the plan was made with: the one it keeps (a YAML file's; :func:`load_plan` reads it for a
        plan written before plans kept it), else the one its `stack` names. One-line MeshplanError when that is a
        file that is not there."""
        if self.stack_profile is not None:
            return self.stack_profile
        return load_stack(self.stack)

    def rule_fields(self) -> dict:
        """The torchtitan-named values `estimator.rules` checks."""
        return {**self.parallel.model_dump(), "seq_len": self.training.seq_len,
                "global_batch_size": self.training.global_batch_size, "gpus_per_node": self.cluster.gpus_per_node,
                "dtype": self.training.dtype, **self.finetune_fields()}

    def finetune_fields(self) -> dict:
        """The estimator's fine-tuning fields (TrainConfig names) of this plan."""
        ft = self.finetune
        if ft is None:
            return {}
        return {"finetune": ft.mode, "lora_rank": ft.lora_rank, "lora_alpha": ft.lora_alpha,
                "lora_targets": tuple(ft.lora_targets)}

    def train_config(self) -> TrainConfig:
        """The estimator's view of this plan (resolved against the embedded model and hardware)."""
        p = self.parallel
        cfg = TrainConfig(
            gpus=self.cluster.gpus, gpus_per_node=self.cluster.gpus_per_node, dp_replicate=p.dp_replicate,
            dp_shard=p.dp_shard, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep, pp_schedule=p.pp_schedule, vpp=p.vpp,
            pp_first_stage_less_layers=p.pp_first_stage_less_layers, pp_last_stage_less_layers=p.pp_last_stage_less_layers,
            seq_len=self.training.seq_len, global_batch_size=self.training.global_batch_size,
            micro_batch_size=p.micro_batch_size, ac=p.ac, compile=p.compile, float8=p.float8, async_tp=p.async_tp,
            compile_components=p.compile_components, cpu_offload=p.cpu_offload, dtype=self.training.dtype, **self.finetune_fields(),
            moe_force_load_balance=self.training.moe_force_load_balance,
            document_tokens=self.training.document_tokens,
            fsdp_reshard_after_forward=p.fsdp_reshard_after_forward,
            expert_parallel_comm_backend=p.expert_parallel_comm_backend,
        )
        return cfg.resolve(self.model, self.hardware)

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.training.seq_len


# the dispatchers' names as their projects write them, by expert_parallel_comm_backend
KERNELS = {"deepep": "DeepEP", "hybridep": "HybridEP"}


def framework_refusal(plan: Plan, what: str = "meshplan's exports and launches run") -> str | None:
    """Why neither meshplan's core nor torchtitan runs `plan` as it was estimated (None: they do): a plan estimated
    under another framework's stack profile (`runs.on_core` false: nanotron, Megatron-Core, llm-foundry,
    KempnerForge) describes that framework's memory and speed, and its layout may be one torchtitan cannot run.
    None where the plan's stack file cannot be read here (a path on another machine). `what`: who refuses."""
    try:
        profile = plan.stack_of()
    except MeshplanError:
        return None
    if profile.runs.on_core:
        return None
    return (f"plan {plan.name} was estimated for stack {plan.stack}, another framework than the torchtitan that "
            f"{what} (see `runs.on_core` in its profile); re-estimate it for torchtitan "
            f"(meshplan estimate --plan PLAN --stack torchtitan -o NEW.yaml) or plan with --stack torchtitan, or take "
            f"its parallel section to {plan.stack}'s own launcher")


def core_refusal(plan: Plan) -> str | None:
    """Why meshplan's own training core cannot run `plan` as planned (None: it can): a plan of another framework
    (`framework_refusal`); a plan whose experts travel by DeepEP or HybridEP runs under torchtitan only (the core
    dispatches with PyTorch's all-to-all)."""
    other = framework_refusal(plan)
    if other:
        return other
    if plan.parallel.uses_deepep:
        backend = plan.parallel.expert_parallel_comm_backend
        return (f"the plan dispatches its experts with {KERNELS[backend]} (expert_parallel_comm_backend {backend}), "
                "which meshplan's training core does not run: launch it with --engine torchtitan, export it for "
                "torchtitan (meshplan export PLAN -f torchtitan-py for 0.3"
                + (", -f torchtitan-toml for 0.2.2" if backend == "deepep" else "")
                + "), or plan with --ep-comm-backend standard")
    return None


def make_plan(
    model: ModelSpec,
    model_source: str,
    hardware: HardwareProfile,
    cfg: TrainConfig,
    estimate: dict | None = None,
    stack: str = "torchtitan",
    tokens: int | None = None,
    steps: int | None = None,
    name: str | None = None,
    init_from: str | None = None,
) -> Plan:
    """A plan for one resolved configuration; `tokens` (a budget) sets the steps when `steps` is not given. A stack
    read from a YAML file (`stack` a path) is kept in the plan (`stack_profile`)."""
    cfg = cfg.resolve(model, hardware)
    tokens_per_step = cfg.global_batch_size * cfg.seq_len
    if steps is None:
        steps = max(1, -(-tokens // tokens_per_step)) if tokens else 1000
    gpn = cfg.gpus_per_node or hardware.gpus_per_node
    nodes = max(1, cfg.gpus // gpn) if cfg.gpus >= gpn else 1
    gpn = gpn if cfg.gpus >= gpn else cfg.gpus
    check_name(name)
    return Plan(
        name=name or _default_name(model.name, cfg.gpus),
        model_source=model_source,
        model=model,
        hardware=hardware.model_copy(update={"aliases": []}),  # names to look the part up by: not the plan's
        stack=stack,
        stack_profile=profile_kept(stack),
        cluster=Cluster(nodes=nodes, gpus_per_node=gpn),
        parallel=Parallel(
            dp_replicate=cfg.dp_replicate, dp_shard=cfg.dp_shard, cp=cfg.cp, tp=cfg.tp, pp=cfg.pp, ep=cfg.ep,
            pp_schedule=cfg.pp_schedule, vpp=cfg.vpp or 1, pp_first_stage_less_layers=cfg.pp_first_stage_less_layers,
            pp_last_stage_less_layers=cfg.pp_last_stage_less_layers, micro_batch_size=cfg.micro_batch_size, ac=cfg.ac,
            float8=cfg.float8, compile=cfg.compile, compile_components=cfg.compile_components, async_tp=cfg.async_tp,
            cpu_offload=cfg.cpu_offload,
            fsdp_reshard_after_forward=cfg.fsdp_reshard_after_forward,
            # a dense model or a layout without EP sends no experts' tokens: the plan reads "standard"
            expert_parallel_comm_backend=cfg.expert_parallel_comm_backend if cfg.ep > 1 else "standard",
        ),
        training=Training(
            seq_len=cfg.seq_len, global_batch_size=cfg.global_batch_size, steps=steps, tokens=tokens, dtype=cfg.dtype,
            moe_force_load_balance=cfg.moe_force_load_balance and model.moe is not None,
            document_tokens=cfg.document_tokens,
            **training_defaults(cfg.finetune, steps),
        ),
        finetune=finetuning_of(cfg, init_from),
        estimate=estimate,
    )


def profile_kept(stack: str) -> StackProfile | None:
    """What a plan made with `stack` keeps as its `stack_profile`: a YAML file's profile; None for a built-in id."""
    return load_stack(stack) if data_files.names_a_file(stack) else None


def training_defaults(finetune: str, steps: int) -> dict:
    """The optimizer and LR schedule a plan starts with: pre-training's (lr 3e-4, weight decay 0.1, up to 200
    warmup steps), or torchtune's fine-tuning recipes' (full: lr 2e-5; LoRA / QLoRA: lr 3e-4; both weight decay
    0.01 and up to 100 warmup steps)."""
    if finetune == "none":
        return {"lr_schedule": LRSchedule(warmup_steps=min(200, max(0, steps // 10)))}
    lr = 2e-5 if finetune == "full" else 3e-4
    return {"optimizer": Optimizer(lr=lr, weight_decay=0.01),
            "lr_schedule": LRSchedule(warmup_steps=min(100, max(0, steps // 10)))}


def finetuning_of(cfg: TrainConfig, init_from: str | None = None) -> FineTuning | None:
    """The plan's fine-tuning section for a configuration (None for pre-training from scratch)."""
    if cfg.finetune == "none" and init_from is None:
        return None
    if init_from is not None:  # the ranks and torchtitan read it from other working directories
        init_from = os.path.abspath(os.path.expanduser(init_from))
    return FineTuning(mode="full" if cfg.finetune == "none" else cfg.finetune, init_from=init_from,
                      lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets)


def plan_fingerprint(plan: Plan) -> str:
    """A short hash (16 hex digits) of what makes a run's checkpoints this plan's: the model, the parallel
    layout (degrees, schedule, micro-batch, AC, Float8, compile), the sequence length, the global batch, the
    training dtype (bf16 state cannot resume fp32 state, nor the other way round) and the seed. Two plans with the same fingerprint can resume each other's run directories; any other cannot."""
    # fields added after a plan's schema was first published count only when set, so the runs of a plan written
    # before them keep their fingerprint (and resume)
    model = _model_dump(plan.model)
    for field in ROUTING_FIELDS:  # how tokens pick experts changes no parameter
        (model.get("moe") or {}).pop(field, None)
    # when FSDP frees gathered weights changes no checkpoint: a run may resume under another policy
    # nor how the experts' tokens travel (the same parameters, the same checkpoint), nor what compile compiles
    parallel = plan.parallel.model_dump(mode="json", exclude={"fsdp_reshard_after_forward",
                                                              "expert_parallel_comm_backend", "compile_components"})
    for field, unset in (("ep", 1), ("cpu_offload", False), *((f, DEFAULT_LESS) for f in LESS_FIELDS)):
        if parallel.get(field) == unset:
            parallel.pop(field)
    key = {
        "model": model,
        "parallel": parallel,
        "seq_len": plan.training.seq_len,
        "global_batch_size": plan.training.global_batch_size,
        "seed": plan.training.seed,
    }
    if plan.finetune is not None:  # the starting point and what trains (the checkpoint folder by its path)
        key["finetune"] = plan.finetune.model_dump(mode="json")
    if plan.training.dtype != DEFAULT_DTYPE:
        key["dtype"] = plan.training.dtype
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


# the MoE fields of node-limited routing (DeepSeek n_group / topk_group): unset, a plan reads as before them
ROUTING_FIELDS = {"expert_groups": 1, "limited_groups": None}


def _model_dump(model: ModelSpec) -> dict:
    """The model spec as JSON values, without the architecture fields a model leaves unset (MoE, MLA, a vision
    tower, local attention, node-limited routing): a plan of a dense full-attention model reads as it did before
    they existed."""
    out = model.model_dump(mode="json")
    for field, unset in (("moe", None), ("mla", None), ("vision_params", 0), ("attention_window", 0),
                         ("window_kind", "sliding"), ("window_layer_share", 0.0)):
        if out.get(field) == unset:
            out.pop(field, None)
    for field, unset in ROUTING_FIELDS.items():
        if (out.get("moe") or {}).get(field, unset) == unset:
            (out.get("moe") or {}).pop(field, None)
    return out


def default_run_dir(plan: Plan) -> Path:
    """`runs/<name>-<fingerprint[:8]>`: relative to where the launch starts, one folder per plan layout, so
    two different plans launched from one directory never share a run directory."""
    return Path("runs") / f"{plan.name}-{plan_fingerprint(plan)[:8]}"


def check_name(name: str | None) -> None:
    """A job name (--name) goes into file names and scripts: letters, digits, . _ - only."""
    if name is not None and not re.match(SAFE_NAME, name):
        raise InputError(f"name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (no spaces or shell characters)",
                         field="name")


def _default_name(model_name: str, gpus: int) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-._") or "model"
    return f"{base[:48]}-{gpus}gpu"


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; one-line MeshplanError on any problem."""
    path = Path(path)
    if not path.exists():
        raise MeshplanError(f"plan file not found: {path}")
    raw = data_files.read_yaml(path)
    if raw.get("version", PLAN_VERSION) != PLAN_VERSION:
        raise MeshplanError(
            f"{path}: plan version {raw.get('version')!r} is not supported (this meshplan reads version {PLAN_VERSION})"
        )
    try:
        plan = Plan.model_validate(raw)
    except ValidationError as exc:
        raise data_files.one_line(exc, f"plan {path.name}") from None
    if plan.stack_profile is None and data_files.names_a_file(plan.stack):
        # a plan written before plans kept their stack file's profile: read the file from the plan's folder (then
        # from the current one) and keep it, so its copies need no file
        try:
            plan.stack_profile = load_stack(data_files.beside(plan.stack, path))
        except MeshplanError:
            pass  # not here: the commands that need it say which file (one line)
    return plan


def plan_yaml(plan: Plan) -> str:
    model_name = " ".join(plan.model.name.split())  # one line: a name is free text
    header = (
        f"# meshplan plan (schema version {plan.version}): {model_name} on {plan.cluster.nodes} x "
        f"{plan.cluster.gpus_per_node} {plan.hardware.id}\n"
        "# Launch: meshplan launch PLAN.yaml --backend torchrun|slurm|mpirun; export: meshplan export PLAN.yaml\n"
    )
    body = {**plan.model_dump(mode="json"), "model": _model_dump(plan.model)}
    if plan.finetune is None:  # a pre-training plan reads as it did before fine-tuning existed
        body.pop("finetune")
    if plan.stack_profile is None:  # a built-in stack: its id says it all
        body.pop("stack_profile")
    if not plan.parallel.cpu_offload:
        body["parallel"].pop("cpu_offload")
    if plan.parallel.fsdp_reshard_after_forward == "default":  # reads as before the field existed
        body["parallel"].pop("fsdp_reshard_after_forward")
    if plan.parallel.expert_parallel_comm_backend == "standard":  # reads as before the field existed
        body["parallel"].pop("expert_parallel_comm_backend")
    if plan.parallel.compile_components == COMPILE_COMPONENTS:  # torchtitan's default: as before the field
        body["parallel"].pop("compile_components")
    for field in LESS_FIELDS:  # torchtitan's default split: the plan reads as it did before the fields existed
        if body["parallel"][field] == DEFAULT_LESS:
            body["parallel"].pop(field)
    if plan.training.dtype == DEFAULT_DTYPE:  # fp32 state: the plan reads as it did before the field existed
        body["training"].pop("dtype")
    if not plan.training.moe_force_load_balance:  # learned routing: as before the field existed
        body["training"].pop("moe_force_load_balance")
    if plan.training.document_tokens is None:  # one document a sequence: as before the field existed
        body["training"].pop("document_tokens")
    body["hardware"].pop("aliases", None)  # names to look the part up by, not what the plan ran on
    for field in ("nvlink_pair_gbs", "scale_up_domain_gpus"):  # a part without them reads as before they existed
        if body["hardware"].get(field) is None:
            body["hardware"].pop(field, None)
    return header + yaml.safe_dump(body, sort_keys=False, width=110)


def check_output_path(path: str | Path, flag: str | None = None) -> Path:
    """Raise MeshplanError (one line) unless a file could be written at `path`: its folder exists and is
    writable, and `path` is not a folder. Commands with several outputs check them all before any work,
    so a bad path writes nothing."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    what = f"{flag} {path}" if flag else str(path)
    if not parent.exists():
        raise MeshplanError(f"output folder does not exist: {parent} ({what})")
    if not parent.is_dir():
        raise MeshplanError(f"output folder is not a folder: {parent} ({what})")
    if path.is_dir():
        raise MeshplanError(f"output path is a folder: {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MeshplanError(f"output folder is not writable: {parent} ({what})")
    return path


def write_atomic(path: str | Path, text: str, mode: int = 0o644) -> Path:
    """Write `text` to `path` via a temporary file and rename: never a half-written file."""
    path = check_output_path(path)
    parent = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_plan(plan: Plan, path: str | Path) -> Path:
    return write_atomic(path, plan_yaml(plan))
