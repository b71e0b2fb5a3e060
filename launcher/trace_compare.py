"""The traced memory next to the analytical model: per traced rank, each tensor-level term both ways and the
relative error; and the `meshplan trace PLAN` report for a plan file (see launcher/trace.py for what is traced).
"""

from __future__ import annotations

from typing import Any

from meshplan.estimator.errors import MeshplanError
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.trace import Progress, TraceResult, trace_config

# --- next to the analytical model -------------------------------------------------------------------------
COMPARED = ("params", "grads", "optimizer", "unsharded_params", "activations", "total")
OFFLOAD_COMPARED = ("offloaded", "total")  # CPU offload: what leaves the GPU, and what stays


def analytical_terms(cfg: RunConfig, hw: Any, stack: Any, pp_rank: int, offload: bool = False) -> dict[str, float]:
    """The estimator's tensor-level terms (bytes) for pipeline stage `pp_rank` of the traced config (a MoE config
    routed round-robin, as the trace routes it, is estimated without the stack's load imbalance)."""
    from meshplan.estimator.batch import ConfigArrays, estimate_arrays
    from meshplan.estimator.config import TrainConfig

    tc = TrainConfig(
        gpus=cfg.world_size, gpus_per_node=min(hw.gpus_per_node, cfg.world_size), dp_replicate=cfg.dp_replicate,
        dp_shard=cfg.dp_shard, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp, ep=cfg.ep, pp_schedule=cfg.pp_schedule, vpp=cfg.vpp,
        pp_first_stage_less_layers=cfg.pp_first_stage_less_layers, pp_last_stage_less_layers=cfg.pp_last_stage_less_layers,
        seq_len=cfg.seq_len, global_batch_size=cfg.global_batch_size, micro_batch_size=cfg.micro_batch_size,
        ac=cfg.ac, compile=False, float8="none", async_tp=False, finetune=cfg.finetune, lora_rank=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets, cpu_offload=offload, dtype=cfg.dtype,
        fsdp_reshard_after_forward=cfg.fsdp_reshard_after_forward, moe_force_load_balance=cfg.moe_force_balance,
    ).resolve(cfg.model, hw)
    r = estimate_arrays(cfg.model, hw, stack, ConfigArrays.from_configs([tc]), stage=pp_rank)
    return {k: float(v[0]) for k, v in r.items()}


def compare(result: TraceResult, hw: Any, stack: Any) -> list[dict[str, Any]]:
    """Per traced rank, the traced and analytical bytes of each compared quantity and the relative error
    (analytical / traced - 1).

    params / grads: sharded fp32 (exact); optimizer: AdamW exp_avg + exp_avg_sq, plus the 4-byte step
    counter AdamW keeps per parameter tensor (too small to model; added to the analytical side);
    unsharded_params: the maximum of all-gathered bf16 params + all-gather buffers; activations: what the
    forward leaves saved for backward at the end of a microbatch's forward (in-flight microbatches
    included, the stage output excluded; without FSDP on one device or under DDP, autocast's bf16 weight copies
    too, on both sides; under DDP its gradient buckets, not traced, are taken out of the analytical grads and
    total); total: tensor memory at the step-2 peak vs the analytical
    allocated (pre-fragmentation) memory. Under LoRA `params` is the frozen weights and the adapters together.
    Under CPU offload (traced without it) two more rows: `offloaded`, the traced sharded state vs the model's
    host bytes per rank, and `total`, the traced peak without that state vs the model's GPU peak with offload."""
    cfg = RunConfig.from_dict(result.config)
    rows = []
    for r in result.ranks:
        a = analytical_terms(cfg, hw, stack, r.pp_rank)
        traced = {
            "params": r.state["params"],
            "grads": r.state["grads"],
            "optimizer": r.state["optimizer"],
            "unsharded_params": r.category_max["unsharded_params"],
            "activations": r.saved_activations,
            "total": r.peak_total,
        }
        model = {
            "params": a["params_fp32"] + a["frozen_params"],
            "grads": a["grads_after_backward"],
            "optimizer": a["optimizer_states"] + 4 * r.param_tensors,
            "unsharded_params": a["unsharded_params_max"],
            # autocast's weight copies, cached to the loss and saved for backward, are saved tensors to the trace
            "activations": a["saved_activations"] + a["weight_copies"],
            "total": a["allocated_bytes"],
        }
        if cfg.ddp:  # DDP's gradient buckets are not traced (DDP is not applied under fake tensors): out of both sides
            buckets = ddp_bucket_bytes(cfg, stack, a["grads_after_backward"])
            model["grads"] -= buckets
            model["total"] -= buckets
        row = {
            "rank": r.rank,
            "pp_rank": r.pp_rank,
            "traced": traced,
            "analytical": model,
            "error": {k: (model[k] / traced[k] - 1) if traced[k] else 0.0 for k in COMPARED},
            "peak": r.peak,
        }
        if result.offload:
            off = analytical_terms(cfg, hw, stack, r.pp_rank, offload=True)
            state = r.state["params"] + r.state["grads"] + r.state["optimizer"]
            at_peak = r.peak["params"] + r.peak["grads"] + r.peak["optimizer"]
            t_off = {"offloaded": state, "total": r.peak_total - at_peak}
            m_off = {"offloaded": off["host_offload_bytes_per_node"] / min(hw.gpus_per_node, cfg.world_size)
                     + 4 * r.param_tensors, "total": off["allocated_bytes"]}
            row["offload"] = {"traced": t_off, "analytical": m_off,
                              "error": {k: (m_off[k] / t_off[k] - 1) if t_off[k] else 0.0 for k in OFFLOAD_COMPARED}}
        rows.append(row)
    return rows


