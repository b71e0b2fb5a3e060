"""The training core's run configuration for a plan file (no torch import here).

`meshplan launch` copies the plan into the run directory and every rank runs
`python -m meshplan.launcher.run_plan --plan RUN_DIR/plan.yaml`; this maps the plan onto the core's RunConfig
fields one-to-one (the parallel names are torchtitan's on both sides).
"""

from __future__ import annotations

from pathlib import Path

from meshplan.planner.plan_file import Plan, plan_fingerprint


def run_config_fields(plan: Plan, run_dir: str | Path | None = None, steps: int | None = None,
                      device: str | None = None) -> dict:
    """A mapping for `launcher.core.config.RunConfig.from_dict`."""
    p, t = plan.parallel, plan.training
    fields = {
        "model": plan.model.model_dump(),
        "dp_replicate": p.dp_replicate,
        "dp_shard": p.dp_shard,
        "cp": p.cp,
        "tp": p.tp,
        "pp": p.pp,
        "ep": p.ep,
        "pp_schedule": p.pp_schedule,
        "vpp": p.vpp,
        "pp_first_stage_less_layers": p.pp_first_stage_less_layers,
        "pp_last_stage_less_layers": p.pp_last_stage_less_layers,
        "micro_batch_size": p.micro_batch_size,
        "global_batch_size": t.global_batch_size,
        "seq_len": t.seq_len,
        "ac": p.ac,
        "compile": p.compile,
        "compile_components": list(p.compile_components),
        "moe_force_balance": t.moe_force_load_balance,
        "float8": p.float8,
        "async_tp": p.async_tp,
        "steps": steps or t.steps,
        "lr": t.optimizer.lr,
        "betas": list(t.optimizer.betas),
        "eps": t.optimizer.eps,
        "warmup_steps": min(t.lr_schedule.warmup_steps, max(0, (steps or t.steps) - 1)),
        "decay": t.lr_schedule.decay,
        "min_lr_ratio": t.lr_schedule.min_lr_ratio,
        "weight_decay": t.optimizer.weight_decay,
        "peak_flops": plan.hardware.peak_tflops_bf16 * 1e12,
        "fingerprint": plan_fingerprint(plan),
        "grad_clip": t.grad_clip,
        "seed": t.seed,
        "checkpoint_interval": t.checkpoint_interval,
        "cpu_offload": p.cpu_offload,
        "fsdp_reshard_after_forward": p.fsdp_reshard_after_forward,
        "dtype": t.dtype,
        # the plan's framework release wraps FSDP2 where nothing shards (torchtitan since 2026-04): so does the core,
        # and the run trains as the plan was estimated (bf16 through FSDP2's MixedPrecisionPolicy, not autocast/fp32)
        "fsdp_one_rank": plan.stack_of().fsdp_every_layout,
    }
    ft = plan.finetune
    if ft is not None:
        fields.update(finetune=ft.mode, init_from=ft.init_from, lora_rank=ft.lora_rank, lora_alpha=ft.lora_alpha,
                      lora_targets=list(ft.lora_targets))
    if run_dir is not None:
        fields["run_dir"] = str(run_dir)
    if device is not None:
        fields["device"] = device
    return fields
