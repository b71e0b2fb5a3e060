"""`meshplan trace` / `meshplan trace-grid`: measure per-rank tensor memory on the CPU (fake tensors, fake
process group, the training core's own parallelisation) and put the analytical model next to it.

torch is imported only when a command runs (launcher.trace), never at `meshplan --help`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from meshplan.commands.table_fit import print_table
from meshplan.estimator.errors import MeshplanError
from meshplan.planner.plan_file import load_plan

GIB = float(2**30)
ROW_NAMES = {
    "params": "params (fp32, sharded)",
    "grads": "grads (fp32, sharded)",
    "optimizer": "optimizer state (AdamW)",
    "unsharded_params": "unsharded params + all-gather",
    "activations": "activations (saved, end of forward)",
    "total": "total tensor memory at peak",
}


def trace_cmd(
    plan_path: Path = typer.Argument(..., help="a plan file (from `meshplan plan` or `meshplan estimate -o`)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (bytes) instead of tables"),
) -> None:
    """Trace a plan's per-rank tensor memory on this CPU (no GPU) and compare it with the analytical model.

    Builds the model with the training core's own TP/FSDP/AC code under fake tensors and a fake process group,
    runs two training steps (AdamW) under torch's FSDPMemTracker and reports step 2's peak by category, for
    rank 0 and (with pipeline parallelism) the last stage. Tensor memory only: fragmentation, the CUDA context
    and NCCL buffers stay analytical. Llama 3 8B at 8192 tokens traces in about 30 s in under 0.5 GB of RAM.

    Example: meshplan estimate --model llama3-8b --nodes 1 --seq-len 8192 --global-batch-size 8 -o p.yaml;
    meshplan trace p.yaml
    """
    plan = load_plan(plan_path)
    report = run_trace(plan, quiet=as_json)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    render(report)


def run_trace(plan, quiet: bool = False) -> dict:
    """Trace with a progress spinner on stderr (none when `quiet`); a plan of another framework than torchtitan
    (`framework_refusal`) is a one-line error: the trace runs the training core's code."""
    from meshplan.launcher.trace_compare import trace_plan
    from meshplan.planner.plan_file import framework_refusal

    other = framework_refusal(plan, "meshplan trace runs (the training core's code)")
    if other:
        raise MeshplanError(other)

    console = Console(stderr=True)
    if quiet:
        return trace_plan(plan)
    with console.status("tracing ...") as status:
        return trace_plan(plan, progress=lambda msg: status.update(f"tracing: {msg}"))


def render(report: dict, console: Console | None = None) -> None:
    console = console or Console()
    c = report["config"]
    console.print(
        f"[bold]{report['model']}[/]: dp_replicate {c['dp_replicate']} x dp_shard {c['dp_shard']} x cp {c['cp']} "
        f"x tp {c['tp']} x pp {c['pp']}" + (f" ({c['pp_schedule']})" if c["pp"] > 1 else "")
        + f" | seq {c['seq_len']}, micro-batch {c['micro_batch_size']}, global batch {c['global_batch_size']}"
        f" | AC {c['ac']}" + (f" | training dtype {c['dtype']}" if c.get("dtype") else "")
        + (f" | FSDP reshard after forward: {c['fsdp_reshard_after_forward']}"
           if c.get("fsdp_reshard_after_forward") else "")
        + f" | traced in {report['seconds']:.1f} s, {report['max_rss_mib']:.0f} MiB RAM"
    )
    # small models (smoke tests) read better in MiB
    unit, div = ("GiB", GIB) if max(r["traced"]["total"] for r in report["ranks"]) >= GIB else ("MiB", 2**20)
    for row in report["ranks"]:
        stage = f", pipeline stage {row['pp_rank']}" if c["pp"] > 1 else ""
        table = Table(title=f"rank {row['rank']}{stage}: step 2, {unit} per GPU")
        for col, just in (("", "left"), ("traced", "right"), ("analytical", "right"), ("error", "right")):
            table.add_column(col, justify=just)
        for key, name in ROW_NAMES.items():
            t, a, e = row["traced"][key], row["analytical"][key], row["error"][key]
            if key == "params" and report["config"].get("finetune") in ("lora", "qlora"):
                name = "params (frozen bf16 + fp32 adapters)"
            if report["config"].get("dtype") == "bfloat16":  # training dtype bfloat16: bf16 state
                name = name.replace("fp32", "bf16")
            table.add_row(name, f"{t / div:.3f}", f"{a / div:.3f}", f"{e:+.1%}" if t else "-")
        off = row.get("offload")
        if off:  # CPU offload: what leaves the GPU, and the GPU's peak without it
            for key, name in (("offloaded", "CPU offload: state moved to the host"),
                              ("total", "CPU offload: GPU tensor memory at peak")):
                t, a, e = off["traced"][key], off["analytical"][key], off["error"][key]
                table.add_row(name, f"{t / div:.3f}", f"{a / div:.3f}", f"{e:+.1%}" if t else "-")
        print_table(console, table)
        peak = ", ".join(f"{k.replace('_', ' ')} {v / div:.2f}" for k, v in row["peak"].items() if v)
        console.print(f"  at the peak: {peak} {unit}")
        if row["unmodelled_embedding_gradient"]:
            console.print(
                f"  up to {row['unmodelled_embedding_gradient'] / div:.3f} {unit} of it is the TP embedding's "
                "full-vocabulary gradient (bf16 per microbatch + fp32 accumulated across no-sync microbatches), "
                "which the analytical model leaves out (README, trace grid)"
            )
    for note in report["notes"]:
        console.print(f"[yellow]note:[/] {note}")


def trace_grid_cmd(
    output: Path = typer.Option(None, "--output", "-o", help="write the grid report (markdown) here"),
    as_json: bool = typer.Option(False, "--json", help="print the grid rows as one JSON object"),
    quick: bool = typer.Option(False, "--quick", help="a few configurations only (a smoke test)"),
) -> None:
    """Trace a grid of llama3-8b and llama3-70b configurations (dp_shard, tp, pp, AC, micro-batch, sequence
    length) and report the analytical model's error per category against the trace.

    The models keep their true hidden / heads / FFN / vocab sizes with fewer layers (see the report), so a
    grid runs in minutes on two cores. Example: meshplan trace-grid -o trace_grid.md
    """
    from meshplan.launcher.trace_grid import markdown, run_grid

    console = Console(stderr=True)
    with console.status("tracing the grid ...") as status:
        rows = run_grid(quick=quick, progress=lambda msg: status.update(f"tracing {msg}"))
    text = markdown(rows)
    if output is not None:
        output.write_text(text + "\n")
    if as_json:
        print(json.dumps({"rows": rows}, indent=2))
        return
    Console().print(text) if output is None else Console().print(f"wrote {output}")
