"""Measured next to predicted: read a run directory and set its metrics beside the plan's estimate.

A run directory holds `plan.yaml` (copied there by `meshplan launch`) and `metrics.jsonl` (one object per
optimizer step, written by rank 0 of the training core). Optionally appends the run to a CSV in the
ground-truth schema (`shared/ground_truth/runs.csv`), so measured runs can check the estimator later.
No torch import here.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from meshplan.estimator import data_files
from meshplan.estimator.config import COMPILE_COMPONENTS
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.report import estimate
from meshplan.estimator.stack import stack_names
from meshplan.estimator.validate import (
    ATTENTION_COLUMNS,
    CONFIG_COLUMNS,
    GROUP_COLUMNS,
    MEASURED_COLUMNS,
    MLA_COLUMNS,
    MOE_COLUMNS,
)
from meshplan.planner.plan_file import Plan, load_plan

WARMUP_STEPS = 2  # the first steps include compilation and allocator warm-up; medians skip them
PHASES = ("data_s", "fwd_bwd_s", "optimizer_s")  # a step's phases the training core times (seconds)
GROUND_TRUTH_COLUMNS = (
    "id", "source", "framework", "model", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
    "tied_embeddings", "mlp", "seq_len", "hardware", "gpus", "gpus_per_node", "dp_replicate", "dp_shard", "tp",
    "pp", "pp_schedule", "vpp", "cp", "global_batch_size", "micro_batch_size", "precision", "float8_recipe",
    "compile", "ac", "async_tp", "measured_tps_per_gpu", "measured_mem_gib", "measured_mfu", "status", "notes",
)
assert set(CONFIG_COLUMNS) | set(MEASURED_COLUMNS) <= set(GROUND_TRUTH_COLUMNS)
# after the schema's columns, where a run needs them: an attention head's width that is not hidden / heads (Qwen3)
# and what compile compiled where it was not torchtitan's default (model and loss)
OPTIONAL_COLUMNS = ATTENTION_COLUMNS + MOE_COLUMNS + MLA_COLUMNS + ("compile_components", "moe_force_load_balance")


@dataclass
class RunSummary:
    run_dir: Path
    plan: Plan
    steps: int
    device: str
    measured_tps_per_gpu: float
    measured_step_time_s: float
    measured_peak_gib: float
    measured_mfu: float | None
    final_loss: float
    predicted: dict
    measured_phases_s: dict[str, float] | None = None  # median seconds of data / fwd_bwd / optimizer, when logged
    measured_allocated_gib: float | None = None  # torch's max allocated (CUDA runs)
    step_overhead_s: float = 0.0  # the stack profile's fixed per-step overhead (grad clip, optimizer launch)

    @property
    def tps_error(self) -> float:
        return self.predicted["throughput"]["tokens_per_sec_per_gpu"] / self.measured_tps_per_gpu - 1

    @property
    def mem_error(self) -> float:
        return self.predicted["memory"]["peak_gib"] / self.measured_peak_gib - 1

    def as_dict(self) -> dict:
        p = self.predicted
        return {
            "run_dir": str(self.run_dir),
            "device": self.device,
            "steps": self.steps,
            "predicted": {
                "hardware": self.plan.hardware.id,
                "tokens_per_sec_per_gpu": p["throughput"]["tokens_per_sec_per_gpu"],
                "step_time_s": p["throughput"]["step_time_s"],
                "peak_gib": p["memory"]["peak_gib"],
                "mfu": p["throughput"]["mfu"],
            },
            "measured": {
                "tokens_per_sec_per_gpu": self.measured_tps_per_gpu,
                "step_time_s": self.measured_step_time_s,
                "peak_gib": self.measured_peak_gib,
                "mfu": self.measured_mfu,
                "final_loss": self.final_loss,
            },
            "error": {"tokens_per_sec_per_gpu": round(self.tps_error, 4), "peak_gib": round(self.mem_error, 4)},
            "terms": self.terms(),
        }

    def terms(self) -> list[dict]:
        """The estimate's parts set beside what the run measured of them, furthest off first: the step's forward
        and backward (compute, collectives, bubble) and its optimizer phase (grad clip, AdamW, the stack's fixed
        per-step overhead) in seconds; the allocated peak (state, activations, buffers) and the allocator's reserve
        above it in GiB. `share` is the term's error as a fraction of the whole (step time or peak memory), so the
        first entry is what moved the estimate most."""
        p = self.predicted
        out = []
        step, ph = p["throughput"]["step_time_s"], self.measured_phases_s
        if ph is not None:
            optim = p["throughput"]["breakdown_s"]["optimizer_step"] + self.step_overhead_s
            for name, pred, meas in (("forward + backward (compute, collectives, bubble)", step - optim,
                                      ph["fwd_bwd_s"]),
                                     ("optimizer phase (grad clip, AdamW, per-step overhead)", optim, ph["optimizer_s"])):
                out.append(_term(name, "s", pred, meas, self.measured_step_time_s))
        if self.measured_allocated_gib is not None:
            alloc, peak = p["memory"]["allocated_gib"], p["memory"]["peak_gib"]
            out.append(_term("allocated peak (state, activations, buffers)", "GiB", alloc, self.measured_allocated_gib,
                             self.measured_peak_gib))
            out.append(_term("allocator reserve above allocated (fragmentation)", "GiB", peak - alloc,
                             self.measured_peak_gib - self.measured_allocated_gib, self.measured_peak_gib))
        return sorted(out, key=lambda t: -abs(t["share"]))


def _term(name: str, unit: str, predicted: float, measured: float, whole: float) -> dict:
    return {"term": name, "unit": unit, "predicted": round(predicted, 4), "measured": round(measured, 4),
            "error": round(predicted / measured - 1, 4) if measured > 0 else None,
            "share": round((predicted - measured) / whole, 4) if whole > 0 else 0.0}


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        raise MeshplanError(f"no metrics in {path.parent}: {path.name} is missing (did the run start?)")
    rows = []
    for n, line in enumerate(data_files.read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise MeshplanError(f"{path}:{n} is not a JSON object") from None
        if not isinstance(obj, dict) or "step" not in obj:
            raise MeshplanError(f"{path}:{n} has no 'step'")
        rows.append(obj)
    if not rows:
        raise MeshplanError(f"{path} holds no steps yet")
    return rows


def summarize_run(run_dir: str | Path) -> RunSummary:
    """Median throughput after warm-up, peak memory over all steps, and the plan's prediction."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MeshplanError(f"run directory not found: {run_dir}")
    plan = load_plan(run_dir / "plan.yaml")
    rows = read_metrics(run_dir / "metrics.jsonl")
    steady = rows[WARMUP_STEPS:] or rows
    for key in ("tokens_per_sec_per_gpu", "step_time_s", "peak_mem_gib", "loss"):
        if any(key not in r for r in rows):
            raise MeshplanError(f"{run_dir / 'metrics.jsonl'}: some steps lack '{key}'")
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    stack = plan.stack_of()
    if stack.attention_kernel == "sdpa":
        predicted = plan.estimate or estimate(plan.model, plan.hardware, plan.train_config(), stack)
    else:  # the core calls F.scaled_dot_product_attention whatever its plan's stack times (torchtitan 0.3: Flex)
        cfg = plan.train_config().model_copy(update={"attention_kernel": "sdpa"})
        predicted = estimate(plan.model, plan.hardware, cfg, stack)
    phases = None
    if all(k in r for r in steady for k in PHASES):
        phases = {k: statistics.median(r[k] for r in steady) for k in PHASES}
    allocated = [r["peak_active_gib"] for r in rows if "peak_active_gib" in r]
    return RunSummary(
        run_dir=run_dir,
        plan=plan,
        steps=len(rows),
        device=str(rows[-1].get("device", "unknown")),
        measured_tps_per_gpu=statistics.median(r["tokens_per_sec_per_gpu"] for r in steady),
        measured_step_time_s=statistics.median(r["step_time_s"] for r in steady),
        measured_peak_gib=max(r["peak_mem_gib"] for r in rows),
        measured_mfu=statistics.median(mfus) if mfus else None,
        final_loss=float(rows[-1]["loss"]),
        predicted=predicted,
        measured_phases_s=phases,
        measured_allocated_gib=max(allocated) if len(allocated) == len(rows) else None,
        step_overhead_s=stack.step_overhead_s,
    )


