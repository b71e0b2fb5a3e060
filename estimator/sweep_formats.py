"""Sweep outputs in their own words, read as ground-truth rows: Hugging Face bench_cluster's global summary.

`bench_cluster report --global_summary` (the nanotron DP x TP x PP sweep behind the Ultra-Scale Playbook) writes one
row a run: model (its `llama-*` name), run_name (`dp-{dp}_tp-{tp}_pp-{pp}_mbz-{mbs}_bapr-{bapr}`, `_recompute_layer`
when every block was recomputed), status (completed / oom / fail / timeout / ...), nnodes, dp, tp, pp,
batch_accumulation_per_replica, micro_batch_size, tok/s/gpu (-1 where the run left none), mfu, forward, backward.
What it does not record (sequence length, hardware, the model's shape, the optimizer) comes from the script's
defaults in `data/sweeps/bench_cluster.yaml`, which names where each was read.
"""

from __future__ import annotations

import functools

from meshplan.estimator import data_files
from meshplan.estimator.errors import MeshplanError

BENCH_CLUSTER_COLUMNS = ("model", "run_name", "dp", "tp", "pp", "batch_accumulation_per_replica",
                         "micro_batch_size", "tok/s/gpu")


def is_bench_cluster(header: list[str]) -> bool:
    """Whether a CSV header is bench_cluster's global summary (its own columns, not the ground-truth schema's)."""
    return all(c in header for c in BENCH_CLUSTER_COLUMNS) and "gpus" not in header


@functools.cache
def bench_cluster_defaults() -> dict:
    """bench_cluster's defaults and model shapes (`data/sweeps/bench_cluster.yaml`)."""
    return data_files.read_yaml(data_files.data_dir("sweeps") / "bench_cluster.yaml")


def _whole(row: dict, column: str, line: int) -> int:
    value = (row.get(column) or "").strip()
    try:
        n = int(float(value))
    except (ValueError, OverflowError):  # not a number, or inf
        raise MeshplanError(f"line {line}: {column} {value!r} is not a whole number (bench_cluster writes e.g. 8)") \
            from None
    if n < 1 or n != float(value):
        raise MeshplanError(f"line {line}: {column} {value!r} must be a positive whole number")
    return n


def _measured(cell: str | None) -> str:
    """tok/s/gpu as measured, '' where bench_cluster left its -1 placeholder (a run that logged no step)."""
    value = (cell or "").strip()
    try:
        return value if float(value) > 0 else ""
    except ValueError:
        return ""


def bench_cluster_rows(rows: list[dict]) -> list[dict]:
    """bench_cluster summary rows as ground-truth rows (every cell a string, as csv.DictReader gives them)."""
    d = bench_cluster_defaults()
    models = d["models"]
    out = []
    for line, row in enumerate(rows, start=2):
        name = (row.get("model") or "").strip()
        if name not in models:
            raise MeshplanError(f"line {line}: model {name!r} is not one of bench_cluster's "
                                f"({', '.join(models)}); give the run in the ground-truth schema instead")
        shape = models[name]
        dp, tp, pp = (_whole(row, c, line) for c in ("dp", "tp", "pp"))
        bapr = _whole(row, "batch_accumulation_per_replica", line)
        mbs = _whole(row, "micro_batch_size", line)
        nnodes = (row.get("nnodes") or "").strip()
        if nnodes and dp * tp * pp >= 8 and nnodes.isdigit() and int(nnodes) * d["gpus_per_node"] > dp * tp * pp:
            raise MeshplanError(f"line {line}: {dp * tp * pp} GPUs on {nnodes} nodes is bench_cluster's swiss-ai "
                                "cluster (4 GH200 a node), which meshplan has no profile for; give those runs in the "
                                "ground-truth schema with a hardware profile of their own")
        run = (row.get("run_name") or "").strip()
        recompute = run.endswith("_recompute_layer")
        out.append({
            "id": f"{name}/{run or f'dp-{dp}_tp-{tp}_pp-{pp}_mbz-{mbs}_bapr-{bapr}'}",
            "source": d["source"], "framework": d["framework"], "model": name,
            "layers": str(shape["layers"]), "hidden": str(shape["hidden"]), "heads": str(shape["heads"]),
            "kv_heads": str(shape["heads"]), "ffn_hidden": str(shape["ffn_hidden"]), "vocab": str(d["vocab"]),
            "tied_embeddings": str(d["tied_embeddings"]).lower(), "mlp": d["mlp"], "seq_len": str(d["seq_len"]),
            "hardware": d["hardware"], "gpus": str(dp * tp * pp), "gpus_per_node": str(d["gpus_per_node"]),
            "dp_replicate": str(dp), "dp_shard": "1", "tp": str(tp), "pp": str(pp),
            "pp_schedule": d["pp_schedule"] if pp > 1 else "", "vpp": "", "cp": "1",
            "global_batch_size": str(dp * bapr * mbs), "micro_batch_size": str(mbs), "precision": d["precision"],
            "float8_recipe": "", "compile": "false", "ac": "full" if recompute else "none", "async_tp": "false",
            "measured_tps_per_gpu": _measured(row.get("tok/s/gpu")), "measured_mem_gib": "", "measured_mfu": "",
            "status": (row.get("status") or "").strip(), "notes": d["notes"],
        })
    return out
