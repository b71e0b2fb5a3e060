"""`meshplan export-weights RUN_DIR -o DIR`: a run's newest intact checkpoint as Hugging Face safetensors.

A run directory holds the core's `config.json` (its RunConfig) and DCP checkpoints. Full training and full
fine-tuning write every weight (sharded `model-*.safetensors` + index, and a `config.json`: the one of the
checkpoint the run started from when it had one); LoRA / QLoRA runs write their adapters in PEFT's format
(`adapter_model.safetensors`, `adapter_config.json`), or with `merge` the full weights W + alpha / r B A, the frozen
W read again from the run's `init_from` (or regenerated from its seed). One process, no GPU; each tensor is read
whole, so the host needs about the model's size in RAM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshplan.estimator.errors import CheckpointError, InputError


def run_config(run_dir: Path) -> Any:
    """The RunConfig the core wrote into `run_dir` when it started."""
    from meshplan.launcher.core.config import RunConfig

    path = run_dir / "config.json"
    if not run_dir.is_dir():
        raise InputError(f"run directory not found: {run_dir}")
    if not path.is_file():
        raise CheckpointError(f"{run_dir} holds no config.json: it is not a run directory of the training core "
                              "(meshplan launch RUN / python -m meshplan.launcher.core.train write one)")
    try:
        return RunConfig.from_dict(json.loads(path.read_text()))
    except (ValueError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: {str(exc).splitlines()[0]}") from None


def checkpoint_dir(cfg: Any, run_dir: Path, step: int | None) -> Path:
    """The newest checkpoint that verifies (or step `step`'s)."""
    from meshplan.launcher.core.checkpoint import Checkpointer

    root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else run_dir / "checkpoints"
    if step is not None:
        path = root / f"step-{step:08d}"
        if not path.is_dir():
            raise CheckpointError(f"{run_dir} has no checkpoint of step {step} (looked for {path})")
        return path
    latest = Checkpointer(root, one_process=True).latest() if root.is_dir() else None
    if latest is None:
        raise CheckpointError(f"{run_dir} has no intact checkpoint under {root} (train with checkpoint_interval, or "
                              "let the run reach its last step)")
    return latest


def base_weights(cfg: Any, names: list[str]) -> dict[str, Any]:
    """The frozen weights of a LoRA run: from its init_from checkpoint, else from its seed (whole tensors)."""
    import torch

    from meshplan.launcher.core import hf_weights
    from meshplan.launcher.core.model import init_region

    out = {}
    if cfg.init_from:
        ckpt = hf_weights.HFCheckpoint(cfg.init_from)
        try:
            for name in names:
                key = hf_weights.hf_key(name, cfg.model)
                shape = hf_weights.core_shape(name, cfg.model)
                out[name] = hf_weights.read_local(ckpt, key, torch.empty(shape, device="meta"))
        finally:
            ckpt.close()
        return out
    for name in names:
        shape = hf_weights.core_shape(name, cfg.model)
        out[name] = init_region(name, shape, (0,) * len(shape), shape, cfg.model, cfg.seed, torch.device("cpu"))
    return out


def export_weights(run_dir: str | Path, out_dir: str | Path, *, merge: bool = False, step: int | None = None,
                   dtype: str = "bfloat16") -> dict[str, Any]:
    """Write the run's weights (or adapters) to `out_dir`; returns what was written."""
    from meshplan.launcher.core import hf_export, hf_weights

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    torch_dtype = {name: t for t, name in hf_export.EXPORT_DTYPES.items()}.get(dtype)
    if torch_dtype is None:
        raise InputError(f"dtype must be bfloat16, float16 or float32, got {dtype!r}", field="dtype")
    cfg = run_config(run_dir)
    step_dir = checkpoint_dir(cfg, run_dir, step)
    state = hf_export.load_dcp_model_state(step_dir)
    lora = None
    if cfg.finetune in ("lora", "qlora"):
        lora = {"rank": cfg.lora_rank, "alpha": cfg.lora_alpha, "targets": list(cfg.lora_targets)}
        if merge:
            missing = [n for n in hf_weights.core_names(cfg.model) if n not in state]
            state.update(base_weights(cfg, missing))
    elif merge:
        raise InputError("--merge is for LoRA / QLoRA runs; this run trained every weight (its export is the "
                         "full model already)", field="merge")
    base_config = None
    if cfg.init_from and (Path(cfg.init_from) / "config.json").is_file():
        base_config = json.loads((Path(cfg.init_from) / "config.json").read_text())
    hf_export.export_hf(state, cfg.model, out_dir, lora=lora,
                         merge=merge, dtype=torch_dtype, base_config=base_config,
                         base_model_name_or_path=cfg.init_from, max_position_embeddings=cfg.seq_len)
    files = sorted(p.name for p in out_dir.iterdir())
    return {"run_dir": str(run_dir), "checkpoint": str(step_dir), "out_dir": str(out_dir), "files": files,
            "what": ("adapters (PEFT)" if lora and not merge else "merged weights" if merge else "full weights"),
            "finetune": cfg.finetune}
