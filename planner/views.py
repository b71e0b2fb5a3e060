"""What the command line and both UIs show, computed once: the sweep as CSV (`meshplan plan --csv`, the web
app's download). Pure Python over a SearchResult; no UI toolkit here.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from meshplan.estimator import rules
from meshplan.estimator.config import AC_MODES, FLOAT8_RECIPES, PP_SCHEDULES
from meshplan.estimator.physics.stages import LESS_FIELDS
from meshplan.planner.capacity import DEFAULT_NODES
from meshplan.planner.search import SearchResult

SWEEP_COLUMNS = ["dp_replicate", "dp_shard", "cp", "tp", "pp", "pp_schedule", "vpp", *LESS_FIELDS, "micro_batch_size", "ac",
                 "float8", "compile", "async_tp", "status", "peak_gib", "tokens_per_sec_per_gpu", "mfu", "step_time_s",
                 "reason"]


def sweep_csv(res: SearchResult) -> str:
    """The whole sweep as CSV: every configuration, its estimate or why it was rejected."""
    buf = io.StringIO()
    c = res.configs
    w = csv.writer(buf)
    w.writerow(SWEEP_COLUMNS)
    reasons_cache: dict = {}
    for i in range(res.evaluated):
        code = int(res.reason[i])
        if code == 0:
            status, reason = "fits", ""
        else:
            status = "oom" if code == rules.MEMORY else "invalid"
            key = (code, i) if code == rules.MEMORY else (code, int(c.tp[i]), int(c.pp[i]), int(c.cp[i]), int(c.vpp[i]),
                                               int(c.micro_batch[i]), int(c.float8[i]), int(c.dp_shard[i]))
            reason = reasons_cache.get(key)
            if reason is None:
                reason = res.reason_text(i)
                if code != rules.MEMORY:
                    reasons_cache[key] = reason
        w.writerow([
            int(c.dp_replicate[i]), int(c.dp_shard[i]), int(c.cp[i]), int(c.tp[i]), int(c.pp[i]),
            PP_SCHEDULES[int(c.schedule[i])], int(c.vpp[i]), *(int(getattr(c, f)[i]) for f in LESS_FIELDS),
            int(c.micro_batch[i]), AC_MODES[int(c.ac[i])],
            FLOAT8_RECIPES[int(c.float8[i])], bool(c.compile[i]), bool(c.async_tp[i]), status,
            "" if np.isnan(res.peak_gib[i]) else round(float(res.peak_gib[i]), 3),
            "" if np.isnan(res.tps[i]) else round(float(res.tps[i]), 1),
            "" if np.isnan(res.mfu[i]) else round(float(res.mfu[i]), 4),
            "" if np.isnan(res.step_s[i]) else round(float(res.step_s[i]), 4), reason,
        ])
    return buf.getvalue()


# ---- the hardware comparison ----------------------------------------------------------------------------
# the accelerators both UIs compare against by default (the web app preselects the first three)
COMPARE_HARDWARE = ("h100-sxm", "h200-sxm", "b200", "mi300x", "a100-sxm-80g")


def _row(hw, nodes: int, gpus_per_node: int, current: bool) -> dict:
    """A hardware-comparison row with nothing found yet."""
    return {"hardware": hw.id, "name": hw.name, "current": current, "nodes": nodes, "gpus_per_node": gpus_per_node,
            "gpus": nodes * gpus_per_node, "fits": False, "configuration": "", "compact": "", "peak_gib": None,
            "usable_gib": hw.usable_hbm_gib, "tokens_per_sec_per_gpu": None, "mfu": None, "days": None,
            "gpu_hours": None, "cost_usd": None, "usd_per_gpu_hour": hw.price.usd_per_gpu_hour if hw.price else None,
            "why_not": ""}


def hardware_row(res: SearchResult, tokens: float | None, current: bool = False) -> dict:
    """The best plan of one sweep as a row of the hardware comparison: memory (GiB, GIB_DECIMALS), tokens/s/GPU,
    MFU, and days / GPU-hours / USD for `tokens` when given; `why_not` when nothing fits."""
    from meshplan.estimator.report import GIB_DECIMALS
    from meshplan.planner.capacity import train_time
    from meshplan.planner.labels import compact_config, short_config
    from meshplan.planner.search import explain_empty

    hw = res.hw
    row = _row(hw, res.world // res.gpus_per_node, res.gpus_per_node, current)
    row["fits"] = len(res.ranked) > 0
    price = row["usd_per_gpu_hour"]
    if not len(res.ranked):
        row["why_not"] = explain_empty(res)
        return row
    i = int(res.ranked[0])
    cfg = res.config(i)
    row.update(configuration=short_config(cfg), compact=compact_config(cfg),
               peak_gib=round(float(res.peak_gib[i]), GIB_DECIMALS),
               tokens_per_sec_per_gpu=round(float(res.tps[i]), 1), mfu=round(float(res.mfu[i]), 4))
    if tokens:
        row.update({k: train_time(tokens, float(res.tps[i]), res.world, price)[k]
                    for k in ("days", "gpu_hours", "cost_usd")})
    return row


def compare_hardware(model, stack, hardware: list, world: int, gpus_per_node: int | None, seq_len: int,
                     global_batch: int, memory_margin: float, objective: str, tokens: float | None,
                     current: str | None = None, space=None) -> list[dict]:
    """The same model at about the same GPU count on each accelerator in `hardware` (ids or profiles): the best
    plan on each (`hardware_row`), or why none fits (a search error included). `gpus_per_node` overrides the
    profile's for the `current` accelerator only; the others use their own node size. `space` (a SearchSpace:
    pins, the fine-tuning mode) applies to every accelerator."""
    from meshplan.estimator.errors import MeshplanError
    from meshplan.estimator.hardware import load_hardware
    from meshplan.planner.search import plan_search

    rows = []
    for entry in hardware:
        hw = load_hardware(entry) if isinstance(entry, str) else entry
        is_current = hw.id == current
        gpn = gpus_per_node if is_current and gpus_per_node else hw.gpus_per_node
        nodes = max(1, world // gpn)
        try:
            res = plan_search(model, hw, stack, nodes * gpn, gpn, seq_len, global_batch, memory_margin, objective,
                              space=space)
        except MeshplanError as exc:
            rows.append({**_row(hw, nodes, gpn, is_current), "why_not": str(exc)})
            continue
        rows.append(hardware_row(res, tokens, current=is_current))
    return rows


# ---- the capacity question: one job scanned over node counts and accelerators ------------------------------
SCAN_NODES = DEFAULT_NODES  # the node counts both UIs scan by default (as `meshplan capacity`)


def node_scan(model, stack, hardware: list, node_counts, seq_len: int, global_batch: int, memory_margin: float,
              objective: str, tokens: float | None, space=None, current: tuple[str, int] | None = None,
              known=None, progress=None) -> list[dict]:
    """The best plan (`hardware_row`) of the job on every accelerator in `hardware` (profiles) at every node count
    (each profile's own node size): the rows of the capacity charts and answers. `known` is the sweep already run
    for `current` = (hardware id, nodes), reused so that cluster's row equals the plan views' numbers; the other
    clusters search with torch.compile on unless `space` pins it (it wins on every stack modelled, and halves the
    work). `progress(done, total)` after each cluster."""
    import dataclasses

    from meshplan.estimator.errors import MeshplanError
    from meshplan.planner.search import plan_search
    from meshplan.planner.space import SearchSpace

    base = space if space is not None else SearchSpace()
    fast = base if base.compile is not None else dataclasses.replace(base, compile=[True])
    rows, total, done = [], len(hardware) * len(node_counts), 0
    for hw in hardware:
        for nodes in node_counts:
            is_current = current is not None and (hw.id, nodes) == tuple(current)
            try:
                res = known if is_current and known is not None else plan_search(
                    model, hw, stack, nodes * hw.gpus_per_node, hw.gpus_per_node, seq_len, global_batch,
                    memory_margin, objective, space=fast)
                rows.append(hardware_row(res, tokens, current=is_current))
            except MeshplanError as exc:
                rows.append({**_row(hw, nodes, hw.gpus_per_node, is_current), "why_not": str(exc)})
            done += 1
            if progress:
                progress(done, total)
    return rows


def memory_by_seq(model, hw, stack, cfg: dict, seq_lens, memory_margin: float) -> list[dict]:
    """The peak memory (GiB) of one configuration at each sequence length in `seq_lens`, the global batch held in
    tokens (fewer, longer sequences), with why a length cannot run that configuration (a rule) where it cannot."""
    from meshplan.estimator.config import TrainConfig
    from meshplan.estimator.report import GIB_DECIMALS, estimate
    from meshplan.estimator.rules import check

    tokens = cfg["global_batch_size"] * cfg["seq_len"]
    dp_mb = cfg["dp_replicate"] * cfg["dp_shard"] * cfg["micro_batch_size"]
    out = []
    for s in seq_lens:
        gb = max(dp_mb, round(tokens / s / dp_mb) * dp_mb)
        c = {**cfg, "seq_len": int(s), "global_batch_size": int(gb)}
        why = check(model, hw, c)
        point = {"seq_len": int(s), "global_batch_size": int(gb), "peak_gib": None, "why_not": why or "",
                 "limit_gib": hw.usable_hbm_gib * memory_margin, "current": int(s) == cfg["seq_len"]}
        if why is None:
            est = estimate(model, hw, TrainConfig(**c), stack, memory_margin)
            point["peak_gib"] = round(est["memory"]["peak_gib"], GIB_DECIMALS)
        out.append(point)
    return out


def scan_answers(rows: list[dict], deadline_days: float | None, budget_usd: float | None,
                 current_nodes: int | None = None, current_hw: str | None = None) -> dict:
    """The capacity answers over `node_scan` rows (planner.capacity.answers) plus, where the current cluster does
    not fit, the smallest node count of its accelerator that does ("add nodes")."""
    from meshplan.planner.capacity import answers

    out = answers(rows, deadline_days, budget_usd)
    out["add_nodes"] = None
    if current_hw is not None and current_nodes is not None:
        here = [r for r in rows if r["hardware"] == current_hw and r["nodes"] == current_nodes]
        bigger = [r for r in rows if r["hardware"] == current_hw and r["fits"] and r["nodes"] > current_nodes]
        if here and not here[0]["fits"] and bigger:
            out["add_nodes"] = min(bigger, key=lambda r: r["nodes"])
    return out


def add_nodes_hint(res) -> str:
    """Where a sweep in which nothing fits starts to fit: the smallest node count of `SCAN_NODES` above it (same
    accelerator, node size, batch and search space) with its best plan, as one sentence; '' when none does or
    something fits already."""
    from meshplan.planner.labels import short_config
    from meshplan.planner.search import plan_search

    if len(res.ranked):
        return ""
    nodes = res.world // res.gpus_per_node
    for n in (k for k in SCAN_NODES if k > nodes):
        other = plan_search(res.model, res.hw, res.stack, n * res.gpus_per_node, res.gpus_per_node, res.seq_len,
                            res.global_batch, res.memory_margin, res.objective, space=res.space)
        if len(other.ranked):
            i = int(other.ranked[0])
            return (f"it fits from {n} nodes ({other.world} GPUs): {short_config(other.config(i))} at "
                    f"{other.peak_gib[i]:.1f} GiB, {other.tps[i]:,.0f} tok/s/GPU")
    return ""
