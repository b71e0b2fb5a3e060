"""torchtitan exports of a plan, in the two forms in use.

* `torchtitan-toml`: the job config TOML of torchtitan 0.2.x. v0.2.2 (Feb 2026) is the last release that reads
  TOML (`--job.config_file`); later releases take Python config functions (PR #2386). Key names follow the
  0.2.x `JobConfig` dataclasses (Float8 lives under `[quantize.linear.float8]` since 0.2.0, PR #1763).
* `torchtitan-cli`: the torchtitan 0.3 command line, `torchrun ... -m torchtitan.train --module llama3
  --config llama3_8b --section.option ...`. In 0.3 the `--section.option` flags are frozen (kept for
  compatibility, slated for removal), async TP moved to `--compile.enable_async_tensor_parallel`
  (PR #4045) and the batch is given in tokens (PR #4121). Float8 is part of the model config, which 0.3
  keeps off the command line, so it is a comment there.

Batch mapping (the estimator's semantics): `micro_batch_size` sequences per forward per DP rank, and
`global_batch_size / (dp * micro_batch_size)` microbatches per step, which are pipeline microbatches when
pp > 1 and gradient-accumulation steps otherwise.
"""

from __future__ import annotations

import json
import math

from estimator.errors import MeshplanError
from planner.export._common import (
    LLAMA3_PRESETS,
    check_batch,
    comment,
    describe,
    dp_degree,
    env_lines,
    one_line,
    preset_of,
    q,
)
from planner.export.env import EnvDefaults
from planner.export.scripts import continued, header, rendezvous_block, torchrun_args
from planner.plan_file import Plan

