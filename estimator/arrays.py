"""Configurations as parallel arrays: what the vectorised estimator, the rules and the planner's search take.

One element per configuration, integer arrays; the mode columns hold the codes of
:class:`~meshplan.estimator.config.Schedule`, :class:`~meshplan.estimator.config.AC` and
:class:`~meshplan.estimator.config.Float8`. A single configuration is held as numpy scalars instead
(:meth:`ConfigArrays.single`): the same physics runs on them about ten times faster than on length-1 arrays
(:mod:`meshplan.estimator.xp`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from meshplan.estimator.config import (
    AC_MODES,
    ATTENTION_KERNELS,
    COMPILE_COMPONENTS,
    EP_COMM_BACKENDS,
    FINETUNE_MODES,
    FLOAT8_RECIPES,
    LORA_TARGETS,
    PP_SCHEDULES,
    RESHARD_POLICIES,
    TrainConfig,
    compile_mask,
    lora_mask,
)
from meshplan.estimator.physics.stages import DEFAULT_LESS


@dataclass
class ConfigArrays:
    """Resolved configurations as parallel integer arrays (torchtitan's degrees; batch in sequences)."""

    dp_replicate: np.ndarray
    dp_shard: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    vpp: np.ndarray
    schedule: np.ndarray
    seq_len: np.ndarray
    global_batch: np.ndarray
    micro_batch: np.ndarray
    ac: np.ndarray
    compile: np.ndarray
    float8: np.ndarray
    async_tp: np.ndarray
    gpus_per_node: np.ndarray
    ep: np.ndarray  # expert parallel degree (1 for dense models)
    # fine-tuning (None: pre-training without offload, filled in by __post_init__)
    finetune: np.ndarray | None = None  # FineTune code
    lora_rank: np.ndarray | None = None
    lora_targets: np.ndarray | None = None  # bitmask over LORA_TARGETS (`lora_mask`)
    cpu_offload: np.ndarray | None = None
    bf16_state: np.ndarray | None = None  # 1: training.dtype bfloat16 (parameters, gradients, AdamW state in bf16)
    # torchtitan's pipeline split weights: the embedding / the norm + output count as this many layers (default 1)
    pp_first_stage_less_layers: np.ndarray | None = None
    pp_last_stage_less_layers: np.ndarray | None = None
    reshard: np.ndarray | None = None  # index into RESHARD_POLICIES (0: the stack's default)
    ep_backend: np.ndarray | None = None  # index into EP_COMM_BACKENDS (0: standard all-to-all, 1: DeepEP)
    # bitmask over COMPILE_COMPONENTS (`compile_mask`) of what `compile` compiles: model 1, loss 2 (default both)
    compile_components: np.ndarray | None = None
    force_balance: np.ndarray | None = None  # 1: MoE tokens routed round-robin (torchtitan's moe_force_load_balance)
    a2a_overlap: np.ndarray | None = None  # 1: the EP all-to-all overlaps another microbatch's compute (Megatron)
    attention: np.ndarray | None = None  # index into ATTENTION_KERNELS (0: the stack's, 1: SDPA, 2: FlexAttention)
    documents: np.ndarray | None = None  # mean tokens of a packed document (0: one document a sequence)

    def __post_init__(self) -> None:
        scalar = not isinstance(self.tp, np.ndarray)
        for name, default in (("finetune", 0), ("lora_rank", 16), ("lora_targets", lora_mask(LORA_TARGETS)),
                              ("cpu_offload", 0), ("bf16_state", 0), ("pp_first_stage_less_layers", DEFAULT_LESS),
                              ("pp_last_stage_less_layers", DEFAULT_LESS), ("reshard", 0),
                              ("ep_backend", 0), ("compile_components", compile_mask(COMPILE_COMPONENTS)),
                              ("force_balance", 0), ("a2a_overlap", 0), ("attention", 0),
                              ("documents", 0)):
            if getattr(self, name) is None:
                setattr(self, name, int(default) if scalar else np.full(len(self.tp), default, dtype=np.int64))

    @classmethod
    def single(cls, config: TrainConfig) -> ConfigArrays:
        """One already-resolved TrainConfig as Python ints (the estimator's scalar path, :mod:`~meshplan.estimator.xp`)."""
        return cls(**{k: int(v) for k, v in _codes(config).items()})

    @property
    def is_single(self) -> bool:
        """True when the fields are scalars (one configuration), not arrays."""
        return type(self.tp) is not np.ndarray

    @classmethod
    def from_configs(cls, configs: Sequence[TrainConfig]) -> ConfigArrays:
        """Pack already-resolved TrainConfigs."""
        rows = [_codes(c) for c in configs]
        return cls(**{f.name: np.asarray([r[f.name] for r in rows], dtype=np.int64) for f in fields(cls)})

    def take(self, idx: np.ndarray) -> ConfigArrays:
        """The configurations at `idx` (an index or boolean array)."""
        return ConfigArrays(**{k: v[idx] for k, v in vars(self).items()})

    def concat(self, other: ConfigArrays) -> ConfigArrays:
        """These configurations followed by `other`'s."""
        return ConfigArrays(**{k: np.concatenate([v, getattr(other, k)]) for k, v in vars(self).items()})

    def __len__(self) -> int:
        return 1 if self.is_single else len(self.tp)


def _codes(c: TrainConfig) -> dict[str, int]:
    """One resolved TrainConfig as the integers ConfigArrays holds (enums as their codes, flags as 0 / 1)."""
    return {
        "dp_replicate": c.dp_replicate, "dp_shard": c.dp_shard, "tp": c.tp, "pp": c.pp, "cp": c.cp,
        "vpp": c.vpp or 1, "schedule": PP_SCHEDULES.index(c.pp_schedule), "seq_len": c.seq_len,
        "global_batch": c.global_batch_size, "micro_batch": c.micro_batch_size, "ac": AC_MODES.index(c.ac),
        "compile": int(c.compile), "float8": FLOAT8_RECIPES.index(c.float8), "async_tp": int(c.async_tp),
        "gpus_per_node": c.gpus_per_node, "ep": c.ep, "finetune": FINETUNE_MODES.index(c.finetune),
        "lora_rank": c.lora_rank, "lora_targets": lora_mask(c.lora_targets), "cpu_offload": int(c.cpu_offload),
        "bf16_state": int(c.dtype == "bfloat16"), "pp_first_stage_less_layers": c.pp_first_stage_less_layers,
        "pp_last_stage_less_layers": c.pp_last_stage_less_layers,
        "reshard": RESHARD_POLICIES.index(c.fsdp_reshard_after_forward),
        "ep_backend": EP_COMM_BACKENDS.index(c.expert_parallel_comm_backend),
        "compile_components": compile_mask(c.compile_components),
        "force_balance": int(c.moe_force_load_balance),
        "a2a_overlap": int(c.moe_a2a_overlap),
        "attention": ATTENTION_KERNELS.index(c.attention_kernel),
        "documents": c.document_tokens or 0,
    }