def config_row(plan: Plan, hardware: str) -> dict:
    """The plan's configuration columns of the ground-truth schema (model, layout, batch, precision), on `hardware`."""
    p, m = plan.parallel, plan.model
    return {
        "framework": "meshplan",
        "model": m.name,
        "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
        "ffn_hidden": m.ffn_hidden, "vocab": m.vocab, "tied_embeddings": str(m.tied_embeddings).lower(),
        "mlp": m.mlp, "seq_len": plan.training.seq_len, "hardware": hardware, "gpus": plan.cluster.gpus,
        "gpus_per_node": plan.cluster.gpus_per_node, "dp_replicate": p.dp_replicate, "dp_shard": p.dp_shard,
        "tp": p.tp, "pp": p.pp, "pp_schedule": p.pp_schedule if p.pp > 1 else "", "vpp": p.vpp if p.pp > 1 else "",
        "cp": p.cp, "global_batch_size": plan.training.global_batch_size, "micro_batch_size": p.micro_batch_size,
        "precision": _precision(p.float8, plan.training.dtype), "float8_recipe": "" if p.float8 == "none" else p.float8,
        "compile": str(p.compile).lower(), "ac": p.ac, "async_tp": str(p.async_tp).lower(),
        **({"head_dim": m.head_dim} if m.head_dim is not None and m.head_dim * m.heads != m.hidden else {}),
        **({"qk_norm": "true"} if m.qk_norm else {}),
        **({"ep": p.ep, **{c: getattr(m.moe, c) for c in MOE_COLUMNS if c not in ("ep", *GROUP_COLUMNS)}}
           if m.moe else {}),
        **({c: getattr(m.moe, c) for c in GROUP_COLUMNS} if m.moe and m.moe.group_limited else {}),
        **({c: getattr(m.mla, c) for c in MLA_COLUMNS} if m.mla else {}),
        **({"compile_components": " ".join(p.compile_components)}
           if p.compile and p.compile_components != COMPILE_COMPONENTS else {}),
        **({"moe_force_load_balance": "true"} if plan.training.moe_force_load_balance else {}),
    }


