"""One configuration in, one report out: the object `meshplan estimate --json` prints."""

from __future__ import annotations

from meshplan.estimator import intervals
from meshplan.estimator.batch import (
    GIB,
    MEMORY_CATEGORIES,
    PEAK_PHASES,
    TIME_CATEGORIES,
    ConfigArrays,
    estimate_arrays,
)
from meshplan.estimator.config import TrainConfig
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.compute import attention_kernel
from meshplan.estimator.physics.shapes import split_blocks
from meshplan.estimator.physics.stages import less_fields
from meshplan.estimator.stack import StackProfile, load_stack

FLOP_CONVENTION = ("6*(N_active - N_embedding) + 12*L*h*s per token (torchtitan; a MoE model's top-k experts; "
                   "MLA: 6*L*(q+v)*s; full attention, no recompute)")


GIB_DECIMALS = 3  # GiB figures are rounded once, to this many decimals, wherever they are reported


SHARE_TOLERANCE = 0.01  # a share within a point of the calibrated largest is within the fitted range


def _r(x: float, nd: int = GIB_DECIMALS) -> float:
    return round(float(x), nd)


def embedding_partial_bytes(model: ModelSpec, tp: int, pp: int, microbatches: int, reduce_bytes: float) -> float:
    """Bytes the first pipeline stage may hold beyond the model's peak (README, trace grid): with TP, DTensor
    has no vocab-sharded rule for the embedding's backward, so its weight gradient is a Partial of the whole
    vocabulary (bf16; the model counts it at the end of the backward), and with PP FSDP2 accumulates it
    unsharded in the reduce dtype across the schedule's no-sync microbatches, where the model counts only
    the TP-local (vocab / tp) share."""
    if tp == 1 or pp == 1 or microbatches == 1:
        return 0.0
    return reduce_bytes * float(model.vocab * model.hidden) * (1 - 1 / tp)


