"""`meshplan compare`: a run's measured memory and throughput next to what its plan predicted."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from meshplan.commands.table_fit import print_table
from meshplan.launcher.compare import append_measurement, measurement_row, summarize_run


def compare_cmd(
    run_dir: Path = typer.Argument(..., help="a run directory written by `meshplan launch` (plan.yaml + metrics.jsonl)"),
    append_csv: Path = typer.Option(None, "--append-csv", help="append the run to a CSV in the ground-truth schema"),
    run_id: str = typer.Option(None, "--id", help="row id for --append-csv [default: meshplan-<run dir name>]"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Print predicted vs measured tokens/s/GPU, step time, peak memory and MFU, with the error, and which terms of
    the estimate were furthest off (the step's forward/backward and optimizer phases; allocated memory and the
    allocator's reserve above it on GPU runs).

    The prediction is for the plan's hardware; a CPU smoke run measures the CPU, so compare those
    figures for the mechanics, not the accuracy.
    """
    s = summarize_run(run_dir)
    if append_csv is not None:
        append_measurement(append_csv, measurement_row(s, run_id))
    if as_json:
        print(json.dumps(s.as_dict(), indent=2))
        return
    d = s.as_dict()
    console = Console()
    # the run as a line of its own: a long run path as the table's title wrapped mid-sentence into the table's width
    console.print(f"[bold]{run_dir}[/]: {s.steps} steps on {s.device}; predicted for {s.plan.hardware.id}",
                  highlight=False)
    table = Table()
    for col in ("", "predicted", "measured", "error"):
        table.add_column(col, justify="left" if not col else "right")
    p, m = d["predicted"], d["measured"]
    table.add_row("tokens/s/GPU", f"{p['tokens_per_sec_per_gpu']:,.1f}", f"{m['tokens_per_sec_per_gpu']:,.1f}",
                  f"{s.tps_error:+.1%}")
    table.add_row("step time s", f"{p['step_time_s']:.3f}", f"{m['step_time_s']:.3f}",
                  f"{p['step_time_s'] / m['step_time_s'] - 1:+.1%}")
    table.add_row("peak memory GiB", f"{p['peak_gib']:.2f}", f"{m['peak_gib']:.2f}", f"{s.mem_error:+.1%}")
    table.add_row("MFU", f"{p['mfu'] * 100:.1f}%", f"{m['mfu'] * 100:.1f}%" if m["mfu"] is not None else "-", "")
    table.add_row("final loss", "", f"{m['final_loss']:.4f}", "")
    print_table(console, table)
    terms = s.terms()
    if terms:
        console.print("which terms of the estimate were furthest off (largest share of the error first)")
        parts = Table()
        for col in ("term", "predicted", "measured", "error", "share of the whole"):
            parts.add_column(col, justify="left" if col == "term" else "right")
        for t in terms:
            err = f"{t['error']:+.1%}" if t["error"] is not None else "-"
            parts.add_row(t["term"], f"{t['predicted']:.3f} {t['unit']}", f"{t['measured']:.3f} {t['unit']}", err,
                          f"{t['share']:+.1%}")
        print_table(console, parts)
        console.print(f"furthest off: {terms[0]['term']}")
    if not s.device.startswith("cuda"):
        console.print(f"note: measured on {s.device}; the prediction is for {s.plan.hardware.id}.")
    if append_csv is not None:
        console.print(f"appended to {append_csv}")
