"""torchtitan 0.2.x export of a plan (`torchtitan-toml`), and the batch / LR / pipeline mapping every torchtitan
export shares (0.3.0's are in torchtitan_03.py, torchtitan_cli.py and torchtitan_py.py).

* `torchtitan-toml`: the job config TOML of torchtitan 0.2.x. v0.2.2 (Feb 2026) is the last release that reads
  TOML (`--job.config_file`); later releases take Python config functions (PR #2386). Key names follow the
  0.2.x `JobConfig` dataclasses (Float8 lives under `[quantize.linear.float8]` since 0.2.0, PR #1763).
  tests/test_torchtitan_real.py parses it with the real 0.2.2 ConfigManager, field by field.

Batch mapping (the estimator's semantics): `micro_batch_size` sequences per forward per DP rank, and
`global_batch_size / (dp * micro_batch_size)` microbatches per step, which are pipeline microbatches when
pp > 1 and gradient-accumulation steps otherwise.
"""

from __future__ import annotations

import json
import math

from meshplan.estimator.config import LOOPED_SCHEDULES
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.physics.stages import less_fields
from meshplan.estimator.rules import predicted_warnings, titan_layers_per_stage
from meshplan.planner.export._common import (
    RESHARD_NOTES,
    TITAN_MODELS,
    check_batch,
    comment,
    deepep_problem,
    describe,
    dp_degree,
    estimated_with_fsdp_everywhere,
    one_line,
    preset_of,
    titan_initial_load,
)
from meshplan.planner.export.env import EnvDefaults
from meshplan.planner.plan_file import Plan

TOML_VERSION = "torchtitan <= 0.2.2"


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise MeshplanError(f"cannot write {v} to TOML")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def layers_per_stage(plan: Plan) -> int | None:
    """`pipeline_parallel_layers_per_stage` that yields the plan's stages per rank, or None for torchtitan's default.

    torchtitan splits into ceil((layers + first + last) / layers_per_stage) virtual stages (the first and last stage
    count the embedding and the output as `pipeline_parallel_first_stage_less_layers` / `..._last_stage_less_layers`
    layers, 1 each by default) and defaults to 2 stages per rank for looped schedules (LOOPED_SCHEDULES) and 1
    otherwise.
    """
    p = plan.parallel
    if p.pp == 1:
        return None
    default = 2 if p.pp_schedule in LOOPED_SCHEDULES else 1
    if p.vpp == default:
        return None
    lps, exact = titan_layers_per_stage(plan.model.layers, p.pp * p.vpp, p.pp_first_stage_less_layers,
                                        p.pp_last_stage_less_layers)
    if exact:
        return int(lps)
    raise MeshplanError(  # a plan file passes estimator.rules first, so only a hand-made Plan gets here
        f"no layers-per-stage gives {p.pp * p.vpp} stages for {plan.model.layers} layers; choose another pp x vpp"
    )


def stage_less_layers(plan: Plan) -> dict[str, int]:
    """torchtitan's `pipeline_parallel_first_stage_less_layers` / `..._last_stage_less_layers` where the plan's
    differ from torchtitan's default (1 each; 0.2.2 and 0.3.0 alike), so a default plan's export reads as before."""
    p = plan.parallel
    if p.pp == 1:
        return {}
    values = less_fields(p.pp_first_stage_less_layers, p.pp_last_stage_less_layers)
    return {"pipeline_parallel_" + f.removeprefix("pp_"): v for f, v in values.items()}


def training_dtype(plan: Plan) -> dict[str, str]:
    """torchtitan's `training.dtype` (0.2.2 and 0.3.0 alike) where the plan's is not the default float32, so a
    default plan's export reads as before."""
    return {"dtype": plan.training.dtype} if plan.training.dtype != "float32" else {}


def lr_schedule(plan: Plan) -> dict:
    """torchtitan's `lr_scheduler` values (0.2.x and 0.3.0 alike): warmup, then the decay, or none ("constant":
    decay_ratio 0 leaves the whole run after warmup stable)."""
    s = plan.training.lr_schedule
    out = {"warmup_steps": s.warmup_steps}
    if s.decay == "constant":
        out |= {"decay_ratio": 0.0, "decay_type": "linear", "min_lr_factor": s.min_lr_ratio}
    else:
        out |= {"decay_type": s.decay, "min_lr_factor": s.min_lr_ratio}
    return out


def local_batch(plan: Plan) -> tuple[int, int | None]:
    """(training.local_batch_size, parallelism.pipeline_parallel_microbatch_size or None) for torchtitan.

    Without PP the local batch is the micro-batch and torchtitan accumulates global / (local * dp) steps; with
    PP every microbatch goes through the pipeline in one step: local batch = global / dp, split into
    micro-batch-sized pipeline microbatches. MeshplanError when the global batch does not divide.
    """
    check_batch(plan)
    p, dp, gbs = plan.parallel, dp_degree(plan), plan.training.global_batch_size
    if p.pp > 1:
        return gbs // dp, p.micro_batch_size
    return p.micro_batch_size, None


