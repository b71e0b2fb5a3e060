"""Modal screens: help, export to a directory, and the launch preview."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Static

# (heading, [(key or field, what it does)]) - rendered as two-column tables that wrap at any width
HELP = (
    ("Form (top)", [
        ("f", "jump to the form; tab / shift+tab move between fields"),
        ("enter", "apply: run the search and go to the results (leaving a changed field runs it too)"),
        ("esc", "back to the results"),
        ("", "invalid values turn red and are explained under the form; the previous results stay on screen "
             "until a search succeeds"),
        ("model", "a preset ({models}), a path to a meshplan model YAML, a Hugging Face config.json or a "
                  "downloaded model's folder holding one; → accepts the suggested name"),
        ("hardware", "a profile ({hardware}; → accepts the suggested name) or a path to a hardware profile YAML "
                     "of your own (copy one from data/hardware_profiles/)"),
        ("objective", "throughput | time | cost"),
        ("nodes", "number of nodes; GPUs/node empty: the hardware profile's"),
        ("seq len", "tokens per sequence"),
        ("batch", "global batch in sequences (512), or in tokens with a unit: 4Mi tok, 4194304 tokens; a target: "
                  "each layout trains the nearest batch it divides, within 10 % (3 nodes: 510 or 504)"),
        ("tokens", "token budget for time-to-train and cost: 2T, 2e12, 500B (empty: none)"),
        ("margin", "fraction of usable HBM a plan may use: 0.9 or 90%"),
    ]),
    ("Views (or ←/→ on the tab bar)", [
        ("p  Plans", "the ranked configurations that fit; ↑/↓ choose one: its memory per GPU (per pipeline "
                     "stage when pp > 1) against the limit │ and usable HBM ┃, throughput, MFU, step time, "
                     "time-to-train and cost show below"),
        ("s / r", "sort by the next column / reverse the order (or click a column's header)"),
        ("/", "filter the plans: words every shown configuration contains (tp2 +atp, pp4, fp8:row, hsdp); "
              "enter keeps the filter, esc clears it"),
        ("space", "mark up to 3 plans for Compare"),
        ("t  Tree", "the decision tree; enter or space expands a step: why it is taken or not, its best "
                    "configuration, the alternatives it rejected and why"),
        ("c  Compare", "the marked plans side by side (the top 3 when fewer than 2 are marked)"),
        ("h  Hardware", "the same model at the same GPU count on other accelerators; enter switches to one"),
        ("n  Nodes", "the capacity question: the job on its accelerator at 1..64 nodes (★ yours); type a deadline "
                     "in days and a budget in US$ (2M, 3e6) for the cheapest and the fastest cluster that meet "
                     "them; 'add nodes' says where the model starts to fit; enter switches the form to a node count"),
    ]),
    ("Ranking", [
        ("rule", "plans that fit rank by tokens/s/GPU in 1 % bands (the estimate is not finer than that); within "
                 "a band, plans without CPU offload first, then lower peak memory, then higher exact throughput. "
                 "At a fixed cluster, days and dollars to train order the same way; objective time or cost "
                 "matter when clusters differ (the Nodes and Hardware views)"),
        ("fits", "peak reserved memory of the worst rank <= margin x usable HBM, and host RAM per node within "
                 "the node's"),
    ]),
    ("Columns and labels", [
        ("#", "rank (● marked for Compare)"),
        ("GiB", "peak reserved GPU memory of the worst rank (what torch.cuda.max_memory_reserved reports)"),
        ("tok/s", "tokens per second per GPU;  MFU: model FLOPs utilisation;  step s: seconds per optimizer step"),
        ("train, cost", "days and US$ to train the token budget at the profile's price per GPU-hour"),
        ("default: …", "words most plans shown share: the configuration cells keep only what tells plans apart (a "
                       "plan without a default says how it differs: -c, bf16, tp1); the detail below spells the "
                       "chosen plan out. Words the filter names stay out of the header (every plan shown has them); "
                       "a closing … means the header had no room for more: the detail lists them"),
        ("fsdp64", "FSDP2 sharding over 64 GPUs;  hsdp2x32: 2 replicas of 32-way FSDP (HSDP)"),
        ("tp cp ep", "tensor, context and expert parallel degrees (tp8 cp2 ep8)"),
        ("pp4/1f1b", "4 pipeline stages with the 1F1B schedule; gpipe = GPipe, i1f1bv2 = interleaved 1F1B with "
                     "2 stages per rank"),
        ("mb2", "micro-batch of 2 sequences"),
        ("AC:", "activation checkpointing: no, sel (selective, per op), full (every block)"),
        ("fp8:", "Float8 training (torchao): ten = tensorwise, row = rowwise, mxf = MXFP8"),
        ("+c +atp +off", "torch.compile · async tensor parallel · FSDP2 CPU offload"),
        ("dt:b16 rs:", "training dtype bfloat16 (bf16 weights, gradients and AdamW state: the form's dtype) · FSDP "
                       "reshard after forward always / never (the form's reshard; default: not shown)"),
    ]),
    ("Actions", [
        ("e", "export the chosen plan to a directory: plan YAML, torchtitan TOML, 0.3 config module and command "
              "line, torchrun, Slurm and mpirun scripts"),
        ("l", "preview the launch: what `meshplan launch PLAN --backend torchrun|slurm|mpirun --dry-run` prints"),
        ("y", "copy the exported plan's launch command to the clipboard (OSC 52: your terminal's clipboard, over "
              "ssh too where the terminal allows it); in the preview, for the backend shown"),
        ("d", "light / dark theme"),
        ("? / F1", "this help"),
        ("q / ctrl+q", "quit"),
    ]),
)


def help_renderable(models: list[str], hardware: list[str]):
    from rich.console import Group
    from rich.table import Table

    parts: list = [Text.from_markup("[b]meshplan[/b]: plan distributed LLM training (FSDP2/HSDP, TP, PP, CP, "
                                    "Float8, compile, AC) before spending a GPU-hour.\n")]
    fill = {"models": ", ".join(models) or "…", "hardware": ", ".join(hardware) or "…"}
    for heading, rows in HELP:
        parts.append(Text(heading, style="bold underline"))
        table = Table(box=None, show_header=False, pad_edge=False, expand=True)
        table.add_column(style="bold", no_wrap=True, width=12)
        table.add_column(ratio=1)
        for key, text in rows:
            table.add_row(key, text.format(**fill))
        parts.append(table)
        parts.append(Text(""))
    parts.append(Text("esc, q or ? closes this help", style="dim"))
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "close")]

    def __init__(self, models: list[str], hardware: list[str]):
        super().__init__()
        self.models, self.hardware = models, hardware

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body", classes="dialog"):
            yield Static(help_renderable(self.models, self.hardware), id="help-text")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()


class ExportScreen(ModalScreen[list[Path] | None]):
    """Ask for a directory (and optional #SBATCH values), write every export there, list what was written."""

    BINDINGS = [Binding("escape", "close", "close")]

    def __init__(self, summary: str, default_dir: str, writer: Callable[[str, str, str], tuple[list[Path], dict[str, str]]]):
        super().__init__()
        self.summary, self.default_dir, self.writer = summary, default_dir, writer
        self.written: list[Path] | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="export-dialog", classes="dialog"):
            yield Label("[b]Export the chosen plan[/b]")
            yield Static(self.summary, id="export-summary", markup=False)
            with Horizontal(classes="row"):
                yield Label("directory", classes="label")
                yield Input(self.default_dir, id="export-dir", compact=True)
            with Horizontal(classes="row"):
                yield Label("partition", classes="label")
                yield Input(placeholder="slurm #SBATCH --partition (optional)", id="export-partition", compact=True)
            with Horizontal(classes="row"):
                yield Label("time", classes="label")
                yield Input(placeholder="slurm #SBATCH --time, e.g. 2-00:00:00 (optional)", id="export-time",
                            compact=True)
            yield Static("writes the plan YAML, torchtitan TOML and CLI, torchrun, Slurm and mpirun scripts",
                         id="export-msg")
            yield Static("[b]enter[/b] write   [b]esc[/b] close", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#export-dir", Input).focus()

    @on(Input.Submitted)
    def write(self) -> None:
        msg = self.query_one("#export-msg", Static)
        try:
            paths, skipped = self.writer(self.query_one("#export-dir", Input).value,
                                         self.query_one("#export-partition", Input).value.strip(),
                                         self.query_one("#export-time", Input).value.strip())
        except (ValueError, OSError) as exc:  # MeshplanError is a ValueError
            msg.set_class(True, "error")
            msg.update(Text(f"✗ {exc}"))
            return
        self.written = paths
        msg.set_class(False, "error")
        folder = paths[0].parent
        text = Text(f"✓ wrote {len(paths)} files to {folder}:", style="green")
        for p in paths:
            text.append(f"\n  {p.name}", style="")
        by_reason: dict[str, list[str]] = {}  # said, not silently dropped; one line per reason
        for fmt, why in skipped.items():
            by_reason.setdefault(why, []).append(fmt)
        for why, fmts in by_reason.items():
            text.append(f"\n  not written: {', '.join(fmts)}: {why}", style="yellow")
        msg.update(text)

    def action_close(self) -> None:
        self.dismiss(self.written)


class LaunchScreen(ModalScreen[None]):
    """What `meshplan launch PLAN --backend B --dry-run` would print, for torchrun, Slurm and mpirun."""

    BINDINGS = [
        Binding("1", "backend('torchrun')", "torchrun"),
        Binding("2", "backend('slurm')", "slurm"),
        Binding("3", "backend('mpirun')", "mpirun"),
        Binding("y", "copy", "copy command"),
        Binding("escape,q,l", "dismiss", "close"),
    ]

    def __init__(self, preview: Callable[[str], tuple[str, str]], backend: str = "torchrun",
                 plan_file: str | None = None):
        super().__init__()
        self.preview, self.backend, self.plan_file = preview, backend, plan_file

    def action_copy(self) -> None:
        """Copy the command that launches this plan with the backend shown (OSC 52), once it is exported."""
        from meshplan.ui.tui.logic import launch_command

        if self.plan_file is None:
            self.notify("this plan is not exported yet: esc, then e writes its files", severity="warning")
            return
        command = launch_command(self.plan_file, self.backend)
        self.app.copy_to_clipboard(command)
        self.notify(f"copied: {command}", timeout=4)

    def compose(self) -> ComposeResult:
        with Vertical(id="launch-dialog", classes="dialog"):
            yield Static(id="launch-cmd")
            with VerticalScroll(id="launch-body"):
                yield Static(id="launch-text", markup=False)
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.action_backend(self.backend)
        self.query_one("#launch-body").focus()

    def action_backend(self, backend: str) -> None:
        self.backend = backend
        try:
            cmd, text = self.preview(backend)
        except (ValueError, OSError) as exc:
            cmd, text = f"meshplan launch PLAN --backend {backend} --dry-run", f"error: {exc}"
        head = Text("preview ", style="bold")
        head.append(f"$ {cmd}", style="bold green")
        head.append("\nnothing is started or written; 1 torchrun · 2 slurm · 3 mpirun · y copies the launch command",
                    style="dim")
        self.query_one("#launch-cmd", Static).update(head)
        self.query_one("#launch-text", Static).update(text)
        self.query_one("#launch-body", VerticalScroll).scroll_home(animate=False)
