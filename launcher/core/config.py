"""Run configuration of the training core: parallel degrees named as torchtitan names them, plus training
settings.

A config is a JSON or YAML mapping (`RunConfig.load(path)`); the model is a `ModelSpec` given inline, or a
preset name / model YAML / Hugging Face `config.json` path resolved by `estimator.model_spec.load_model`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from meshplan.estimator.config import (
    COMPILE_COMPONENTS,
    LORA_TARGETS,
    ACMode,
    CompileComponents,
    FineTuneMode,
    Float8Recipe,
    LoRATarget,
    LRDecay,
    PPSchedule,
    ReshardPolicy,
    TrainingDtype,
)
from meshplan.estimator.model_spec import ModelSpec, load_model
from meshplan.estimator.physics.stages import DEFAULT_LESS, LESS_FIELDS

RULE_FIELDS = {"dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "pp_schedule", "vpp", "micro_batch_size",
               "global_batch_size", "seq_len", "ac", "compile", "compile_components", "float8", "async_tp", "finetune", "lora_rank",
               "lora_targets", "cpu_offload", "dtype", *LESS_FIELDS}


class RunConfig(BaseModel):
    """Everything one training run needs. Degrees multiply to the world size (checked by `check_world`)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSpec
    # --- parallelism (torchtitan names) ---------------------------------------------------------------
    dp_replicate: int = Field(1, ge=1, description="HSDP replicas (data_parallel_replicate_degree)")
    dp_shard: int = Field(1, ge=1, description="FSDP shards (data_parallel_shard_degree)")
    cp: int = Field(1, ge=1, description="context parallel degree")
    tp: int = Field(1, ge=1, description="tensor parallel degree (with sequence and loss parallel)")
    pp: int = Field(1, ge=1, description="pipeline parallel degree")
    ep: int = Field(1, ge=1, description="expert parallel degree (MoE): ranks carved from dp_shard x cp x tp")
    pp_schedule: PPSchedule = "1F1B"
    vpp: int = Field(1, ge=1, description="pipeline stages per rank (>1 needs a looped schedule: Interleaved1F1B or InterleavedZeroBubble)")
    pp_first_stage_less_layers: int = Field(DEFAULT_LESS, ge=0, description="the embedding counts as this many "
                                            "layers in the stage split: the first stage holds that many fewer blocks "
                                            "(torchtitan's pipeline_parallel_first_stage_less_layers)")
    pp_last_stage_less_layers: int = Field(DEFAULT_LESS, ge=0, description="the norm and output count as this many "
                                           "layers: the last stage holds that many fewer blocks (torchtitan's "
                                           "pipeline_parallel_last_stage_less_layers)")
    micro_batch_size: int = Field(1, ge=1, description="sequences per microbatch per data-parallel rank")
    global_batch_size: int = Field(8, ge=1, description="sequences per optimizer step, all ranks together")
    seq_len: int = Field(64, ge=2)
    ac: ACMode = "none"
    compile: bool = False
    compile_components: CompileComponents = Field(
        COMPILE_COMPONENTS, min_length=1, description="torchtitan's compile.components: what compile compiles, the "
        "model (each block) and / or the loss")
    float8: Float8Recipe = "none"
    async_tp: bool = False
    dtype: TrainingDtype = Field("float32", description="torchtitan's training.dtype: float32 = fp32 parameters, "
                                 "gradients and AdamW state (bf16 compute under FSDP on GPUs); bfloat16 = the model "
                                 "built in bf16, so all of them are bf16 (RoPE tables and the loss stay fp32)")
    # --- training -------------------------------------------------------------------------------------
    steps: int = Field(10, ge=1, description="total optimizer steps (sets the LR schedule)")
    stop_at_step: int | None = Field(None, ge=1, description="checkpoint and exit after this step")
    lr: float = Field(3e-4, gt=0, allow_inf_nan=False)
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas, each in [0, 1)")
    eps: float = Field(1e-8, gt=0, allow_inf_nan=False)
    warmup_steps: int = Field(2, ge=0)
    decay: LRDecay = Field("cosine", description="LR decay after the warmup")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="decay floor as a fraction of lr")
    weight_decay: float = Field(0.1, ge=0, allow_inf_nan=False)
    grad_clip: float = Field(1.0, ge=0, allow_inf_nan=False, description="max global grad norm; 0 disables clipping")
    moe_bias_update: float = Field(1e-3, ge=0, allow_inf_nan=False,
                                   description="MoE auxiliary-loss-free balancing step (torchtitan's load_balance_coeff)")
    moe_aux_loss_coef: float = Field(0.0, ge=0, allow_inf_nan=False,
                                     description="weight of the Switch load-balancing loss of each MoE layer; 0: none")
    moe_force_balance: bool = Field(False, description="route tokens round-robin (torchtitan's moe_force_load_balance)")
    # --- fine-tuning -------------------------------------------------------------------------------------
    finetune: FineTuneMode = Field("none", description="none (pre-training), full, lora or qlora")
    init_from: str | None = Field(None, description="Hugging Face checkpoint folder loaded before the first step "
                                                    "(each rank reads only its shards)")
    lora_rank: int = Field(16, ge=1)
    lora_alpha: float = Field(32.0, gt=0, allow_inf_nan=False)
    lora_targets: tuple[LoRATarget, ...] = Field(LORA_TARGETS, min_length=1)
    cpu_offload: bool = Field(False, description="FSDP2 CPUOffloadPolicy (GPU runs; on CPU the state is on the host "
                                                 "already)")
    fsdp_reshard_after_forward: ReshardPolicy = Field(
        "default", description="torchtitan's parallelism.fsdp_reshard_after_forward: default (reshard without PP, "
        "keep a stage's weights with PP), always, never")
    fsdp_one_rank: bool = Field(False, description="wrap FSDP2 on a mesh of one shard where nothing shards "
                                "(dp_shard x cp = 1: one GPU, dp_replicate alone, TP or PP alone), as torchtitan does "
                                "since 2026-04 (0.3.0): bf16 through its MixedPrecisionPolicy, no autocast, no fp32 "
                                "compute. A plan sets it from its stack's fsdp_every_layout")
    seed: int = 0
    checkpoint_interval: int = Field(0, ge=0, description="save every N steps; 0 saves only on stop/signal")
    checkpoint_dir: str | None = Field(None, description="defaults to RUN_DIR/checkpoints")
    keep_checkpoints: int = Field(2, ge=1)
    resume: bool = True
    data: str = Field("synthetic", description="'synthetic' or the path of a local text file")
    tokenizer: str | None = Field(
        None, description="local Hugging Face tokenizer.json (byte-level by default)"
    )
    device: Literal["cpu", "cuda"] = "cpu"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    run_dir: str = "runs/latest"
    log_every: int = Field(1, ge=1)
    peak_flops: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="dense bf16 FLOP/s per GPU for MFU (the plan's hardware)"
    )
    fingerprint: str | None = Field(
        None, pattern=r"^[0-9a-f]{8,64}$", description="the plan's layout hash; checkpoints of another are refused"
    )

    @field_validator("model", mode="before")
    @classmethod
    def _resolve_model(cls, value: Any) -> Any:
        if isinstance(value, str | Path):
            return load_model(str(value))
        return value

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        from meshplan.estimator import (
            rules,  # the one validator shared with the estimator, planner and plan file
        )

        problem = rules.check(self.model, None, self.model_dump(include=RULE_FIELDS))
        if problem:
            raise ValueError(problem)
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"AdamW betas must each lie in [0, 1), got {list(self.betas)}")
        if self.stop_at_step is not None and self.stop_at_step > self.steps:
            raise ValueError(f"stop_at_step ({self.stop_at_step}) is past steps ({self.steps})")
        return self

    # --- derived ---------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def compile_model(self) -> bool:
        """torch.compile compiles each block (compile on, model among compile_components)."""
        return self.compile and "model" in self.compile_components

    @property
    def compile_loss(self) -> bool:
        """torch.compile compiles the loss (compile on, loss among compile_components)."""
        return self.compile and "loss" in self.compile_components

    @property
    def ddp(self) -> bool:
        """Whether the replicas train through DDP (torchtitan 0.2.2's apply_ddp): dp_replicate is the whole mesh and
        FSDP2 does not wrap every layout (fsdp_one_rank off)."""
        return 1 < self.dp_replicate == self.world_size and not self.fsdp_one_rank

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 wraps the model: where it shards (dp_shard x cp > 1), over replicas that are not DDP's (HSDP,
        or beside TP / PP), and everywhere with fsdp_one_rank."""
        return (self.dp_replicate * self.dp_shard * self.cp > 1 and not self.ddp) or self.fsdp_one_rank

    @property
    def local_batch_size(self) -> int:
        """Sequences each data-parallel rank takes per optimizer step."""
        return self.global_batch_size // self.dp

    @property
    def microbatches(self) -> int:
        """Gradient-accumulation microbatches per step (the pipeline microbatches when pp > 1)."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    def check_world(self, world_size: int) -> None:
        """Raise ValueError when the degrees do not multiply to the number of processes."""
        if self.world_size != world_size:
            raise ValueError(
                f"dp_replicate*dp_shard*cp*tp*pp = "
                f"{self.dp_replicate}*{self.dp_shard}*{self.cp}*{self.tp}*{self.pp}"
                f" = {self.world_size}, but WORLD_SIZE is {world_size}"
            )

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.run_dir) / "checkpoints"

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> RunConfig:
        """Validate a mapping, turning pydantic's report into a one-line ValueError."""
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "config"
            msg = err["msg"].removeprefix("Value error, ")
            raise ValueError(f"invalid run config: {where}: {msg}") from None

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """Read a JSON (`.json`) or YAML run config."""
        path = Path(path)
        text = path.read_text()
        if path.suffix == ".json":
            obj = json.loads(text)
        else:
            import yaml

            obj = yaml.safe_load(text)
        if not isinstance(obj, dict):
            raise ValueError(f"{path} must hold a mapping of fields")
        return cls.from_dict(obj)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
