"""`meshplan export-weights`: a run's trained weights as Hugging Face safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console


def export_weights_cmd(
    run_dir: Path = typer.Argument(..., help="the run directory (meshplan launch --run-dir; holds config.json and "
                                   "checkpoints/)"),
    output: Path = typer.Option(..., "--output", "-o", help="a new folder for the Hugging Face checkpoint"),
    merge: bool = typer.Option(False, "--merge", help="LoRA / QLoRA: write full weights W + alpha/r B A instead of "
                               "the adapters (reads the frozen weights from the run's --init-from again)"),
    step: int = typer.Option(None, "--step", min=1, help="export this step's checkpoint [the newest intact one]"),
    dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16, float16 or float32"),
    as_json: bool = typer.Option(False, "--json", help="print what was written as JSON"),
) -> None:
    """Write a run's newest intact checkpoint as a Hugging Face checkpoint others load: full weights
    (model-*.safetensors, index, config.json) or, for LoRA / QLoRA, the adapters in PEFT's format
    (adapter_model.safetensors, adapter_config.json; --merge for full weights).

    Example: meshplan export-weights runs/llama-70b-lora -o llama-70b-lora-adapters
    """
    from meshplan.launcher.export_weights import export_weights

    out = export_weights(run_dir, output, merge=merge, step=step, dtype=dtype)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    Console().print(f"wrote {out['what']} of {out['checkpoint']} to {out['out_dir']}: {', '.join(out['files'])}")
