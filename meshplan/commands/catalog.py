"""`meshplan models` and `meshplan hardware`: what is built in."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from meshplan.commands.table_fit import print_table
from meshplan.estimator.hardware import hardware_names, load_hardware
from meshplan.estimator.model_spec import load_model, preset_names


def models_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the model presets (parameter counts in billions; a mixture of experts' active ones too)."""
    specs = [load_model(n) for n in preset_names()]
    if as_json:
        print(json.dumps([{**s.model_dump(), "params": s.params, "active_params": s.active_params} for s in specs],
                         indent=2))
        return
    table = Table(title="model presets (also: a meshplan model YAML or a Hugging Face config.json; --json: every field)")
    for col in ("name", "params B", "active B", "layers", "hidden", "MLP (experts x width)"):
        table.add_column(col, justify="left" if col[0] in "nM" else "right", no_wrap=col[0] in "nM")
    for s in specs:
        mlp = f"{s.mlp} {s.ffn_hidden}"
        if s.moe is not None:
            mlp = f"{s.moe.experts}x{s.moe.expert_ffn_hidden} top-{s.moe.top_k}" + ("+sh" if s.moe.shared_ffn_hidden else "")
        table.add_row(s.name, f"{s.params / 1e9:.2f}", f"{s.active_params / 1e9:.2f}", str(s.layers), str(s.hidden),
                      mlp)
    print_table(Console(), table)


def hardware_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the hardware profiles (dense TFLOP/s, usable GiB, links, price)."""
    profiles = [load_hardware(n) for n in hardware_names()]
    if as_json:
        print(json.dumps([{**p.model_dump(), "usable_hbm_gib": p.usable_hbm_gib} for p in profiles], indent=2))
        return
    table = Table(title="hardware profiles (also: a path to a profile YAML)")
    for col in ("id", "bf16 TF", "fp8 TF", "usable GiB", "HBM TB/s", "GPUs/node", "NVLink GB/s", "net Gb/s", "$/GPU-h"):
        table.add_column(col, justify="left" if col == "id" else "right", no_wrap=col == "id")
    for p in profiles:
        table.add_row(
            p.id, f"{p.peak_tflops_bf16:g}", f"{p.peak_tflops_fp8:g}" if p.peak_tflops_fp8 else "-",
            f"{p.usable_hbm_gib:.1f}", f"{p.hbm_bandwidth_tbs:g}", str(p.gpus_per_node), f"{p.intra_node_gbs:g}",
            f"{p.inter_node_gbps:g}", f"{p.price.usd_per_gpu_hour:.2f}" if p.price else "-",
        )
    print_table(Console(), table)