def _batch_note(plan: Plan) -> str:
    m, (local_bs, pp_mbs) = check_batch(plan), local_batch(plan)
    p, dp, gbs = plan.parallel, dp_degree(plan), plan.training.global_batch_size
    if pp_mbs is not None:
        return f"per DP rank {local_bs} sequences per step, split into {m} pipeline microbatches of {pp_mbs}"
    note = f"{m} gradient-accumulation steps" if m > 1 else "no gradient accumulation"
    return f"{p.micro_batch_size} sequence(s) per forward per DP rank x dp {dp} x {m} = global batch {gbs} ({note})"


def titan_moe_problem(plan: Plan, release: str) -> str | None:
    """Why torchtitan `release` cannot run this mixture-of-experts plan as planned (None when it can, or when the
    model is dense): torchtitan builds MoE models only from its own flavors."""
    if plan.model.moe is None and plan.model.mla is None:
        return None
    preset = preset_of(plan)
    if preset is None:
        known = ", ".join(f"{k} ({v.name} {v.flavor})" for k, v in TITAN_MODELS.items() if v.name != "llama3")
        return (f"torchtitan {release} builds mixture-of-experts and MLA models from its own flavors only, and none "
                f"of those meshplan exports to has the shapes of {plan.model.name} (its other models, such as "
                f"gpt_oss, are not mapped by meshplan yet); plan one of {known}")
    return deepep_problem(plan, release)



# the attention 0.2.2's flavors call (models/*/__init__.py): DeepSeek-V3's FlexAttention (attn_type "flex"), Llama 3's
# and Qwen3's SDPA (TransformerModelArgs' default); Llama 4's differs by flavor
ATTENTION_022 = {"deepseek_v3": "flex", "llama3": "sdpa", "qwen3": "sdpa"}


def attention_note_022(plan: Plan) -> str | None:
    """What torchtitan 0.2.2 calls for this plan's attention where the estimate timed another kernel (the plan's
    stack's `attention_kernel`), else None."""
    preset = preset_of(plan)
    ran = ATTENTION_022.get(TITAN_MODELS[preset].name) if preset else None
    try:
        timed = plan.stack_of().attention_kernel
    except MeshplanError:
        return None
    if ran is None or ran == timed:
        return None
    names = {"flex": "FlexAttention", "sdpa": "SDPA (cuDNN's or FlashAttention-2's kernel)"}
    return (f"torchtitan 0.2.2's {TITAN_MODELS[preset].flavor} flavor calls {names[ran]}, where the estimate timed "
            f"{names[timed]} (stack {plan.stack}): its attention time differs from the estimate's")


def layout_note_022(plan: Plan) -> str | None:
    """What torchtitan 0.2.2 runs differently from the estimate for a plan without FSDP (dp_shard x cp = 1) that was
    estimated with FSDP2 on every layout (the current `torchtitan` stack: 0.3.0's rules), else None. 0.2.2 wraps FSDP2
    only where it shards (models/llama3/infra/parallelize.py) and leaves the precision to maybe_enable_amp: autocast
    on one GPU and under its DDP, fp32 compute for TP or PP alone."""
    p = plan.parallel
    if p.dp_shard * p.cp > 1 or not estimated_with_fsdp_everywhere(plan):
        return None
    if plan.training.dtype == "bfloat16":
        what = "in bf16 without FSDP" + (" (DDP)" if p.dp_replicate > 1 else "")
    elif p.tp > 1 or p.pp > 1:
        what = "in fp32 (no mixed precision without FSDP in 0.2.2: several times slower than estimated)"
    else:
        what = "under torch.autocast" + (" with DDP" if p.dp_replicate > 1 else "") + ", not FSDP2"
    return (f"this plan has no FSDP (dp_shard x cp = 1): torchtitan 0.2.2 runs it {what}; the estimate is 0.3.0's "
            "(FSDP2 with one shard, stack torchtitan): plan with --stack torchtitan-2026-03 for 0.2.2's, or export "
            "-f torchtitan-cli / torchtitan-py for 0.3.0")