def estimate(
    model: ModelSpec,
    hw: HardwareProfile,
    config: TrainConfig,
    stack: StackProfile | None = None,
    memory_margin: float = 1.0,
) -> dict:
    """Estimate one configuration. `config` is resolved here (MeshplanError on invalid input).

    `memory_margin`: fraction of usable HBM that the peak may reach for `memory.fits` (1.0: all of it).
    Returns a JSON-ready dict (GiB, seconds, tokens/s, MFU as a fraction 0..1). `*_interval` fields are 80 %
    intervals [low, high] and `memory.fit_probability` the chance the measured peak stays within the limit, both
    from the estimator's cross-validated error (:mod:`meshplan.estimator.intervals`).
    """
    stack = stack or load_stack("torchtitan")
    from meshplan.estimator import rules

    lifted = rules.stack_skips(stack)  # torchtitan's rules this stack does not have
    cfg = config.resolve(model, hw, lifted)
    one = ConfigArrays.single(cfg)
    r = {k: float(v) for k, v in estimate_arrays(model, hw, stack, one).items()}
    usable = hw.usable_hbm_gib
    peak = r["peak_bytes"] / GIB
    host = r["host_bytes_per_node"] / GIB
    warnings: list[str] = list(model.notes)  # what the model spec leaves out (a vision tower, sliding windows)
    for key, w in rules.predicted_warnings(model, hw, cfg.rule_fields(), one):
        if key in lifted:
            continue
        if key == "pp_microbatches":
            w += f"; predicted anyway: the bubble is {r['pp_bubble'] / max(r['step_time_s'], 1e-12):.0%} of the step"
        elif key == "fp32_without_fsdp":
            w += f"; predicted as it runs: MFU {r['mfu']:.0%}"
        elif key == "ddp_alone":
            w += "; the figures are those of a layout this release refuses"
        warnings.append(w)
    if peak > usable * memory_margin:
        warnings.append(
            f"peak {peak:.1f} GiB exceeds {memory_margin * 100:.0f}% of usable HBM ({usable * memory_margin:.1f} GiB): OOM"
        )
    elif peak > 0.9 * usable:
        warnings.append(f"peak {peak:.1f} GiB is within 10% of usable HBM ({usable:.1f} GiB): little headroom")
    if host > hw.host_ram_gib_per_node:
        warnings.append(f"host RAM {host:.0f} GiB per node exceeds the node's {hw.host_ram_gib_per_node:.0f} GiB")
    full_load = r["host_full_load_bytes_per_node"] / GIB
    if full_load > hw.host_ram_gib_per_node:
        warnings.append(
            f"loading the whole bf16 checkpoint on every rank would need {full_load:.0f} GiB host RAM per node; "
            "load it sharded (meshplan launch --init-from reads each rank's slices)"
            if cfg.finetune != "none" else
            f"loading a full fp32 checkpoint on every rank would need {full_load:.0f} GiB host RAM per node; "
            "load sharded (DCP) or from a seed checkpoint"
        )
    fsdp_share = r["fsdp_overhead_s"] / max(r["step_time_s"], 1e-12)
    moe = model.moe is not None
    tps_interval, extrapolated = fsdp_overhead_interval(r, stack, fsdp_share, moe)
    if extrapolated:
        warnings.append(extrapolated)
    t = intervals.table("tokens_per_sec_per_gpu", stack.id, moe=True) if moe else None
    if t is not None and intervals.moe_table("tokens_per_sec_per_gpu") is not None:
        warnings.append(
            f"mixture of experts: tokens/s/GPU is less certain than a dense model's; its 80 % interval "
            f"({t.ratio(0.1):.2f}-{t.ratio(0.9):.2f} x the estimate) comes from {t.rows} published MoE runs the "
            "estimator was never fitted to, never narrower than the dense one (README, Mixture of experts): meshplan "
            "models torchtitan's dispatch (the standard all-to-all, DeepEP or HybridEP: expert_parallel_comm_backend "
            "deepep / hybridep) and Megatron-Core's overlap of it with another microbatch (moe_a2a_overlap), not "
            "other frameworks' fused permutes"
            + ("" if intervals.moe_table("peak_memory") is not None else
               "; its peak-memory interval is the dense runs' (too few published MoE runs state a peak for one of "
               "their own, and those few miss the dense band: README, Mixture of experts)"))
    if stack.fsdp_every_layout and cfg.dp_shard * cfg.cp == 1:
        warnings.append(
            f"no FSDP sharding (dp_shard x cp = 1): stack {stack.id}, as torchtitan since 2026-04 (0.3.0), wraps FSDP2 "
            "with one shard here and trains bf16 through its MixedPrecisionPolicy, so 'FSDP comm' is its parameter "
            "and gradient copies, no collective; --stack torchtitan-2026-03 estimates 0.2.2's rules (autocast; no "
            "mixed precision for TP or PP alone)")
    if cfg.document_tokens and stack.attention_of(cfg.attention_kernel) != "flex":
        warnings.append(
            f"document_tokens {cfg.document_tokens}: this job's attention is SDPA's causal mask (stack {stack.id}), "
            "which attends across documents, so their length changes nothing; FlexAttention's block-causal mask "
            "(torchtitan 0.3, stack torchtitan) skips it")
    elif cfg.document_tokens and cfg.document_tokens < cfg.seq_len:
        warnings.append(
            f"documents of ~{cfg.document_tokens:,} tokens in sequences of {cfg.seq_len:,}: MFU counts full attention "
            "(torchtitan's convention, as its logs do), so it overstates the GPUs' utilisation here and may pass "
            "100 %; tokens/s is the figure to compare")
    nvlink = hw.scale_up_gpus(cfg.gpus_per_node)
    if cfg.tp > nvlink:
        warnings.append(f"tp {cfg.tp} spans nodes (NVLink joins {nvlink} GPUs): TP traffic crosses the network")
    elif nvlink > cfg.gpus_per_node and cfg.gpus > cfg.gpus_per_node:
        warnings.append(
            f"{hw.name}: NVLink joins {nvlink} GPUs across nodes of {cfg.gpus_per_node}, so groups of up to {nvlink} "
            "ranks are estimated on NVLink: allocate the job's nodes inside one NVLink domain (e.g. Slurm's "
            "topology/block) or those groups cross the network")
    extra = embedding_partial_bytes(model, cfg.tp, cfg.pp, cfg.microbatches, stack.reduce_bytes) / GIB
    if extra:
        warnings.append(
            f"the first pipeline stage may hold up to {extra:.1f} GiB more than estimated: DTensor has no "
            "vocab-sharded embedding backward, so the TP embedding's gradient is a full-vocabulary partial that "
            "FSDP2 accumulates across no-sync microbatches (seen in `meshplan trace` on torch 2.13; the published "
            "Dec-2024 405B TP+PP runs do not show it, so it is not in the peak)"
        )
    return {
        "model": model_summary(model, cfg.seq_len, cfg),
        "hardware": {"id": hw.id, "name": hw.name, "peak_tflops_bf16": hw.peak_tflops_bf16},
        "stack": stack.id,
        "config": config_dict(cfg),
        "memory": {
            "peak_gib": _r(peak),
            "allocated_gib": _r(r["allocated_bytes"] / GIB),
            "usable_gib": _r(usable),
            "fits": bool(peak <= usable * memory_margin),
            "peak_gib_interval": [_r(x) for x in intervals.interval(peak, "peak_memory", stack.id, moe=moe)],
            "fit_probability": _r(float(intervals.fit_probability(peak, usable * memory_margin, stack.id, moe)), 2),
            "breakdown_gib": {k: _r(r[k] / GIB) for k in MEMORY_CATEGORIES},
            "peak_phase": PEAK_PHASES[int(r["peak_phase"])],
            "saved_activations_gib": _r(r["saved_activations"] / GIB),
            "worst_rank": _stage_name(int(r["worst_stage"]), cfg.pp),
            "per_stage": per_stage(model, hw, stack, cfg) if cfg.pp > 1 else [],
            "host_ram_gib_per_node": _r(host, 1),
            "host_ram_offloaded_gib_per_node": _r(r["host_offload_bytes_per_node"] / GIB, 1),
            "host_ram_usable_gib_per_node": _r(hw.host_ram_gib_per_node, 1),
            "host_ram_full_load_gib_per_node": _r(full_load, 1),
        },
        "throughput": {
            "tokens_per_sec_per_gpu": _r(r["tokens_per_sec_per_gpu"], 1),
            "tokens_per_sec_per_gpu_interval": [_r(x, 1) for x in tps_interval],
            "step_time_s": _r(r["step_time_s"], 4),
            "mfu": _r(r["mfu"], 4),
            "microbatches": int(round(r["microbatches"])),
            "breakdown_s": {k: _r(r[k], 4) for k in TIME_CATEGORIES},
            "fsdp_overhead_share": _r(fsdp_share, 4),
            "flop_convention": FLOP_CONVENTION,
            "mfu_peak_tflops": hw.peak_tflops_bf16,
            # the attention kernel timed (the configuration's, else the stack's): FlexAttention, cuDNN's, FA-2
            "attention_kernel": attention_kernel(hw, stack, cfg.attention_kernel)[0],
        },
        "warnings": warnings,
    }


