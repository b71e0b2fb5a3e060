"""`meshplan capacity`: time and cost to train a token budget across hardware profiles and cluster sizes."""

from __future__ import annotations

import json
import math

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from meshplan.commands.table_fit import print_table
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.limits import MAX_NODES, MAX_SEQ_LEN, check_size, token_budget
from meshplan.estimator.model_spec import load_model
from meshplan.estimator.stack import load_stack
from meshplan.planner.capacity import DEFAULT_NODES, answers, capacity_options

DEFAULT_HARDWARE = "h100-sxm,h200-sxm,b200,a100-sxm-80g,mi300x"


def capacity_cmd(
    model: str = typer.Option("llama3-70b", "--model", "-m", help="preset name, meshplan model YAML, or HF config.json"),
    tokens: float = typer.Option(..., "--tokens", min=1, callback=token_budget, help="token budget to train, e.g. 2e12"),
    deadline_days: float = typer.Option(None, "--deadline-days", min=0, help="finish within this many days"),
    budget: float = typer.Option(None, "--budget", min=0, help="spend at most this many US dollars"),
    hardware: str = typer.Option(DEFAULT_HARDWARE, "--hardware", help="comma-separated profile ids or paths"),
    nodes: str = typer.Option(",".join(map(str, DEFAULT_NODES)), "--nodes", help="comma-separated node counts"),
    seq_len: int = typer.Option(8192, "--seq-len", min=1),
    global_batch_tokens: int = typer.Option(4 * 1024 * 1024, "--global-batch-tokens", min=1),
    memory_margin: float = typer.Option(0.9, "--memory-margin"),
    price: float = typer.Option(None, "--price", min=0, help="override $/GPU-hour for every profile"),
    stack: str = typer.Option("torchtitan", "--stack"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Compare hardware and cluster sizes: the cheapest option that meets a deadline, the fastest within a
    budget, and the smallest cluster on which the model fits at all.

    Example: meshplan capacity --model llama3-70b --tokens 2e12 --deadline-days 30 --budget 2e6
    """
    try:
        node_counts = tuple(sorted({int(x) for x in nodes.split(",") if x.strip()}))
    except ValueError:
        raise MeshplanError(f"--nodes takes comma-separated integers, got {nodes!r}") from None
    if not node_counts or min(node_counts) < 1:
        raise MeshplanError(f"--nodes values must be positive, got {nodes!r}")
    check_size(max(node_counts), "nodes", MAX_NODES)
    check_size(seq_len, "seq_len", MAX_SEQ_LEN)
    for flag, value in (("--deadline-days", deadline_days), ("--budget", budget), ("--price", price)):
        if value is not None and not math.isfinite(value):
            raise MeshplanError(f"{flag} must be a finite number, got {value}")
    profiles = [load_hardware(h.strip()) for h in hardware.split(",") if h.strip()]
    if not profiles:
        raise MeshplanError("--hardware names no profile")
    spec, st = load_model(model), load_stack(stack)
    if as_json or not Console(stderr=True).is_terminal:
        opts = capacity_options(spec, profiles, st, tokens, seq_len, global_batch_tokens, node_counts, memory_margin, price)
    else:
        with Progress(transient=True, console=Console(stderr=True)) as bar:
            task = bar.add_task("searching clusters", total=len(profiles) * len(node_counts))
            opts = capacity_options(spec, profiles, st, tokens, seq_len, global_batch_tokens, node_counts,
                                    memory_margin, price, lambda d, t: bar.update(task, completed=d))
    ans = answers(opts, deadline_days, budget)
    if as_json:
        print(json.dumps({"options": [o.as_dict() for o in opts], "answers": ans, "tokens": tokens}, indent=2))
        return
    console = Console()
    table = Table(title=f"{spec.name}: {tokens:.3g} tokens, seq {seq_len}, {global_batch_tokens:,} tokens per step")
    for col in ("hardware", "nodes", "GPUs", "best configuration", "peak GiB", "tok/s/GPU", "days", "GPU-hours", "cost $"):
        table.add_column(col, justify="left" if col in ("hardware", "best configuration") else "right",
                         no_wrap=col == "hardware")
    for o in opts:
        if not o.fits:
            table.add_row(o.hardware, str(o.nodes), str(o.gpus), "[red]does not fit[/]", "", "", "", "", "")
            continue
        table.add_row(o.hardware, str(o.nodes), str(o.gpus), o.summary, f"{o.peak_gib:.1f}",
                      f"{o.tokens_per_sec_per_gpu:,.0f}", f"{o.days:,.1f}", f"{o.gpu_hours:,.0f}",
                      f"{o.cost_usd:,.0f}" if o.cost_usd is not None else "-")
    print_table(console, table)

    def line(label: str, o: dict | None, none_text: str) -> None:
        if o is None:
            console.print(f"{label}: {none_text}")
        else:
            cost = f"${o['cost_usd']:,.0f}" if o["cost_usd"] is not None else "no price"
            console.print(f"{label}: {o['nodes']} x {o['hardware']} ({o['gpus']} GPUs), {o['days']:.1f} days, {cost}")

    if deadline_days is not None:
        line(f"cheapest within {deadline_days:g} days", ans["cheapest_within_deadline"], "none meets the deadline")
    else:
        line("cheapest", ans.get("cheapest"), "no priced option fits")
    if budget is not None:
        line(f"fastest within ${budget:,.0f}", ans["fastest_within_budget"], "none fits the budget")
    else:
        line("fastest", ans.get("fastest"), "nothing fits")
    for hw, o in ans["smallest_fitting"].items():
        if o:
            console.print(f"smallest cluster that fits on {hw}: {o['nodes']} node(s)")
            continue
        # nothing fits: say why at the largest cluster tried (the closest miss), as --json does in why_not
        largest = max((x for x in opts if x.hardware == hw), key=lambda x: x.gpus)
        console.print(f"smallest cluster that fits on {hw}: none tried fits", highlight=False)
        console.print(f"  why not, at {largest.nodes} node(s): {largest.why_not}", highlight=False, markup=False)