def render_toml(plan: Plan, plan_path: str, env: EnvDefaults | None = None, **_: object) -> str:
    p, t, o = plan.parallel, plan.training, plan.training.optimizer
    problem = titan_moe_problem(plan, "0.2.2")
    if problem:
        raise MeshplanError(f"torchtitan-toml: {problem}")
    if plan.finetune is not None and plan.finetune.mode in ("lora", "qlora"):
        raise MeshplanError(f"torchtitan-toml: torchtitan 0.2.2 has no "
                            f"{ {'lora': 'LoRA', 'qlora': 'QLoRA'}[plan.finetune.mode]}"
                            " (LoRA arrived with 0.3.0's LoRAConverter, QLoRA in neither): export -f torchtitan-py "
                            "for LoRA on 0.3.0, or launch the plan with meshplan's core")
    if any(key == "ddp_alone" for key, _ in predicted_warnings(plan.model, None, plan.rule_fields())):
        raise MeshplanError(f"torchtitan-toml: torchtitan 0.2.2 applies DDP only where dp_replicate is the whole mesh "
                            f"(it raises 'DDP has not supported > 1D parallelism' for dp_replicate {p.dp_replicate} "
                            f"beside tp {p.tp} x pp {p.pp}): plan with dp_shard >= 2 (HSDP), or export -f "
                            "torchtitan-py / torchtitan-cli for 0.3.0, which wraps FSDP2 on it")
    preset = preset_of(plan)
    titan = TITAN_MODELS[preset] if preset else None
    if titan is not None and p.pp > 1 and not titan.pipelining_022:
        raise MeshplanError(f"torchtitan-toml: torchtitan 0.2.2 has no pipeline parallelism for {titan.name} (its "
                            "TrainSpec has no pipelining_fn); plan with pp 1, or export -f torchtitan-py for 0.3.0")
    moe = plan.model.moe is not None
    local_bs, pp_mbs = local_batch(plan)
    c = plan.cluster

    out = comment(f"torchtitan job config exported by meshplan from plan {plan.name}.")
    out += comment(
        f"Targets {TOML_VERSION}: v0.2.2 (Feb 2026) is the last torchtitan release that reads TOML job configs; "
        "torchtitan 0.3.0 takes Python config functions (export with `-f torchtitan-py` or `-f torchtitan-cli`)."
    )
    for line in describe(plan):
        out += comment(line)
    for note in (layout_note_022(plan), attention_note_022(plan)):
        if note:
            out += comment(f"Note: {note}.")
    out += comment(f"plan file: {plan_path}")
    launch = (
        f"torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint HEAD:29500 --rdzv-id {plan.name} -m torchtitan.train --job.config_file THIS.toml"
        if c.nodes > 1
        else f"torchrun --standalone --nnodes 1 --nproc-per-node {c.gpus_per_node} -m torchtitan.train "
        "--job.config_file THIS.toml"
    )
    out += comment(f"Launch (the same on every node): {launch}")

    sections: list[tuple[str, list[tuple[str, object, str]]]] = []
    sections.append(("job", [
        ("dump_folder", "./outputs", ""),
        ("description", one_line(f"meshplan plan {plan.name}: {plan.model.name} on {c.nodes} x {c.gpus_per_node} "
                                 f"{plan.hardware.id}"), ""),
    ]))
    model: list[tuple[str, object, str]] = [("name", titan.name if titan else "llama3", "")]
    if titan:
        model += [("flavor", titan.flavor, ""),
                  ("hf_assets_path", titan.assets, "tokenizer files (scripts/download_hf_assets.py)")]
    else:
        model += [("flavor", "custom", "not a torchtitan flavor: register one with the shapes below"),
                  ("hf_assets_path", "./assets/hf/Llama-3.1-8B", "a llama3 tokenizer; change for other vocabularies")]
    if p.float8 in ("tensorwise", "rowwise"):
        model.append(("converters", ["quantize.linear.float8"], ""))
    elif p.float8 == "mxfp8":
        model.append(("converters", ["quantize.linear.mx"], ""))
    sections.append(("model", model))
    sections.append(("optimizer", [
        ("name", "AdamW", ""), ("lr", float(o.lr), ""), ("beta1", float(o.betas[0]), ""),
        ("beta2", float(o.betas[1]), ""), ("eps", float(o.eps), ""), ("weight_decay", float(o.weight_decay), ""),
    ]))
    lr = lr_schedule(plan)
    sections.append(("lr_scheduler", [
        (k, v, "no decay: constant after warmup" if k == "decay_ratio" else "") for k, v in lr.items()
    ]))
    sections.append(("training", [
        ("local_batch_size", local_bs, _batch_note(plan)),
        ("global_batch_size", t.global_batch_size, "sequences per optimizer step"),
        ("seq_len", t.seq_len, ""),
        ("max_norm", float(t.grad_clip), "gradient clipping"),
        ("steps", t.steps, f"{plan.tokens_per_step * t.steps:,} tokens"),
        ("dataset", "c4", "torchtitan's default; point it at your data"),
        *([("enable_cpu_offload", True, "FSDP2 CPUOffloadPolicy: params, grads, optimizer state on the host")]
          if p.cpu_offload else []),
        *[(k, v, "parameters, gradients and AdamW state in bf16, no fp32 master copy")
          for k, v in training_dtype(plan).items()],
    ]))
    par: list[tuple[str, object, str]] = [
        ("data_parallel_replicate_degree", p.dp_replicate, ""),
        ("data_parallel_shard_degree", p.dp_shard, ""),
        ("tensor_parallel_degree", p.tp, ""),
        ("enable_async_tensor_parallel", p.async_tp, "needs compile" if p.async_tp else ""),
        ("pipeline_parallel_degree", p.pp, ""),
        ("pipeline_parallel_schedule", p.pp_schedule, ""),
        ("context_parallel_degree", p.cp, ""),
    ]
    if p.fsdp_reshard_after_forward != "default":
        par.append(("fsdp_reshard_after_forward", p.fsdp_reshard_after_forward, RESHARD_NOTES[p.fsdp_reshard_after_forward]))
    if moe:  # torchtitan 0.2.2 carves EP from dp_shard x cp (x tp with expert_tensor_parallel_degree 1, as planned)
        par += [("expert_parallel_degree", p.ep, f"{plan.model.moe.experts // p.ep} of {plan.model.moe.experts} "
                 "routed experts per GPU"),
                ("expert_tensor_parallel_degree", 1, "experts whole on each EP rank (torchtitan 0.3's only mode)")]
        if p.uses_deepep:
            par.append(("expert_parallel_comm_backend", p.expert_parallel_comm_backend,
                        "DeepEP's dispatch and combine kernels (the deep_ep package must be installed)"))
    if pp_mbs is not None:
        par.append(("pipeline_parallel_microbatch_size", pp_mbs, ""))
        lps = layers_per_stage(plan)
        if lps is not None:
            par.append(("pipeline_parallel_layers_per_stage", lps, f"{p.vpp} stages per rank"))
        par += [(k, v, f"the {k.split('_')[2]} stage holds {v} blocks fewer than its share of the split "
                 "(torchtitan's default: 1)") for k, v in stage_less_layers(plan).items()]
    sections.append(("parallelism", par))
    sections.append(("checkpoint", [
        ("enable", True, "DCP checkpoints; a restarted job resumes from the latest"),
        ("folder", "checkpoint", ""),
        ("interval", t.checkpoint_interval, ""),
        *titan_initial_load(plan, "torchtitan-toml"),
    ]))
    ac: list[tuple[str, object, str]] = [("mode", p.ac, "")]
    if p.ac == "selective":
        ac.append(("selective_ac_option", "op", "op-level selective AC, as the estimate assumes"))
    sections.append(("activation_checkpoint", ac))
    sections.append(("compile", [("enable", p.compile, "torch.compile of the components below"),
                                 ("components", list(p.compile_components), "model: each block; loss: the loss")]))
    high_precision = ["output", "router.gate"] if moe else ["output"]
    high_note = "keep the output projection" + (" and the MoE routers" if moe else "") + " in bf16"
    if p.float8 == "tensorwise":
        sections.append(("quantize.linear.float8", [
            ("enable_fsdp_float8_all_gather", True, ""),
            ("precompute_float8_dynamic_scale_for_fsdp", True, ""),
            ("filter_fqns", high_precision, high_note),
        ]))
    elif p.float8 == "rowwise":
        sections.append(("quantize.linear.float8", [
            ("recipe_name", "rowwise", ""),
            ("filter_fqns", high_precision, high_note),
        ]))
    elif p.float8 == "mxfp8":
        sections.append(("quantize.linear.mx", [
            ("recipe_name", "mxfp8_cublas", ""),
            ("filter_fqns", high_precision, high_note),
        ]))
    debug: list[tuple[str, object, str]] = [("seed", t.seed, "")]
    if t.moe_force_load_balance:
        debug.append(("moe_force_load_balance", True, "round-robin routing, every expert the same rows (benchmark)"))
    sections.append(("debug", debug))

    for name, items in sections:
        out.append("")
        out.append(f"[{name}]")
        if name == "model" and not preset:
            m = plan.model
            out += comment(
                f"custom model {m.name}: layers {m.layers}, hidden {m.hidden}, heads {m.heads}, kv_heads "
                f"{m.kv_heads}, ffn_hidden {m.ffn_hidden}, vocab {m.vocab}, head_dim {m.d_head}; add these as a "
                "'custom' entry of llama3's flavor table (torchtitan/models/llama3/__init__.py) or pick the "
                "closest flavor."
            )
        for key, value, note in items:
            line = f"{key} = {_toml_value(value)}"
            out.append(line + (f"  # {one_line(note)}" if note else ""))
    return "\n".join(out) + "\n"
