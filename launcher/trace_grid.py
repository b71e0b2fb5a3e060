"""A grid of traced configurations for llama3-8b and llama3-70b, and the analytical model's error per
category against the trace (`meshplan trace-grid`, `benchmarks/trace_grid.py --write-readme`).

The models keep their true hidden size, heads, KV heads, FFN width and vocabulary; only the layer count is
reduced (GRID_LAYERS) so the grid runs in minutes on two CPU cores. Per-layer terms (block params, saved
activations per layer, unsharded blocks) are per layer in both the trace and the model, and the per-model
terms (embedding, output head, logits) are unchanged, so the comparison stays valid; the totals weigh the
per-model terms more than a full-depth model would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import ModelSpec, load_model
from meshplan.estimator.stack import load_stack

GRID_LAYERS = {"llama3-8b": 8, "llama3-70b": 4}
CATEGORIES = ("params", "grads", "optimizer", "unsharded_params", "activations", "total")

# (model, dp_shard, tp, pp, ac, micro_batch, seq_len); one microbatch per step without PP (see notes),
# 2*pp microbatches with PP (1F1B)
GRID: list[tuple[str, int, int, int, str, int, int]] = [
    ("llama3-8b", 8, 1, 1, "selective", 1, 8192),
    ("llama3-8b", 8, 1, 1, "none", 1, 4096),
    ("llama3-8b", 8, 1, 1, "full", 2, 8192),
    ("llama3-8b", 4, 2, 1, "selective", 1, 8192),
    ("llama3-8b", 2, 4, 1, "full", 1, 16384),
    ("llama3-8b", 4, 1, 2, "selective", 1, 8192),
    ("llama3-70b", 64, 8, 1, "full", 1, 8192),
    ("llama3-70b", 16, 4, 1, "selective", 1, 4096),
    ("llama3-70b", 8, 8, 2, "full", 1, 8192),
]
QUICK = [GRID[0], GRID[3], GRID[5]]


def grid_model(name: str) -> ModelSpec:
    spec = load_model(name)
    return ModelSpec.model_validate({**spec.model_dump(), "layers": GRID_LAYERS[name]})


def run_grid(quick: bool = False, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Trace every grid configuration; one row per traced rank with traced / analytical bytes and errors."""
    from meshplan.launcher.core.config import RunConfig
    from meshplan.launcher.trace import _in_subprocess, trace_config
    from meshplan.launcher.trace_compare import compare, embedding_partial_bytes

    hw, stack = load_hardware("h100-sxm"), load_stack("torchtitan")
    rows = []
    grid = QUICK if quick else GRID
    for i, (name, ds, tp, pp, ac, mbs, seq) in enumerate(grid, 1):
        say = (lambda msg, i=i: progress(f"[{i}/{len(grid)}] {msg}")) if progress else None
        micro = 2 * pp if pp > 1 else 1
        cfg = RunConfig.from_dict({
            "model": grid_model(name).model_dump(), "dp_shard": ds, "tp": tp, "pp": pp, "ac": ac,
            "micro_batch_size": mbs, "seq_len": seq, "global_batch_size": ds * mbs * micro,
        })
        t0 = time.perf_counter()
        if say:
            say(f"{name} dp_shard {ds} x tp {tp} x pp {pp}, AC {ac}")
        result = _in_subprocess(trace_config, cfg, None)
        for row in compare(result, hw, stack):
            rows.append({
                "model": name, "layers": GRID_LAYERS[name], "dp_shard": ds, "tp": tp, "pp": pp, "ac": ac,
                "micro_batch": mbs, "seq_len": seq, "microbatches": micro, "pp_rank": row["pp_rank"],
                "traced": row["traced"], "analytical": row["analytical"], "error": row["error"],
                "embedding_partial": embedding_partial_bytes(cfg, row["pp_rank"]),
                "seconds": round(time.perf_counter() - t0, 1), "max_rss_mib": round(result.max_rss_mib),
            })
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The grid report: per configuration and traced rank, traced GiB and the analytical model's error."""
    gib = float(2**30)
    lines = [
        "Per-GPU tensor memory traced on a CPU (`meshplan trace-grid`: fake tensors + fake process group, the "
        "training core's own TP/SP/FSDP2/AC code, bf16 compute / fp32 master weights and reduce, AdamW, step 2 "
        "of 2) against the analytical model (`estimator/batch.py`, torchtitan stack). Models keep their true "
        "hidden / heads / FFN / vocab sizes with "
        + ", ".join(f"{k} cut to {v} layers" for k, v in GRID_LAYERS.items())
        + "; `pp` rows are the first (0) and last (1) stage. Cells: traced GiB (analytical error, "
        "analytical / traced - 1); in brackets, the total's error once stage 0's full-vocabulary embedding "
        "gradient (TP + PP, which the model leaves out; see above) is added.",
        "",
        "| model | dp_shard x tp x pp | AC | mbs x seq | stage | params | grads | optimizer | unsharded params "
        "| activations | total at peak | trace s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r['traced'][k] / gib:.2f} ({r['error'][k]:+.1%})" for k in CATEGORIES]
        if r.get("embedding_partial"):
            with_emb = (r["analytical"]["total"] + r["embedding_partial"]) / r["traced"]["total"] - 1
            cells[CATEGORIES.index("total")] += f" [{with_emb:+.1%}]"
        lines.append(
            f"| {r['model']} ({r['layers']} layers) | {r['dp_shard']} x {r['tp']} x {r['pp']} | {r['ac']} "
            f"| {r['micro_batch']} x {r['seq_len']} | {r['pp_rank'] if r['pp'] > 1 else '-'} | "
            + " | ".join(cells) + f" | {r['seconds']:.0f} |"
        )
    worst = {k: max(rows, key=lambda r, k=k: abs(r["error"][k])) for k in CATEGORIES}
    lines += [
        "",
        "Largest disagreement per category: "
        + "; ".join(f"{k} {worst[k]['error'][k]:+.1%}" for k in CATEGORIES) + ".",
    ]
    return "\n".join(lines)