def fsdp_overhead_interval(r: dict, stack: StackProfile, share: float,
                           moe: bool = False) -> tuple[list[float], str | None]:
    """The 80 % interval of tokens/s/GPU, and a warning where the estimate leans on the stack's per-block FSDP
    cost beyond the runs it was fitted to (`r`: one configuration's `estimate_arrays`, as floats; `share`: the
    cost's share of its step).

    The cost is fitted as seconds a block per microbatch (`fsdp_overhead_s_per_layer`, not identified). Inside
    the calibration runs' range a fixed cost predicts them best (refit as growing with the work a block and
    microbatch holds, torchtitan's in-sample tokens/s/GPU error rose from 5.4 % to 6.0, 7.2 and 11.0 % for work
    to the power 0.25, 0.5 and 1 in 2026-11: README, Accuracy), but no run it is fitted to has less work a block than
    those, and runs seen since with less (TP 2, CP 2) were faster than a fixed cost predicts. Where the cost takes a larger share of
    the step than in any calibration run (`fsdp_overhead_calibrated_share`), the interval's upper end reaches
    the estimate with the cost at that largest share."""
    tps, step, ovh = r["tokens_per_sec_per_gpu"], r["step_time_s"], r["fsdp_overhead_s"]
    low, high = intervals.interval(tps, "tokens_per_sec_per_gpu", stack.id, moe=moe)
    cap = stack.fsdp_overhead_calibrated_share
    if cap is None or share <= cap + SHARE_TOLERANCE or tps <= 0:
        return [low, high], None
    alt_step = (step - ovh) / (1 - cap)
    alt_tps = tps * step / alt_step
    high = max(high, intervals.interval(alt_tps, "tokens_per_sec_per_gpu", stack.id, moe=moe)[1])
    return [low, high], (
        f"{share:.0%} of this step is {stack.id}'s per-block FSDP cost "
        f"({stack.fsdp_overhead_s_per_layer * 1e3:.1f} ms a block per microbatch, fitted, not identified), more than "
        f"in any run it was fitted to ({cap:.0%}): few tokens a block and microbatch extrapolate; were the cost to "
        f"grow with that work, tokens/s/GPU would be {alt_tps:,.0f}, where the interval now reaches")


def trainable_params(model: ModelSpec, cfg: TrainConfig | None) -> int:
    """Parameters the optimizer updates: LoRA's adapters under LoRA / QLoRA, else every parameter."""
    if cfg is not None and cfg.finetune in ("lora", "qlora"):
        from meshplan.estimator.physics.finetune import adapter_params

        return adapter_params(model, cfg.lora_rank, cfg.lora_targets)
    return int(model.params)