def ddp_bucket_bytes(cfg: RunConfig, stack: Any, grads_bytes: float) -> float:
    """Bytes of DDP's gradient buckets within the estimator's gradient bytes `grads_bytes` of a DDP rank: a copy of
    every gradient beside it (gradient_as_bucket_view off), bf16 for bf16 training, `replicated_state.grad_buckets`
    bytes a parameter against `grads` bytes otherwise."""
    rs = stack.replicated_state
    share = 0.5 if cfg.dtype == "bfloat16" else rs.grad_buckets / max(rs.grads + rs.grad_buckets, 1e-9)
    return grads_bytes * share


def embedding_partial_bytes(cfg: RunConfig, pp_rank: int) -> int:
    """Bytes of stage `pp_rank` that the analytical model leaves out: the TP embedding's full-vocabulary
    gradient under PP (`estimator.report.embedding_partial_bytes`; fp32 reduce, as the trace runs), on
    the first stage only."""
    from meshplan.estimator.report import embedding_partial_bytes as partial

    if pp_rank != 0:
        return 0
    return int(partial(cfg.model, cfg.tp, cfg.pp, cfg.microbatches, reduce_bytes=4.0))


# --- plan files -----------------------------------------------------------------------------------------
def run_config_for_plan(plan: Any) -> RunConfig:
    """The training core's RunConfig for a plan (MeshplanError when the core rejects it)."""
    from meshplan.launcher.plan_run import run_config_fields

    try:
        return RunConfig.from_dict(run_config_fields(plan, steps=2, device="cpu"))
    except ValueError as exc:
        raise MeshplanError(str(exc)) from None


def trace_plan(plan: Any, progress: Progress | None = None) -> dict[str, Any]:
    """Trace a plan and put the analytical model's tensor-level terms next to it (the `--json` object)."""
    result = trace_config(run_config_for_plan(plan), progress)
    stack = plan.stack_of()
    rows = compare(result, plan.hardware, stack)
    cfg = RunConfig.from_dict(result.config)
    for row in rows:
        row["unmodelled_embedding_gradient"] = embedding_partial_bytes(cfg, row["pp_rank"])
    worst = max(rows, key=lambda r: r["traced"]["total"])
    notes = list(result.notes)
    return {
        "plan": plan.name,
        "model": plan.model.name,
        "config": {**{k: result.config[k] for k in (
            "dp_replicate", "dp_shard", "cp", "tp", "pp", "pp_schedule", "micro_batch_size",
            "global_batch_size", "seq_len", "ac", "finetune")}, "cpu_offload": result.offload,
            **({"dtype": result.config["dtype"]} if result.config["dtype"] != "float32" else {}),
            **({"fsdp_reshard_after_forward": result.config["fsdp_reshard_after_forward"]}
               if result.config.get("fsdp_reshard_after_forward", "default") != "default" else {})},
        "traced_ranks": [{"rank": r["rank"], "pp_rank": r["pp_rank"]} for r in rows],
        "worst_rank": worst["rank"],
        "ranks": rows,
        "notes": notes,
        "seconds": round(result.seconds, 2),
        "max_rss_mib": round(result.max_rss_mib, 1),
    }
