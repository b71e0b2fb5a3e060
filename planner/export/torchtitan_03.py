"""How a plan maps onto torchtitan 0.3.0's `Trainer.Config` (shared by the `torchtitan-cli` and `torchtitan-py`
exports). Every fact below was read in the 0.3.0 release and is checked against it by
tests/test_torchtitan_030.py:

* A job is a config function's `Trainer.Config` (`--module llama3 --config llama3_8b`), changed by frozen
  `--section.option` flags. `model_spec` (the model, with its Float8 converters) is not on the command line.
* Batch: `training.local_batch_size` sequences per DP rank per accumulation step (split into
  `parallelism.pipeline_parallel_microbatch_size` microbatches when pp > 1), `global_batch_size /
  (local_batch_size * dp_replicate * dp_shard)` accumulation steps: the same as 0.2.x, so the same mapping.
* Pipeline parallelism needs `training.disable_cuda_graphs` (`Trainer.Config.__post_init__` rejects it otherwise).
* AC is a tyro subcommand (`activation-checkpoint:selective|full|none`); SelectiveAC is op-level.
* AdamW values live in `optimizer.param_groups[0].optimizer_kwargs` (lr, betas, eps, weight_decay).
* Async TP is `compile.enable_async_tensor_parallel`.
* The training dtype is `training.dtype` (as in 0.2.x): the Trainer builds the model under that default dtype.
* Float8 is a model converter: `Float8LinearConverter` knows only the rowwise recipes (no tensorwise), MXFP8 is
  `MXFP8LinearConverter`; llama3's output projection is `lm_head` (0.2.x: `output`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.estimator.errors import MeshplanError
from meshplan.planner.export._common import (
    TITAN_MODELS,
    deepep_problem,
    dp_degree,
    estimated_with_fsdp_everywhere,
    preset_of,
    titan_initial_load,
)
from meshplan.planner.export.torchtitan import (
    layers_per_stage,
    local_batch,
    lr_schedule,
    stage_less_layers,
    training_dtype,
)
from meshplan.planner.plan_file import Plan

RELEASE = "0.3.0"
MODULE = "llama3"
# The converter each llama3 config function builds into its model_spec: (class, kwargs) or None.
CONFIG_FLOAT8: dict[str, tuple[str, dict] | None] = {
    "llama3_8b": None,
    "llama3_70b": None,
    "llama3_405b": ("Float8LinearConverter", {"recipe_name": "rowwise", "filter_fqns": ["lm_head"]}),
    "deepseek_v3_16b": None,
    "deepseek_v3_671b": None,
    "qwen3_30b_a3b": None,
}
# the flavor each config function builds (a plan of another flavor of the same module needs the Python export)
CONFIG_FLAVOR = {v.config: v.flavor for k, v in TITAN_MODELS.items() if v.config and k != "qwen3-235b-a22b"}
AC_KINDS = {"selective": "selective", "full": "full", "none": "none"}
PY_FORMAT_HINT = "export with --format torchtitan-py (a Python config function for torchtitan 0.3.0)"


@dataclass(frozen=True)
class Job03:
    """The plan as torchtitan 0.3.0 values, section by section (names as in 0.3.0's dataclasses)."""

    module: str
    config: str
    flavor: str
    training: dict
    parallelism: dict
    optimizer_kwargs: dict
    lr_scheduler: dict
    checkpoint: dict
    compile: dict
    debug: dict
    ac: str
    converter: tuple[str, dict] | None = field(default=None)
    lora: dict | None = field(default=None)  # LoRAConverter.Config values (a model converter, like Float8)


def preset_or_error(plan: Plan, what: str) -> str:
    """The meshplan preset of the plan's model that torchtitan 0.3.0 ships, or a one-line MeshplanError."""
    preset = preset_of(plan)
    shipped = [k for k, v in TITAN_MODELS.items() if v.config]
    if preset is None:
        raise MeshplanError(
            f"{what}: the plan's model ({plan.model.name}) has the shapes of none of the torchtitan {RELEASE} models "
            f"meshplan exports to ({', '.join(shipped)}); torchtitan {RELEASE} builds models from its own registry "
            "only (its other models, such as gpt_oss, are not mapped by meshplan yet)"
        )
    if TITAN_MODELS[preset].config is None:
        raise MeshplanError(
            f"{what}: torchtitan {RELEASE} has no {TITAN_MODELS[preset].name} (it was removed before the release); "
            "export -f torchtitan-toml for torchtitan 0.2.2"
        )
    return preset


def converter(plan: Plan, what: str) -> tuple[str, dict] | None:
    """The 0.3.0 model converter for the plan's Float8 recipe (None for bf16); MeshplanError for tensorwise."""
    p = plan.parallel
    compiled = bool(p.compile) and "model" in p.compile_components  # the model's linears run compiled
    if p.float8 == "none":
        return None
    if p.float8 == "rowwise":
        # MoE: the routers stay in high precision too (torchtitan's deepseek_v3_671b_float8 filters router.gate)
        keep = ["lm_head", "router.gate"] if plan.model.moe is not None else ["lm_head"]
        return "Float8LinearConverter", {"recipe_name": "rowwise", "filter_fqns": keep,
                                         "model_compile_enabled": compiled}
    if p.float8 == "mxfp8":
        # fqns: the Linear layers to convert; "layers" matches every block's and leaves lm_head in bf16
        return "MXFP8LinearConverter", {"fqns": ["layers"], "model_compile_enabled": compiled}
    raise MeshplanError(
        f"{what}: torchtitan {RELEASE} has no {p.float8} Float8 recipe (Float8LinearConverter takes rowwise or "
        "rowwise_with_gw_hp); plan with --float8 rowwise, or export --format torchtitan-toml for torchtitan 0.2.2"
    )


def layout_note(plan: Plan) -> str | None:
    """What torchtitan 0.3.0 runs differently from the estimate for a plan without FSDP (dp_shard x cp = 1) that
    was estimated with a stack of 0.2.2's rules (torchtitan-2026-03 and older), else None. 0.3.0 wraps FSDP2 on every
    layout (models/llama3/parallelize.py: "Always run apply_fsdp_to_decoder -- with shard_degree=1 it is a no-op for
    the all-gather but still installs the MixedPrecisionPolicy"; 00b7f5693, 2026-04-09), so its one-device,
    replicate-only, TP-only and PP-only jobs train bf16 parameters over fp32 state, each block's bf16 copy gathered
    and freed as under FSDP, as the current `torchtitan` stack estimates them; 0.2.2's rules were autocast, or fp32
    compute with TP or PP."""
    p = plan.parallel
    if p.dp_shard * p.cp > 1 or estimated_with_fsdp_everywhere(plan) is not False:
        return None
    if plan.training.dtype == "bfloat16":
        what = "in bf16 throughout"
    elif p.tp > 1 or p.pp > 1:
        what = "in bf16 under FSDP2's MixedPrecisionPolicy (the estimate assumed 0.2.2's fp32 compute for TP or PP " \
               "without FSDP: slower than 0.3.0 runs)"
    else:
        what = "under FSDP2's MixedPrecisionPolicy, not autocast (the estimate's memory and step time are 0.2.2's " \
               "autocast" + (" and DDP" if p.dp_replicate > 1 else "") + ")"
    return (f"torchtitan {RELEASE} wraps FSDP2 on every layout: this plan has no FSDP (dp_shard x cp = 1), so "
            f"{RELEASE} runs it with one shard {what}; torchtitan 0.2.2 (-f torchtitan-toml) runs it as estimated "
            f"(stack {plan.stack}; plan with --stack torchtitan for {RELEASE}'s)")


def attention_note(plan: Plan) -> str | None:
    """What 0.3.0 runs for attention where the plan's estimate timed SDPA (a stack of an older release): FlexAttention,
    every language model's attention since 2026-06-09 (#3571; 0.3.0 refuses "sdpa"), else None."""
    try:
        timed = plan.stack_of().attention_kernel
    except MeshplanError:
        return None
    if timed == "flex":
        return None
    return (f"torchtitan {RELEASE} calls FlexAttention for every language model (attn_backend flex; it refuses "
            f"sdpa), where the estimate timed SDPA (stack {plan.stack}): plan with --stack torchtitan for "
            f"{RELEASE}'s attention time")


def notes(plan: Plan) -> list[str]:
    """What 0.3.0 runs differently from the plan's estimate (its layout without FSDP, its attention)."""
    return [n for n in (layout_note(plan), attention_note(plan)) if n]


def job(plan: Plan, what: str = "torchtitan 0.3.0 export", custom_model: bool = False,
        model: bool = True) -> Job03:
    """The plan's torchtitan 0.3.0 values; MeshplanError when 0.3.0 cannot run this plan as planned.

    custom_model: accept a model that is no llama3 preset (config and flavor are then "": the caller's own
    config function builds it) instead of refusing it.
    model: include the model's Float8 converter (and refuse a recipe 0.3.0 lacks); False for the command line,
    which cannot set the model (see `cli_float8_problem`).
    """
    module = MODULE
    if custom_model and preset_of(plan) is None:
        flavor, config_fn = "", ""
    else:
        titan = TITAN_MODELS[preset_or_error(plan, what)]
        flavor, config_fn, module = titan.flavor, titan.config, titan.module
    p, t, o = plan.parallel, plan.training, plan.training.optimizer
    problem = deepep_problem(plan, RELEASE)
    if problem:
        raise MeshplanError(f"{what}: {problem}")
    conv = converter(plan, what) if model else None
    local_bs, pp_mbs = local_batch(plan)
    training = {"local_batch_size": local_bs, "global_batch_size": t.global_batch_size, "seq_len": t.seq_len,
                "max_norm": float(t.grad_clip), "steps": t.steps}
    if p.cpu_offload:
        training["enable_cpu_offload"] = True  # FSDP2 CPUOffloadPolicy, cuda:nccl,cpu:gloo (trainer.py)
    training.update(training_dtype(plan))  # bf16 parameters, gradients and AdamW state (the model built in bf16)
    lora = lora_converter(plan, what)
    parallelism: dict = {
        "data_parallel_replicate_degree": p.dp_replicate, "data_parallel_shard_degree": p.dp_shard,
        "tensor_parallel_degree": p.tp, "pipeline_parallel_degree": p.pp, "context_parallel_degree": p.cp,
        "pipeline_parallel_schedule": p.pp_schedule,
    }
    if p.fsdp_reshard_after_forward != "default":
        parallelism["fsdp_reshard_after_forward"] = p.fsdp_reshard_after_forward
    if pp_mbs is not None:
        training["disable_cuda_graphs"] = True  # 0.3.0: CUDA graphs do not support pipeline parallelism
        parallelism["pipeline_parallel_microbatch_size"] = pp_mbs
        lps = layers_per_stage(plan)
        if lps is not None:
            parallelism["pipeline_parallel_layers_per_stage"] = lps
        parallelism.update(stage_less_layers(plan))
    if plan.model.moe is not None:
        parallelism["expert_parallel_degree"] = p.ep
        if p.ep > 1:  # 0.3.0: the standard all-to-all dispatcher syncs with the host, which CUDA graphs refuse
            training["disable_cuda_graphs"] = True
    assert dp_degree(plan) * p.cp * p.tp * p.pp == plan.cluster.gpus
    return Job03(
        module=module, config=config_fn, flavor=flavor, training=training, parallelism=parallelism,
        optimizer_kwargs={"lr": float(o.lr), "betas": (float(o.betas[0]), float(o.betas[1])), "eps": float(o.eps),
                          "weight_decay": float(o.weight_decay)},
        lr_scheduler={"total_steps": None, "decay_ratio": None, **lr_schedule(plan)},  # explicit: no leftovers
        checkpoint={"enable": True, "folder": "checkpoint", "interval": t.checkpoint_interval,
                    **{k: v for k, v, _ in titan_initial_load(plan, what)}},
        compile={"enable": bool(p.compile), "enable_async_tensor_parallel": bool(p.async_tp),
                 "components": list(p.compile_components)},
        debug={"seed": t.seed, **({"moe_force_load_balance": True} if t.moe_force_load_balance else {})},
        ac=AC_KINDS[p.ac],
        converter=conv,
        lora=lora,
    )


def lora_converter(plan: Plan, what: str) -> dict | None:
    """0.3.0's LoRAConverter.Config values for a LoRA plan (None otherwise); MeshplanError for QLoRA, which
    0.3.0 lacks, and for q / k / v adapted apart: its llama3 flavors fuse them into one `wqkv` linear."""
    ft = plan.finetune
    if ft is None or ft.mode == "full":
        return None
    if ft.mode == "qlora":
        raise MeshplanError(f"{what}: torchtitan {RELEASE} has no QLoRA (no NF4 base weights; LoRAConverter adapts "
                            "bf16 linears): plan --finetune lora for torchtitan, or launch the QLoRA plan with "
                            "meshplan's core")
    targets = set(ft.lora_targets)
    qkv = targets & {"q", "k", "v"}
    if qkv and qkv != {"q", "k", "v"}:
        raise MeshplanError(f"{what}: torchtitan {RELEASE}'s llama3 fuses q, k and v into one wqkv linear, so LoRA "
                            f"adapts all three or none; the plan adapts {', '.join(sorted(qkv))} only")
    modules = (["wqkv"] if qkv else []) + [{"o": "wo"}.get(t, t) for t in ("o", "w1", "w2", "w3") if t in targets]
    return {"rank": ft.lora_rank, "alpha": float(ft.lora_alpha), "target_modules": modules}


def titan_lora_params(plan: Plan) -> int:
    """The adapter parameters torchtitan 0.3.0's LoRA trains for the plan: like meshplan's, except that the fused
    wqkv has one A (r x hidden) for q, k and v together."""
    from meshplan.estimator.physics.finetune import adapter_params

    ft, m = plan.finetune, plan.model
    total = adapter_params(m, ft.lora_rank, ft.lora_targets)
    if {"q", "k", "v"} <= set(ft.lora_targets):
        total -= 2 * m.layers * ft.lora_rank * m.hidden
    return total


def cli_float8_problem(plan: Plan, j: Job03) -> str | None:
    """Why 0.3.0's command line cannot give this plan its Float8 or LoRA (the model is not on it), or None when
    the config function `j.config` already builds exactly the plan's Float8 (or, for a custom model, it wants
    none)."""
    if plan.finetune is not None and plan.finetune.mode in ("lora", "qlora"):
        return (f"the plan trains LoRA adapters, a model converter torchtitan {RELEASE}'s command line cannot set; "
                f"{PY_FORMAT_HINT}")
    f8 = plan.parallel.float8
    if not j.config:
        return None if f8 == "none" else (
            f"the plan wants Float8 ({f8}), which torchtitan {RELEASE}'s command line cannot set: build it into "
            "the model of your config function (TT_CONFIG)")
    try:
        conv = converter(plan, "")
    except MeshplanError as exc:
        return str(exc).removeprefix(": ")
    want = None if conv is None else (conv[0], {k: v for k, v in conv[1].items() if k != "model_compile_enabled"})
    built_in = CONFIG_FLOAT8[j.config]
    if want == built_in:
        return None
    return (f"the plan wants {_describe(want)} (float8 {f8}) but {j.config}() builds its model with "
            f"{_describe(built_in)}, and torchtitan {RELEASE}'s command line cannot change the model; {PY_FORMAT_HINT}")


def _describe(conv: tuple[str, dict] | None) -> str:
    return "no Float8" if conv is None else f"{conv[0]} {conv[1].get('recipe_name', 'mxfp8')}"