def model_summary(model: ModelSpec, seq_len: int, cfg: TrainConfig | None = None) -> dict:
    """The model as `--json` reports it: total, active and trainable parameters (a MoE model's experts and layers),
    FLOPs."""
    out = {
        "name": model.name,
        "params": int(model.params),
        "active_params": int(model.active_params),
        "trainable_params": trainable_params(model, cfg),
        "layers": model.layers,
        "hidden": model.hidden,
        "flops_per_token": float(model.flops_per_token(seq_len)),
    }
    if model.moe is not None:
        m = model.moe
        out["moe"] = {"experts": m.experts, "top_k": m.top_k, "expert_ffn_hidden": m.expert_ffn_hidden,
                      "shared_ffn_hidden": m.shared_ffn_hidden, "moe_layers": model.moe_layers,
                      "routed_params": int(model.routed_params)}
        if m.group_limited:  # node-limited routing: a token's experts from limited_groups of expert_groups
            out["moe"] |= {"expert_groups": m.expert_groups, "limited_groups": m.limited_groups}
    if model.mla is not None:
        out["attention"] = "multi-head latent attention"
    if model.vision_params:
        out["vision_params"] = int(model.vision_params)
    return out


MAX_STAGES_LISTED = 64


def _stage_name(k: int, pp: int) -> str:
    if pp == 1:
        return "every rank (no pipeline)"
    return {0: "first pipeline stage", pp - 1: "last pipeline stage"}.get(k, f"pipeline stage {k}")


def per_stage(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, cfg: TrainConfig) -> list[dict]:
    """Peak reserved and allocated memory and the breakdown (GiB) for each pipeline stage of a resolved config, with the
    transformer blocks its rank holds (the stack's split: torchtitan's, physics/stages.py, or nanotron's by cost)."""
    import numpy as np

    n = min(cfg.pp, MAX_STAGES_LISTED)
    arrays = ConfigArrays.from_configs([cfg] * n)
    r = estimate_arrays(model, hw, stack, arrays, stage=np.arange(n))
    blocks = split_blocks(model, cfg.pp, cfg.vpp, cfg.pp_first_stage_less_layers, cfg.pp_last_stage_less_layers,
                          range(n), stack.pp_split == "cost_balanced")
    return [
        {
            "stage": k,
            "blocks": int(blocks[k]),
            "peak_gib": _r(r["peak_bytes"][k] / GIB),
            "allocated_gib": _r(r["allocated_bytes"][k] / GIB),
            "breakdown_gib": {c: _r(r[c][k] / GIB) for c in MEMORY_CATEGORIES},
            "peak_phase": PEAK_PHASES[int(r["peak_phase"][k])],
            "saved_activations_gib": _r(r["saved_activations"][k] / GIB),
        }
        for k in range(n)
    ]


def config_dict(cfg: TrainConfig) -> dict:
    """A resolved config with torchtitan's names, as plans and `--json` print it."""
    return {
        "gpus": cfg.gpus,
        "gpus_per_node": cfg.gpus_per_node,
        "dp_replicate": cfg.dp_replicate,
        "dp_shard": cfg.dp_shard,
        "cp": cfg.cp,
        "tp": cfg.tp,
        "pp": cfg.pp,
        "ep": cfg.ep,
        "pp_schedule": cfg.pp_schedule,
        "vpp": cfg.vpp,
        **less_fields(cfg.pp_first_stage_less_layers, cfg.pp_last_stage_less_layers),
        "seq_len": cfg.seq_len,
        "global_batch_size": cfg.global_batch_size,
        "micro_batch_size": cfg.micro_batch_size,
        "ac": cfg.ac,
        "float8": cfg.float8,
        "compile": cfg.compile,
        # what compile compiles, where it is not torchtitan's default (model and loss): the JSON reads as before
        **({"compile_components": list(cfg.compile_components)}
           if cfg.compile and len(cfg.compile_components) < 2 else {}),
        **({"moe_force_load_balance": True} if cfg.moe_force_load_balance else {}),
        **({"moe_a2a_overlap": True} if cfg.moe_a2a_overlap else {}),
        **({"attention_kernel": cfg.attention_kernel} if cfg.attention_kernel != "default" else {}),
        **({"document_tokens": cfg.document_tokens} if cfg.document_tokens else {}),
        "async_tp": cfg.async_tp,
        **finetune_dict(cfg),
    }


def finetune_dict(cfg: TrainConfig) -> dict:
    """The fine-tuning and memory-policy fields of a config (empty for pre-training without offload, in fp32 state,
    with the default reshard policy, so those read as before)."""
    out: dict = {}
    if cfg.finetune != "none":
        out["finetune"] = cfg.finetune
    if cfg.finetune in ("lora", "qlora"):
        out.update(lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_targets=list(cfg.lora_targets))
    if cfg.cpu_offload:
        out["cpu_offload"] = True
    if cfg.dtype != "float32":
        out["dtype"] = cfg.dtype
    if cfg.fsdp_reshard_after_forward != "default":
        out["fsdp_reshard_after_forward"] = cfg.fsdp_reshard_after_forward
    if cfg.expert_parallel_comm_backend != "standard":
        out["expert_parallel_comm_backend"] = cfg.expert_parallel_comm_backend
    return out