TOML_VERSION = "torchtitan <= 0.2.2"
CLI_VERSION = "torchtitan 0.3"


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

    torchtitan splits into ceil((layers + 2) / layers_per_stage) virtual stages (the first and last stage count
    the embedding and the output as one layer each) and defaults to 2 stages per rank for looped schedules
    (Interleaved1F1B) and 1 otherwise.
    """
    p = plan.parallel
    if p.pp == 1:
        return None
    default = 2 if p.pp_schedule == "Interleaved1F1B" else 1
    if p.vpp == default:
        return None
    target, total = p.pp * p.vpp, plan.model.layers + 2
    for lps in range(1, total + 1):
        if math.ceil(total / lps) == target:
            return lps
    raise MeshplanError(
        f"no layers-per-stage gives {target} stages for {plan.model.layers} layers; choose another pp x vpp"
    )


def _lr(plan: Plan) -> dict:
    s = plan.training.lr_schedule
    out = {"warmup_steps": s.warmup_steps}
    if s.decay == "constant":
        out |= {"decay_ratio": 0.0, "decay_type": "linear", "min_lr_factor": s.min_lr_ratio}
    else:
        out |= {"decay_type": s.decay, "min_lr_factor": s.min_lr_ratio}
    return out


def _batch(plan: Plan) -> tuple[int, int | None, list[str]]:
    """(local_batch_size, pipeline_parallel_microbatch_size or None, comment) for torchtitan 0.2."""
    m = check_batch(plan)
    p, dp, gbs = plan.parallel, dp_degree(plan), plan.training.global_batch_size
    if p.pp > 1:
        return gbs // dp, p.micro_batch_size, [
            f"per DP rank {gbs // dp} sequences per step, split into {m} pipeline microbatches of {p.micro_batch_size}"
        ]
    note = f"{m} gradient-accumulation steps" if m > 1 else "no gradient accumulation"
    return p.micro_batch_size, None, [
        f"{p.micro_batch_size} sequence(s) per forward per DP rank x dp {dp} x {m} = global batch {gbs} ({note})"
    ]


def render_toml(plan: Plan, plan_path: str, env: EnvDefaults | None = None, **_: object) -> str:
    p, t, o = plan.parallel, plan.training, plan.training.optimizer
    preset = preset_of(plan)
    local_bs, pp_mbs, batch_note = _batch(plan)
    c = plan.cluster

    out = comment(f"torchtitan job config exported by meshplan from plan {plan.name}.")
    out += comment(
        f"Targets {TOML_VERSION}: v0.2.2 (Feb 2026) is the last torchtitan release that reads TOML job configs; "
        "torchtitan 0.3 takes Python config functions (export with `-f torchtitan-cli`)."
    )
    for line in describe(plan):
        out += comment(line)
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
    model: list[tuple[str, object, str]] = [("name", "llama3", "")]
    if preset:
        flavor, _cfg, assets = LLAMA3_PRESETS[preset]
        model += [("flavor", flavor, ""), ("hf_assets_path", assets, "tokenizer files (scripts/download_hf_assets.py)")]
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
    lr = _lr(plan)
    sections.append(("lr_scheduler", [
        (k, v, "no decay: constant after warmup" if k == "decay_ratio" else "") for k, v in lr.items()
    ]))
    sections.append(("training", [
        ("local_batch_size", local_bs, batch_note[0]),
        ("global_batch_size", t.global_batch_size, "sequences per optimizer step"),
        ("seq_len", t.seq_len, ""),
        ("max_norm", float(t.grad_clip), "gradient clipping"),
        ("steps", t.steps, f"{plan.tokens_per_step * t.steps:,} tokens"),
        ("dataset", "c4", "torchtitan's default; point it at your data"),
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
    if pp_mbs is not None:
        par.append(("pipeline_parallel_microbatch_size", pp_mbs, ""))
        lps = layers_per_stage(plan)
        if lps is not None:
            par.append(("pipeline_parallel_layers_per_stage", lps, f"{p.vpp} stages per rank"))
    sections.append(("parallelism", par))
    sections.append(("checkpoint", [
        ("enable", True, "DCP checkpoints; a restarted job resumes from the latest"),
        ("folder", "checkpoint", ""),
        ("interval", t.checkpoint_interval, ""),
    ]))
    ac: list[tuple[str, object, str]] = [("mode", p.ac, "")]
    if p.ac == "selective":
        ac.append(("selective_ac_option", "op", "op-level selective AC, as the estimate assumes"))
    sections.append(("activation_checkpoint", ac))
    sections.append(("compile", [("enable", p.compile, "per-block torch.compile"),
                                 ("components", ["model", "loss"], "")]))
    if p.float8 == "tensorwise":
        sections.append(("quantize.linear.float8", [
            ("enable_fsdp_float8_all_gather", True, ""),
            ("precompute_float8_dynamic_scale_for_fsdp", True, ""),
            ("filter_fqns", ["output"], "keep the output projection in bf16"),
        ]))
    elif p.float8 == "rowwise":
        sections.append(("quantize.linear.float8", [
            ("recipe_name", "rowwise", ""),
            ("filter_fqns", ["output"], "keep the output projection in bf16"),
        ]))
    elif p.float8 == "mxfp8":
        sections.append(("quantize.linear.mx", [
            ("recipe_name", "mxfp8_cublas", ""),
            ("filter_fqns", ["output"], "keep the output projection in bf16"),
        ]))
    sections.append(("debug", [("seed", t.seed, "")]))

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


def cli_overrides(plan: Plan) -> list[str]:
    """The `--section.option value` flags of torchtitan 0.3 for this plan (values already shell-quoted)."""
    p, t, o = plan.parallel, plan.training, plan.training.optimizer
    m = check_batch(plan)

    def flag(name: str, on: bool) -> str:
        section, _, key = name.rpartition(".")
        return f"--{name}" if on else f"--{section}.no_{key}"

    args = [
        f"--parallelism.data_parallel_replicate_degree {p.dp_replicate}",
        f"--parallelism.data_parallel_shard_degree {p.dp_shard}",
        f"--parallelism.tensor_parallel_degree {p.tp}",
        f"--parallelism.pipeline_parallel_degree {p.pp}",
        f"--parallelism.context_parallel_degree {p.cp}",
    ]
    if p.pp > 1:
        args.append(f"--parallelism.pipeline_parallel_schedule {q(p.pp_schedule)}")
        args.append(f"--parallelism.num_pp_microbatches {m}")
        lps = layers_per_stage(plan)
        if lps is not None:
            args.append(f"--parallelism.pipeline_parallel_layers_per_stage {lps}")
    args += [
        f"--training.max_context_length {t.seq_len}",
        f"--training.num_tokens_per_microbatch_per_dp_rank {p.micro_batch_size * t.seq_len}",
        f"--training.num_tokens_per_train_step {plan.tokens_per_step}",
        f"--training.steps {t.steps}",
        f"--training.max_norm {float(t.grad_clip)!r}",
        f"--optimizer.lr {float(o.lr)!r}",
        f"--optimizer.beta1 {float(o.betas[0])!r}",
        f"--optimizer.beta2 {float(o.betas[1])!r}",
        f"--optimizer.eps {float(o.eps)!r}",
        f"--optimizer.weight_decay {float(o.weight_decay)!r}",
    ]
    args += [f"--lr_scheduler.{k} {q(v) if isinstance(v, str) else repr(v)}" for k, v in _lr(plan).items()]
    args += [
        f"--activation_checkpoint.mode {q(p.ac)}",
        flag("compile.enable", p.compile),
    ]
    if p.tp > 1:
        args.append(flag("compile.enable_async_tensor_parallel", p.async_tp))
    args += [
        flag("checkpoint.enable", True),
        f"--checkpoint.interval {t.checkpoint_interval}",
        f"--debug.seed {t.seed}",
    ]
    return args


def render_cli(plan: Plan, plan_path: str, env: EnvDefaults, max_restarts: int = 0, **_: object) -> str:
    p = plan.parallel
    preset = preset_of(plan)
    n = plan.cluster.nodes
    usage = [
        f"{CLI_VERSION} command line (--module/--config registry; its --section.option flags are frozen and",
        "slated for removal, so check them once with `python -m torchtitan.config.manager ARGS` on your version).",
        "For torchtitan <= 0.2.2 use the TOML export (-f torchtitan-toml) instead.",
        "Run this same script on every node" + (": MESHPLAN_RDZV_HOST=<address of one node> ./THIS_SCRIPT"
                                                 if n > 1 else " (single node): ./THIS_SCRIPT"),
        "TT_MODULE / TT_CONFIG override the config function the flags below are applied to.",
    ]
    if p.float8 != "none":
        usage.append(
            f"Float8 ({p.float8}) is part of the model config in 0.3, which the CLI cannot set: use a config "
            "function that enables it (TT_MODULE/TT_CONFIG)."
        )
    lines = header(plan, f"torchtitan 0.3 ({plan.cluster.nodes} x {plan.cluster.gpus_per_node} GPUs)", plan_path, usage)
    lines += ["set -euo pipefail", ""]
    lines += env_lines(env.for_backend("torchrun")) + [""]
    lines.append('tt_module="${TT_MODULE:-llama3}"')
    if preset:
        lines.append(f'tt_config="${{TT_CONFIG:-{LLAMA3_PRESETS[preset][1]}}}"')
    else:
        lines.append('tt_config="${TT_CONFIG:-}"')
        lines += [
            'if [ -z "$tt_config" ]; then',
            '  echo "meshplan: the plan\'s model is not a torchtitan llama3 preset; set TT_CONFIG to a config'
            ' function that builds it (TT_MODULE: its module)" >&2',
            "  exit 2",
            "fi",
        ]
    lines += rendezvous_block(plan, max_restarts) + [""]
    lines += continued(
        "exec torchrun",
        torchrun_args(plan) + ['-m torchtitan.train --module "$tt_module" --config "$tt_config"'] + cli_overrides(plan),
    )
    return "\n".join(lines) + "\n"

