"""`meshplan tui`: the planner in the terminal (Textual), for login nodes reached over SSH without a browser.

Textual is imported only when the command runs, so `meshplan --help` and the other commands stay fast.
"""

from __future__ import annotations

import importlib.util
import sys

import typer

from meshplan.commands import finetune_options as ft
from meshplan.estimator.errors import MeshplanError
from meshplan.planner.labels import OBJECTIVES

THEMES = ("dark", "light")


def check_terminal() -> None:
    """A one-line error instead of escape codes written forever when there is no terminal to draw on."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise MeshplanError("meshplan tui needs a terminal (stdin and stdout are not one); "
                            "use `meshplan plan` in scripts")


def form_values(model: str, hardware: str, nodes: int, gpus_per_node: int | None, seq_len: int,
                global_batch_size: int | None, global_batch_tokens: int | None, tokens: str | None,
                memory_margin: float, objective: str, finetune: str = "none", cpu_offload: str = "auto",
                lora_rank: int = 16, dtype: str = "float32", reshard: str = "default") -> dict[str, str]:
    """The command's options as the text of the TUI's form fields (the form checks them, inline)."""
    if global_batch_size and global_batch_tokens:
        raise MeshplanError("give either --global-batch-size (sequences) or --global-batch-tokens, not both")
    if global_batch_size:
        batch = str(global_batch_size)
    elif global_batch_tokens:
        batch = f"{global_batch_tokens} tok"
    else:
        batch = "4Mi tok"
    return {
        "model": model, "hardware": hardware, "objective": objective, "nodes": str(nodes),
        "gpus_per_node": str(gpus_per_node) if gpus_per_node else "", "seq_len": str(seq_len), "batch": batch,
        "tokens": "" if tokens is None or tokens.strip().lower() in ("", "0", "none") else tokens.strip(),
        "margin": f"{memory_margin:g}",
        "train": "pretrain" if finetune == "none" else finetune, "offload": cpu_offload, "lora_rank": str(lora_rank),
        "dtype": dtype, "reshard": reshard,
    }


def tui_cmd(
    model: str = typer.Option("llama3-70b", "--model", "-m", help="preset name, meshplan model YAML, or HF config.json"),
    hardware: str = typer.Option("h100-sxm", "--hardware", help="hardware profile id"),
    nodes: int = typer.Option(8, "--nodes", help="number of nodes"),
    gpus_per_node: int = typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the hardware profile's)"),
    seq_len: int = typer.Option(8192, "--seq-len", help="tokens per sequence"),
    global_batch_size: int = typer.Option(None, "--global-batch-size", help="sequences per optimizer step"),
    global_batch_tokens: int = typer.Option(
        None, "--global-batch-tokens", help="tokens per optimizer step [default: 4Mi tokens]"
    ),
    tokens: str = typer.Option("2T", "--tokens", help="token budget for time-to-train and cost: 2T, 2e12, none"),
    memory_margin: float = typer.Option(0.9, "--memory-margin", help="fraction of usable HBM a plan may use"),
    objective: str = typer.Option("throughput", "--objective", help="throughput | time | cost"),
    finetune: str = typer.Option("none", "--finetune", help="none (pre-training) | full | lora | qlora: fine-tune a "
                                 "pretrained checkpoint (the form's train field)"),
    lora_rank: int = typer.Option(16, "--lora-rank", help="LoRA / QLoRA adapter rank"),
    cpu_offload: str = typer.Option("auto", "--cpu-offload", help="auto | on | off: FSDP2 CPU offload (auto: the "
                                    "planner's choice, tried for fine-tuning)"),
    dtype: str = typer.Option("float32", "--dtype", help="torchtitan's training.dtype: float32 (fp32 state, bf16 "
                              "compute) | bfloat16 (bf16 state: 8 bytes a parameter, not 16); the form's dtype field"),
    reshard: str = typer.Option("default", "--fsdp-reshard-after-forward", help="torchtitan's parallelism."
                                "fsdp_reshard_after_forward: default | always | never; the form's reshard field"),
    theme: str = typer.Option("dark", "--theme", help="dark | light (d toggles it in the app)"),
    stack: str = typer.Option("torchtitan", "--stack", help="framework behaviour profile every search uses: a "
                              "built-in id (torchtitan, torchtitan-2026-03, llm-foundry, generic, ...) or a stack YAML "
                              "(the one `meshplan calibrate` writes); the exported plans keep it"),
    ep_comm_backend: ft.EPCommBackend = ft.EP_COMM_BACKEND,
    document_tokens: int = ft.DOCUMENT_TOKENS,
) -> None:
    """Plan in the terminal: the form, ranked plans with memory bars (per pipeline stage), throughput,
    time-to-train and cost, the decision tree, side-by-side and hardware comparisons; export the plan,
    torchtitan config and torchrun / Slurm / mpirun scripts, and preview the launch. Keyboard only;
    80x24 and up; ? shows the keys.

    The options fill the form; values the form rejects are shown there, not as errors here.

    Example: meshplan tui --model llama3-70b --hardware h100-sxm --nodes 8 --tokens 2T

    Your own calibrated profile: meshplan tui --model llama3-70b --stack ./mycluster.yaml

    Fine-tuning: meshplan tui --model llama3-70b --nodes 2 --seq-len 4096 --global-batch-size 32 --finetune lora
    """
    if theme not in THEMES:
        raise MeshplanError(f"--theme must be one of {', '.join(THEMES)}, got {theme!r}")
    if objective not in OBJECTIVES:
        raise MeshplanError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if importlib.util.find_spec("textual") is None:
        raise MeshplanError("the terminal UI needs textual: pip install 'meshplan[ui]'")
    from meshplan.estimator.stack import load_stack

    load_stack(stack)  # a bad name or file: one line here, not inside the app
    values = form_values(model, hardware, nodes, gpus_per_node, seq_len, global_batch_size, global_batch_tokens,
                         tokens, memory_margin, objective, finetune, cpu_offload, lora_rank, dtype, reshard)
    check_terminal()
    from meshplan.ui.tui.app import MeshplanApp

    app = MeshplanApp(values, theme=theme, stack=stack, ep_backend=ep_comm_backend.value,
                      document_tokens=document_tokens)
    app.run()
    raise typer.Exit(app.return_code or 0)  # an unexpected crash inside the app is a non-zero exit
