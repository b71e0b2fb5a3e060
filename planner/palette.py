"""One palette for every view: each memory and time category's short label (terminal), long label (web, legends)
and colour, the same in the CLI, the web app and the terminal UI. Colours are Tableau 10, which read on light
and dark backgrounds alike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CategoryStyle:
    short: str  # a few characters, for an 80-column terminal
    label: str  # for legends and tables
    color: str  # hex RGB


# the estimator's MEMORY_CATEGORIES, in stacking order
MEMORY_STYLE: dict[str, CategoryStyle] = {
    "params_fp32": CategoryStyle("params", "parameters (fp32 shard)", "#4e79a7"),
    "frozen_params": CategoryStyle("frozen", "frozen weights (bf16 / NF4 shard)", "#a0cbe8"),
    "grads_fp32": CategoryStyle("grads", "gradients (fp32 shard)", "#76b7b2"),
    "optimizer_states": CategoryStyle("optim", "AdamW states", "#b07aa1"),
    "unsharded_params": CategoryStyle("unsh.params", "all-gathered bf16 params", "#59a14f"),
    "unsharded_grads": CategoryStyle("unsh.grads", "unsharded bf16 grads", "#8cd17d"),
    "activations": CategoryStyle("activ", "activations", "#edc948"),
    "logits_loss": CategoryStyle("logits", "logits + loss", "#f28e2b"),
    "transient": CategoryStyle("transient", "transient buffers", "#e15759"),
    "fragmentation": CategoryStyle("frag", "allocator fragmentation", "#9c755f"),
}

# the estimator's TIME_CATEGORIES; a category keeps its colour in every chart
TIME_STYLE: dict[str, CategoryStyle] = {
    "compute": CategoryStyle("compute", "compute", "#4e79a7"),
    "recompute": CategoryStyle("recomp", "recompute (AC)", "#a0cbe8"),
    "float8_casts": CategoryStyle("fp8", "Float8 casts", "#f28e2b"),
    "elementwise": CategoryStyle("elem", "elementwise", "#ffbe7d"),
    "overhead": CategoryStyle("overhead", "launch, FSDP + step overhead", "#bab0ac"),
    "fsdp_exposed": CategoryStyle("fsdp", "FSDP comm (exposed)", "#59a14f"),
    "tp_exposed": CategoryStyle("tp", "TP comm (exposed)", "#8cd17d"),
    "cp_exposed": CategoryStyle("cp", "CP comm (exposed)", "#b07aa1"),
    "ep_all_to_all": CategoryStyle("a2a", "EP all-to-all", "#d37295"),
    "nf4_dequant": CategoryStyle("nf4", "NF4 dequantize (QLoRA)", "#fabfd2"),
    "offload_exposed": CategoryStyle("offload", "CPU offload copies (exposed)", "#9c755f"),
    "pp_bubble": CategoryStyle("bubble", "pipeline bubble", "#e15759"),
    "pp_p2p": CategoryStyle("p2p", "pipeline P2P", "#ff9d9a"),
    "dp_allreduce": CategoryStyle("dp", "DP all-reduce", "#76b7b2"),
    "optimizer_step": CategoryStyle("optim", "optimizer step", "#edc948"),
}

# marks shared by the memory charts and bars: the usable HBM, the safety margin's limit, what fits, the choice
STATUS_COLORS: dict[str, str] = {"usable": "#d62728", "limit": "#ff7f0e", "fits": "#1f77b4", "oom": "#e45756",
                                 "chosen": "#ffd700", "taken": "#2ca02c"}
