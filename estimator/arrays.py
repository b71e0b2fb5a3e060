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
    FINETUNE_MODES,
    FLOAT8_RECIPES,
    LORA_TARGETS,
    PP_SCHEDULES,
    TrainConfig,
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

    def __post_init__(self) -> None:
        scalar = not isinstance(self.tp, np.ndarray)
        for name, default in (("finetune", 0), ("lora_rank", 16), ("lora_targets", lora_mask(LORA_TARGETS)),
                              ("cpu_offload", 0), ("bf16_state", 0), ("pp_first_stage_less_layers", DEFAULT_LESS),
                              ("pp_last_stage_less_layers", DEFAULT_LESS)):
            if getattr(self, name) is None:
                setattr(self, name, np.int64(default) if scalar else np.full(len(self.tp), default, dtype=np.int64))

    @classmethod
    def single(cls, config: TrainConfig) -> ConfigArrays:
        """One already-resolved TrainConfig as numpy int64 scalars (the estimator's scalar path)."""
        return cls(**{k: np.int64(v[0]) for k, v in vars(cls.from_configs([config])).items()})

    @property
    def is_single(self) -> bool:
        """True when the fields are scalars (one configuration), not arrays."""
        return not isinstance(self.tp, np.ndarray)

    @classmethod
    def from_configs(cls, configs: Sequence[TrainConfig]) -> ConfigArrays:
        """Pack already-resolved TrainConfigs."""
        cols: dict[str, list] = {f.name: [] for f in fields(cls)}
        for c in configs:
            cols["dp_replicate"].append(c.dp_replicate)
            cols["dp_shard"].append(c.dp_shard)
            cols["tp"].append(c.tp)
            cols["pp"].append(c.pp)
            cols["cp"].append(c.cp)
            cols["vpp"].append(c.vpp or 1)
            cols["schedule"].append(PP_SCHEDULES.index(c.pp_schedule))
            cols["seq_len"].append(c.seq_len)
            cols["global_batch"].append(c.global_batch_size)
            cols["micro_batch"].append(c.micro_batch_size)
            cols["ac"].append(AC_MODES.index(c.ac))
            cols["compile"].append(c.compile)
            cols["float8"].append(FLOAT8_RECIPES.index(c.float8))
            cols["async_tp"].append(c.async_tp)
            cols["gpus_per_node"].append(c.gpus_per_node)
            cols["ep"].append(c.ep)
            cols["finetune"].append(FINETUNE_MODES.index(c.finetune))
            cols["lora_rank"].append(c.lora_rank)
            cols["lora_targets"].append(lora_mask(c.lora_targets))
            cols["cpu_offload"].append(c.cpu_offload)
            cols["bf16_state"].append(c.dtype == "bfloat16")
            cols["pp_first_stage_less_layers"].append(c.pp_first_stage_less_layers)
            cols["pp_last_stage_less_layers"].append(c.pp_last_stage_less_layers)
        return cls(**{k: np.asarray(v, dtype=np.int64) for k, v in cols.items()})

    def take(self, idx: np.ndarray) -> ConfigArrays:
        """The configurations at `idx` (an index or boolean array)."""
        return ConfigArrays(**{k: v[idx] for k, v in vars(self).items()})

    def concat(self, other: ConfigArrays) -> ConfigArrays:
        """These configurations followed by `other`'s."""
        return ConfigArrays(**{k: np.concatenate([v, getattr(other, k)]) for k, v in vars(self).items()})

    def __len__(self) -> int:
        return 1 if self.is_single else len(self.tp)
