"""`meshplan estimate`: memory, host RAM and throughput of one configuration."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from meshplan.commands import finetune_options as ft
from meshplan.commands.table_fit import print_table
from meshplan.estimator.config import COMPILE_COMPONENTS, PP_SCHEDULES, TrainConfig, compile_label
from meshplan.estimator.errors import ConfigError
from meshplan.estimator.framework_runs import as_replicas, refusal
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.limits import token_budget
from meshplan.estimator.model_spec import load_model
from meshplan.estimator.report import estimate
from meshplan.estimator.stack import load_stack
from meshplan.planner.labels import model_size
from meshplan.planner.plan_file import load_plan, make_plan, profile_kept, save_plan

# the --pp-schedule choices: the estimator's schedules, one list (estimator.config.PP_SCHEDULES)
Schedule = StrEnum("Schedule", [(name, name) for name in PP_SCHEDULES])
DEFAULT_SCHEDULE = Schedule("1F1B")


class AC(StrEnum):
    none = "none"
    selective = "selective"
    full = "full"


class Float8(StrEnum):
    none = "none"
    tensorwise = "tensorwise"
    rowwise = "rowwise"
    mxfp8 = "mxfp8"


def estimate_cmd(
    model: str = typer.Option("llama3-8b", "--model", "-m", help="preset name, meshplan model YAML, or HF config.json"),
    hardware: str = typer.Option("h100-sxm", "--hardware", help="hardware profile id or YAML path"),
    gpus: int = typer.Option(None, "--gpus", min=1, help="world size [default: product of the degrees, or one node]"),
    gpus_per_node: int = typer.Option(None, "--gpus-per-node", min=1, help="[default: the hardware profile's]"),
    dp_replicate: int = typer.Option(1, "--dp-replicate", min=1, help="HSDP replicas (DDP when dp-shard is 1)"),
    dp_shard: int = typer.Option(-1, "--dp-shard", help="FSDP shard degree; -1 infers it from the world size"),
    tp: int = typer.Option(1, "--tp", min=1, help="tensor parallel degree (with sequence parallel)"),
    pp: int = typer.Option(1, "--pp", min=1, help="pipeline parallel degree"),
    cp: int = typer.Option(1, "--cp", min=1, help="context parallel degree"),
    ep: int = typer.Option(1, "--ep", min=1, help="expert parallel degree (MoE models): experts / ep per GPU, ranks "
                                                 "carved from dp_shard x cp x tp"),
    pp_schedule: Schedule = typer.Option(DEFAULT_SCHEDULE, "--pp-schedule", help="pipeline schedule"),
    vpp: int = typer.Option(None, "--vpp", min=1, help="stages per pipeline rank [default: 2 for the looped schedules Interleaved1F1B and InterleavedZeroBubble]"),
    pp_first_stage_less_layers: int = typer.Option(
        1, "--pp-first-stage-less-layers", help="torchtitan's pipeline split: the embedding counts as this many "
        "layers, so the first stage holds that many fewer blocks (0: as many as the others; pp > 1)"),
    pp_last_stage_less_layers: int = typer.Option(
        1, "--pp-last-stage-less-layers", help="torchtitan's pipeline split: the final norm and output count as this "
        "many layers, so the last stage holds that many fewer blocks (0: as many as the others; pp > 1)"),
    seq_len: int = typer.Option(8192, "--seq-len", min=1, help="tokens per sequence"),
    global_batch_size: int = typer.Option(
        None, "--global-batch-size", min=1, help="sequences per optimizer step [default: one micro-batch per DP rank]"
    ),
    micro_batch_size: int = typer.Option(1, "--micro-batch-size", min=1, help="sequences per forward per DP rank"),
    ac: AC = typer.Option(None, "--ac", help="activation checkpointing [default: selective, or none under a stack "
                          "whose framework has no op-level selective AC (nanotron, llm-foundry, KempnerForge)]", show_default=False),
    compile_: bool = typer.Option(False, "--compile/--no-compile", help="torch.compile (per block, and the loss)"),
    compile_components: str = ft.COMPILE_COMPONENTS_OPT,
    float8: Float8 = typer.Option(Float8.none, "--float8", help="torchao Float8 recipe for Linear layers"),
    async_tp: bool = typer.Option(False, "--async-tp/--no-async-tp", help="asynchronous TP (needs --tp > 1)"),
    finetune: ft.FineTune = ft.FINETUNE,
    lora_rank: int = ft.LORA_RANK,
    lora_alpha: float = ft.LORA_ALPHA,
    lora_targets: str = ft.LORA_TARGETS_OPT,
    cpu_offload: bool = ft.CPU_OFFLOAD,
    dtype: ft.TrainingDtype = ft.DTYPE,
    fsdp_reshard_after_forward: ft.ReshardPolicy = ft.RESHARD,
    ep_comm_backend: ft.EPCommBackend = ft.EP_COMM_BACKEND,
    document_tokens: int = ft.DOCUMENT_TOKENS,
    moe_force_load_balance: bool = typer.Option(
        False, "--moe-force-load-balance/--no-moe-force-load-balance", help="torchtitan's debug."
        "moe_force_load_balance (MoE): route round-robin, token t to experts t*k .. t*k+k-1, every expert the same "
        "rows: how torchtitan's and NeMo AutoModel's published MoE benchmarks ran (consecutive experts share ranks, "
        "so DeepEP / HybridEP send a token to fewer ranks and nodes than learned routing does)"),
    init_from: str = typer.Option(None, "--init-from", help="with -o: the Hugging Face checkpoint folder the plan "
                                  "starts from (recorded in the plan; `meshplan launch --init-from` sets it too)"),
    stack: str = typer.Option(
        None, "--stack", help="framework behaviour profile: torchtitan (current release), torchtitan-2026-03, "
        "torchtitan-2024, llm-foundry, generic, or a YAML path; with --plan, instead of the plan's own "
        "[default: torchtitan]"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of tables"),
    plan_path: Path = typer.Option(None, "--plan", help="estimate the configuration of this plan file instead"),
    output: Path = typer.Option(None, "--output", "-o", help="write a plan file for exactly this configuration"),
    tokens: float = typer.Option(
        None, "--tokens", min=1, callback=token_budget, help="token budget recorded in the plan (sets steps)"
    ),
    name: str = typer.Option(None, "--name", help="job name in the plan (letters, digits, . _ -)"),
    trace: bool = typer.Option(
        False, "--trace", help="also trace the configuration's tensor memory on this CPU (as `meshplan trace`)"
    ),
) -> None:
    """Estimate per-GPU peak memory (worst rank, peak reserved), host RAM and tokens/s/GPU of ONE configuration.

    Example: meshplan estimate --model llama3-70b --hardware h100-sxm --gpus 64 --tp 8 --seq-len 8192
    --global-batch-size 64 --ac full --compile --float8 tensorwise

    Fine-tuning: meshplan estimate --model llama3-70b --gpus 16 --seq-len 4096 --global-batch-size 32 --ac full
    --finetune lora --lora-rank 16 (or --finetune full --cpu-offload, --finetune qlora)
    """
    if plan_path is not None:
        plan = load_plan(plan_path)
        if stack is not None:  # the plan under another stack profile (and so written with -o)
            plan = plan.model_copy(update={"stack": stack, "stack_profile": profile_kept(stack)})
        profile = plan.stack_of()
        cfg = plan.train_config()
        refused = _trace_refusal(trace, profile)
        layout = refusal(profile, cfg, fix=False)  # the plan's layout, not a flag here: re-plan under that stack
        if refused is None and layout:
            refused = f"plan {plan.name}: {layout}; plan again with --stack {plan.stack} for a layout it runs"
        if refused:
            raise ConfigError(refused)
        result = estimate(plan.model, plan.hardware, cfg, profile)
        if output is not None:
            save_plan(plan.model_copy(update={"estimate": result}), output)
        if trace:
            _with_trace(plan, result, as_json)
            return
        print(json.dumps(result, indent=2)) if as_json else render(result)
        return
    spec = load_model(model)
    hw = load_hardware(hardware)
    cfg = TrainConfig(
        gpus=gpus, gpus_per_node=gpus_per_node, dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, pp=pp,
        cp=cp, ep=ep, pp_schedule=pp_schedule.value, vpp=vpp, pp_first_stage_less_layers=pp_first_stage_less_layers,
        pp_last_stage_less_layers=pp_last_stage_less_layers, seq_len=seq_len, global_batch_size=global_batch_size or 0,
        micro_batch_size=micro_batch_size, ac=ac.value if ac is not None else "selective", compile=compile_,
        compile_components=ft.parse_compile_components(compile_components), float8=float8.value, async_tp=async_tp,
        **ft.finetune_fields(finetune, lora_rank, lora_alpha, lora_targets, cpu_offload), dtype=dtype.value,
        fsdp_reshard_after_forward=fsdp_reshard_after_forward.value,
        expert_parallel_comm_backend=ep_comm_backend.value, moe_force_load_balance=moe_force_load_balance,
        document_tokens=document_tokens,
    )
    stack = stack or "torchtitan"
    profile = load_stack(stack)
    if ac is None and "selective" not in profile.runs.ac_modes():
        cfg = cfg.model_copy(update={"ac": "none"})
    cfg = as_replicas(profile, cfg, hw.gpus_per_node)  # a framework without FSDP: the inferred dp as replicas
    refused = refusal(profile, cfg) or _trace_refusal(trace, profile)
    if refused:
        raise ConfigError(refused)
    result = estimate(spec, hw, cfg, profile)
    if output is not None or trace:
        plan = make_plan(spec, model, hw, cfg, result, stack=stack, tokens=int(tokens) if tokens else None, name=name,
                         init_from=init_from)
        if output is not None:
            save_plan(plan, output)
        if trace:
            _with_trace(plan, result, as_json)
            return
    if as_json:
        print(json.dumps(result, indent=2))
        return
    render(result)


def _trace_refusal(trace: bool, profile) -> str | None:
    """--trace under another framework's profile (`runs.on_core` false): refused before anything is printed."""
    if trace and not profile.runs.on_core:
        return (f"--trace runs the training core's code (torchtitan's semantics), not stack {profile.id}'s "
                "framework: trace with --stack torchtitan")
    return None