def measurement_row(s: RunSummary, run_id: str | None = None) -> dict:
    """The run as one row of the ground-truth schema (the hardware is the device it ran on)."""
    plan, p, m = s.plan, s.plan.parallel, s.plan.model
    hardware = plan.hardware.id if s.device.startswith("cuda") else s.device
    return {
        "id": run_id or f"meshplan-{s.run_dir.name}",
        "source": f"meshplan run {s.run_dir.name} ({datetime.now(UTC).date().isoformat()})",
        **config_row(plan, hardware),
        "measured_tps_per_gpu": round(s.measured_tps_per_gpu, 2), "measured_mem_gib": round(s.measured_peak_gib, 3),
        "measured_mfu": "" if s.measured_mfu is None else round(100 * s.measured_mfu, 2), "status": "ok",
        "notes": (
            f"{s.steps} steps on {s.device}; median after {WARMUP_STEPS} warm-up steps; memory = "
            + ("max reserved" if s.device.startswith("cuda") else "peak RSS")
            + (f" (max allocated {s.measured_allocated_gib:.2f} GiB)" if s.measured_allocated_gib is not None else "")
            + f"; predicted {s.predicted['throughput']['tokens_per_sec_per_gpu']:.1f} tok/s/GPU and "
            f"{s.predicted['memory']['peak_gib']:.2f} GiB for {plan.hardware.id}"
            + ("; training dtype bfloat16 (no fp32 master)" if plan.training.dtype == "bfloat16" else "")
            + (f"; ran as stack {plan.stack}" if plan.stack in stack_names() else "")
            + (f"; forward + backward {1e3 * s.measured_phases_s['fwd_bwd_s']:.1f} ms, optimizer phase (clip, AdamW, "
               f"per-step) {1e3 * s.measured_phases_s['optimizer_s']:.1f} ms (medians)" if s.measured_phases_s else "")
            + (f"; mixture of experts: {m.moe.experts} experts (width {m.moe.expert_ffn_hidden}), top-{m.moe.top_k}, "
               f"ep {p.ep}" if m.moe else "")
        ),
    }


def _precision(float8: str, dtype: str) -> str:
    """The schema's precision cell: fp8 (Float8 linears), bf16 (mixed precision over fp32 state), or bf16-pure
    (torchtitan's training.dtype bfloat16, which `meshplan validate` reads back; with Float8 the notes say it)."""
    if float8 != "none":
        return "fp8"
    return "bf16-pure" if dtype == "bfloat16" else "bf16"


def append_measurement(csv_path: str | Path, row: dict) -> Path:
    """Append one row, writing the header when the file is new; refuses a file with another schema. The header is
    the ground-truth schema and, after it, the optional columns (`OPTIONAL_COLUMNS`) its rows need: a row that needs
    one the file lacks rewrites the file with that column added (empty for the rows before), whole or not at all."""
    csv_path = Path(csv_path)
    exists = csv_path.exists() and csv_path.stat().st_size > 0
    needed = tuple(c for c in OPTIONAL_COLUMNS if str(row.get(c, "")).strip())
    header: tuple[str, ...] = GROUND_TRUTH_COLUMNS + needed
    if exists:
        with csv_path.open(newline="") as fh:
            reader = csv.reader(fh)
            found = tuple(next(reader, []))
            extra = found[len(GROUND_TRUTH_COLUMNS):]
            if found[:len(GROUND_TRUTH_COLUMNS)] != GROUND_TRUTH_COLUMNS or not set(extra) <= set(OPTIONAL_COLUMNS):
                raise MeshplanError(f"{csv_path} is not in the ground-truth schema (its header differs)")
            missing = tuple(c for c in needed if c not in extra)
            if not missing:
                header = found
            else:  # the file gains the column: rewritten beside, then renamed over it
                header = found + missing
                old_rows = list(reader)
                tmp = csv_path.with_name(csv_path.name + ".tmp")
                with tmp.open("w", newline="") as out:
                    w = csv.writer(out)
                    w.writerow(header)
                    w.writerows(r + [""] * len(missing) for r in old_rows)
                tmp.replace(csv_path)
    elif not csv_path.parent.exists():
        raise MeshplanError(f"output folder does not exist: {csv_path.parent}")
    with csv_path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header, restval="", extrasaction="ignore")
        if not exists:
            w.writeheader()
        w.writerow(row)
    return csv_path