def _with_trace(plan, result: dict, as_json: bool) -> None:
    """--trace: the estimate, then the traced tensor memory next to the analytical terms (torch loads here)."""
    from meshplan.commands.trace import render as render_trace
    from meshplan.commands.trace import run_trace

    if not as_json:
        render(result)
    report = run_trace(plan, quiet=as_json)
    if as_json:
        print(json.dumps({"estimate": result, "trace": report}, indent=2))
        return
    render_trace(report)


def render(result: dict, console: Console | None = None) -> None:
    """Readable report: configuration, memory by category, time by category, warnings."""
    console = console or Console()
    c, mem, thr = result["config"], result["memory"], result["throughput"]
    m = result["model"]
    moe = m.get("moe")
    size = model_size(m["params"], m["active_params"], *((moe["experts"], moe["top_k"]) if moe else ()))
    console.print(
        f"[bold]{m['name']}[/] ({size}) on "
        f"[bold]{c['gpus']} x {result['hardware']['id']}[/] ({c['gpus_per_node']} per node), stack {result['stack']}"
    )
    console.print(
        f"dp_replicate {c['dp_replicate']} x dp_shard {c['dp_shard']} x cp {c['cp']} x tp {c['tp']} x pp {c['pp']}"
        + (f" ({c['pp_schedule']}, vpp {c['vpp']})" if c["pp"] > 1 else "")
        + (f", ep {c['ep']}" if c.get("ep", 1) > 1 else "")
        + f" | seq {c['seq_len']}, global batch {c['global_batch_size']}, micro-batch {c['micro_batch_size']}"
        f" ({thr['microbatches']} per step) | AC {c['ac']}, compile {compile_label(c['compile'], c.get('compile_components') or COMPILE_COMPONENTS)}, "
        f"float8 {c['float8']}" + (", async TP" if c["async_tp"] else "") + (", CPU offload" if c.get("cpu_offload") else "")
        + (f", training dtype {c['dtype']}" if c.get("dtype") else "")
        + (f", FSDP reshard after forward: {c['fsdp_reshard_after_forward']}"
           if c.get("fsdp_reshard_after_forward") else "")
        + (f", EP comm backend {c['expert_parallel_comm_backend']}" if c.get("expert_parallel_comm_backend") else "")
        + (", round-robin routing (moe_force_load_balance)" if c.get("moe_force_load_balance") else "")
        + (f", attention {thr['attention_kernel']}" if thr.get("attention_kernel") else "")
        + (f" over documents of ~{c['document_tokens']:,} tokens" if c.get("document_tokens") else "")
    )
    if c.get("finetune"):
        what = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (NF4 base)"}[c["finetune"]]
        if c["finetune"] != "full":
            what += f" r{c['lora_rank']} alpha {c['lora_alpha']:g} on {','.join(c['lora_targets'])}"
        console.print(f"{what}: {m['trainable_params']:,} trainable parameters "
                      f"({m['trainable_params'] / m['params']:.2%} of {m['params']:,})")
    table = Table(
        title=f"memory per GPU, {mem['worst_rank']} (peak reserved, at the {mem['peak_phase']})", show_footer=True
    )
    table.add_column("category", footer="peak")
    fits = "[green]fits[/]" if mem["fits"] else "[red]does not fit[/]"
    table.add_column("GiB", justify="right", footer=f"{mem['peak_gib']:.1f} / {mem['usable_gib']:.1f} usable: {fits}")
    from meshplan.planner.palette import MEMORY_STYLE, TIME_STYLE

    for k, v in mem["breakdown_gib"].items():
        table.add_row(MEMORY_STYLE[k].label if k in MEMORY_STYLE else k, f"{v:.2f}")
    print_table(console, table)
    lo, hi = mem["peak_gib_interval"]
    console.print(f"peak, 80 % interval: {lo:.1f}-{hi:.1f} GiB; fits with probability {mem['fit_probability']:.0%} "
                  "(from the estimator's cross-validated error on published runs)")
    offloaded = mem.get("host_ram_offloaded_gib_per_node", 0)
    kept = (f"{offloaded:,.0f} GiB of it the offloaded state" if offloaded else "with sharded (DCP) checkpoints")
    whole = "bf16 checkpoint" if c.get("finetune") else "fp32 model"
    console.print(
        f"host RAM per node: {mem['host_ram_gib_per_node']:,.0f} GiB of {mem['host_ram_usable_gib_per_node']:,.0f}, "
        f"{kept}; {mem['host_ram_full_load_gib_per_node']:,.0f} GiB if every rank loaded the whole {whole}"
    )
    ttable = Table(title="time per optimizer step", show_footer=True)
    ttable.add_column("category", footer="step")
    ttable.add_column("seconds", justify="right", footer=f"{thr['step_time_s']:.3f}")
    for k, v in thr["breakdown_s"].items():
        if v > 0:
            ttable.add_row(TIME_STYLE[k].label if k in TIME_STYLE else k, f"{v:.4f}")
    print_table(console, ttable)
    share = thr.get("fsdp_overhead_share", 0.0)
    if share >= 0.005:
        console.print(f"of the overhead, {share * thr['step_time_s']:.4f} s ({share:.0%} of the step) is the stack's "
                      f"per-block FSDP cost (its profile's fsdp_overhead_s_per_layer, whose comment says where it comes from)")
    console.print(
        f"[bold]{thr['tokens_per_sec_per_gpu']:,.0f} tokens/s/GPU[/] (80 % interval "
        f"{thr['tokens_per_sec_per_gpu_interval'][0]:,.0f}-{thr['tokens_per_sec_per_gpu_interval'][1]:,.0f}), "
        f"MFU {thr['mfu'] * 100:.1f}% "
        f"(vs {thr['mfu_peak_tflops']:g} dense bf16 TFLOP/s; FLOPs/token = {thr['flop_convention']})"
    )
    for w in result["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")
