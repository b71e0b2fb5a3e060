"""What the web page shows, computed without Streamlit: the sweep, the ranked table, the chosen plan's
estimate, exports, the hardware comparison and the points of the sweep scatter.

A :class:`Job` holds every input that changes the sweep as plain values, so `Job.key()` is a short
string that Streamlit's cache can hash cheaply (see `ui.web.cache`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from meshplan.estimator import rules
from meshplan.estimator.config import (
    AC_MODES,
    EP_COMM_BACKENDS,
    FLOAT8_RECIPES,
    PP_SCHEDULES,
    RESHARD_POLICIES,
)
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import HardwareProfile, load_hardware
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.stages import DEFAULT_LESS
from meshplan.estimator.report import GIB_DECIMALS, estimate
from meshplan.estimator.stack import load_stack as _load_stack
from meshplan.planner.capacity import train_time
from meshplan.planner.search import SearchResult, plan_search, short_config
from meshplan.planner.views import COMPARE_HARDWARE as SHARED_COMPARE_HARDWARE
from meshplan.ui.web.inputs import search_space

EXPORT_FORMATS = {  # format -> (button label, file suffix, mime type)
    "torchtitan-toml": ("torchtitan config (TOML, 0.2.x)", ".toml", "application/toml"),
    # torchtitan imports it by module name (--module meshplan_job), so its file name is fixed
    "torchtitan-py": ("torchtitan 0.3 config module", "meshplan_job.py", "text/x-python"),
    "torchtitan-cli": ("torchtitan 0.3 command line", "-torchtitan.sh", "text/x-shellscript"),
    "torchrun": ("torchrun script", "-torchrun.sh", "text/x-shellscript"),
    "slurm": ("Slurm batch script", ".sbatch", "text/x-shellscript"),
    "mpirun": ("mpirun script", "-mpirun.sh", "text/x-shellscript"),
}
COMPARE_HARDWARE = SHARED_COMPARE_HARDWARE[:3]  # preselected in Compare (each is a sweep)


@dataclass(frozen=True)
class Job:
    """Inputs of one sweep, as plain values (model and hardware as JSON)."""

    model: str
    model_source: str
    hardware: str
    nodes: int
    gpus_per_node: int
    seq_len: int
    global_batch: int
    memory_margin: float
    objective: str = "throughput"
    pins: str = "{}"
    stack: str = "torchtitan"

    @classmethod
    def make(cls, model: ModelSpec, model_source: str, hw: HardwareProfile, nodes: int, gpus_per_node: int,
             seq_len: int, global_batch: int, memory_margin: float, objective: str = "throughput",
             pins: dict | None = None, stack: str = "torchtitan") -> Job:
        if nodes < 1 or gpus_per_node < 1:
            raise MeshplanError("the cluster needs at least one node of at least one GPU")
        return cls(model.model_dump_json(), model_source, hw.model_dump_json(), int(nodes), int(gpus_per_node),
                   int(seq_len), int(global_batch), float(memory_margin), objective,
                   json.dumps(pins or {}, sort_keys=True), stack)

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_key(cls, key: str) -> Job:
        return cls(**json.loads(key))

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def model_spec(self) -> ModelSpec:
        return ModelSpec.model_validate_json(self.model)

    def hw(self) -> HardwareProfile:
        return HardwareProfile.model_validate_json(self.hardware)

    def pin_dict(self) -> dict:
        return json.loads(self.pins)

    def with_hardware(self, hw: HardwareProfile, gpus_per_node: int) -> Job:
        nodes = max(1, self.world // gpus_per_node)
        return Job(self.model, self.model_source, hw.model_dump_json(), nodes, gpus_per_node, self.seq_len,
                   self.global_batch, self.memory_margin, self.objective, self.pins, self.stack)


@functools.lru_cache(maxsize=8)
def load_stack(name: str):
    """A stack profile by name, parsed once per process (the estimator only reads it; a YAML parse is ~35 ms of
    every rerun otherwise)."""
    return _load_stack(name)


def run_sweep(job: Job) -> SearchResult:
    return plan_search(
        job.model_spec(), job.hw(), load_stack(job.stack), job.world, job.gpus_per_node, job.seq_len,
        job.global_batch, job.memory_margin, job.objective, space=search_space(job.pin_dict()),
    )


def price_of(hw: HardwareProfile) -> float | None:
    return hw.price.usd_per_gpu_hour if hw.price else None


# ---- vectorised text for many configurations --------------------------------------------------------


def config_columns(res: SearchResult, idx: np.ndarray) -> pd.DataFrame:
    """Configuration columns (torchtitan names) for the configurations `idx` of a sweep."""
    c = res.configs
    idx = np.asarray(idx, dtype=np.int64)
    return pd.DataFrame({
        "dp_replicate": c.dp_replicate[idx], "dp_shard": c.dp_shard[idx], "tp": c.tp[idx], "pp": c.pp[idx],
        "cp": c.cp[idx], "ep": c.ep[idx], "pp_schedule": np.asarray(PP_SCHEDULES, dtype=object)[c.schedule[idx]],
        "vpp": c.vpp[idx], "micro_batch_size": c.micro_batch[idx],
        "ac": np.asarray(AC_MODES, dtype=object)[c.ac[idx]],
        "float8": np.asarray(FLOAT8_RECIPES, dtype=object)[c.float8[idx]],
        "compile": c.compile[idx].astype(bool), "async_tp": c.async_tp[idx].astype(bool),
        "cpu_offload": c.cpu_offload[idx].astype(bool),
        "pp_first_stage_less_layers": c.pp_first_stage_less_layers[idx],
        "pp_last_stage_less_layers": c.pp_last_stage_less_layers[idx],
        "dtype": np.where(c.bf16_state[idx] > 0, "bfloat16", "float32").astype(object),
        "fsdp_reshard_after_forward": np.asarray(RESHARD_POLICIES, dtype=object)[
            c.reshard[idx] if c.reshard is not None else np.zeros(len(idx), dtype=np.int64)],
        "expert_parallel_comm_backend": np.asarray(EP_COMM_BACKENDS, dtype=object)[c.ep_backend[idx]],
    })


def summaries(cols: pd.DataFrame) -> pd.Series:
    """`planner.search.short_config` for every row of `config_columns`, vectorised."""
    if cols.empty:
        return pd.Series([], dtype=object)
    s = "dp " + cols.dp_replicate.astype(str) + "x" + cols.dp_shard.astype(str)
    for k in ("tp", "pp", "cp", "ep"):
        s = s + np.where(cols[k] > 1, f", {k} " + cols[k].astype(str), "")
    sched = cols.pp_schedule + np.where(cols.vpp > 1, "/v" + cols.vpp.astype(str), "")
    first, last = cols.pp_first_stage_less_layers, cols.pp_last_stage_less_layers
    sched = sched + np.where((first != DEFAULT_LESS) | (last != DEFAULT_LESS), " split " + first.astype(str) + "/" + last.astype(str), "")
    s = s + np.where(cols.pp > 1, ", " + sched, "")
    s = s + ", mbs " + cols.micro_batch_size.astype(str) + ", AC " + cols.ac
    s = s + np.where(cols.float8 != "none", ", fp8 " + cols.float8, "")
    s = s + np.where(cols.dtype != "float32", ", dtype bf16", "")
    s = s + np.where(cols.compile, ", compile", "") + np.where(cols.async_tp, ", async TP", "")
    s = s + np.where(cols.cpu_offload, ", CPU offload", "")
    s = s + np.where(cols.fsdp_reshard_after_forward != "default", ", reshard " + cols.fsdp_reshard_after_forward, "")
    return s + np.where(cols.expert_parallel_comm_backend != "standard", ", " + cols.expert_parallel_comm_backend, "")


def ranked_frame(res: SearchResult, top: int, tokens: float | None, price: float | None) -> pd.DataFrame:
    """The `top` best configurations, best first, with estimates (and days and cost for a token budget)."""
    idx = res.ranked[:top]
    cols = config_columns(res, idx)
    df = pd.DataFrame({"rank": np.arange(1, len(idx) + 1), "configuration": summaries(cols)})
    df = pd.concat([df, cols], axis=1)
    # the estimate's own rounding (GIB_DECIMALS, `meshplan estimate --json`), so the table, the plan picker
    # and the metrics, each shown to one decimal, agree (68.5505 rounded to 2 first would show 68.5, the
    # estimate's 68.551 shows 68.6)
    df["peak_gib"] = np.round(res.peak_gib[idx], GIB_DECIMALS)
    df["headroom_gib"] = np.round(res.limit_gib - df["peak_gib"].to_numpy(), 4)
    df["tokens_per_sec_per_gpu"] = np.round(res.tps[idx], 1)
    df["mfu_pct"] = np.round(res.mfu[idx] * 100, 2)
    df["step_time_s"] = np.round(res.step_s[idx], 3)
    df["host_gib_per_node"] = np.round(res.host_gib[idx], 1)
    if tokens:
        # from the rounded tokens/s/GPU the metrics use too (the estimate's), so days and dollars agree to the unit
        t = train_time(tokens, df["tokens_per_sec_per_gpu"].to_numpy(), res.world, price)
        df["days"] = np.round(t["days"], 2)
        if price is not None:
            df["cost_usd"] = np.round(t["cost_usd"], 0)
    df["index"] = idx
    return df


def reason_table(res: SearchResult) -> pd.DataFrame:
    """Rejections by reason with one example each (memory included)."""
    rows = []
    for code in sorted(int(k) for k in np.unique(res.reason) if k != 0):
        idx = np.flatnonzero(res.reason == code)
        example = int(idx[np.nanargmin(res.peak_gib[idx])]) if code == rules.MEMORY else int(idx[0])
        why = res.reason_text(example)
        if code == rules.MEMORY:  # the closest miss: enough digits to tell peak and limit apart
            why = (f"does not fit: peak {res.peak_gib[example]:.2f} GiB > {res.limit_gib:.2f} GiB "
                   f"({res.memory_margin:.0%} of {res.hw.usable_hbm_gib:.2f} usable)")
        rows.append({"reason": _rule_name(code), "configurations": len(idx),
                     "example": short_config(res.config(example)) + (" (closest)" if code == rules.MEMORY else ""),
                     "why": why})
    return pd.DataFrame(rows, columns=["reason", "configurations", "example", "why"])


def _rule_name(code: int) -> str:
    from meshplan.planner.space import REASON_KEYS

    return REASON_KEYS[code].replace("_", " ")


# ---- scatter points ----------------------------------------------------------------------------------


def sweep_points(res: SearchResult, max_points: int | None = 6000, grid: tuple[int, int] = (400, 250)) -> pd.DataFrame:
    """Points of the throughput-vs-memory scatter: every configuration that has an estimate.

    Columns: index (into the sweep), peak_gib, tps, fits (bool), pareto (bool), count (configurations
    this point stands for), label, reason. Rule-rejected configurations have no estimate and are not
    points (see `reason_table`). When a class (fitting / not fitting) has more than `max_points` points,
    configurations that fall into the same cell of a `grid` (log memory x throughput) are drawn as one
    point, the best ranked (fitting) or the lowest memory (not fitting); Pareto points are always kept.
    `max_points=None` keeps every configuration.
    """
    frames = []
    pareto = set(int(i) for i in res.pareto)
    rank_pos = np.full(res.evaluated, np.iinfo(np.int64).max)
    rank_pos[res.ranked] = np.arange(len(res.ranked))
    ev = np.flatnonzero(~np.isnan(res.peak_gib))
    if len(ev) == 0:
        return _points_frame(res, np.array([], dtype=np.int64), np.array([], dtype=np.int64), pareto)
    lx = np.log(np.maximum(res.peak_gib[ev], 1e-6))
    y = res.tps[ev]
    span_x, span_y = max(lx.max() - lx.min(), 1e-9), max(y.max() - y.min(), 1e-9)
    for code in (0, 9):
        idx = np.flatnonzero(res.reason == code)
        count = np.ones(len(idx), dtype=np.int64)
        if max_points is not None and len(idx) > max_points:
            gx, gy = grid
            while True:  # coarsen the grid until the class has at most max_points cells
                bx = np.floor((np.log(np.maximum(res.peak_gib[idx], 1e-6)) - lx.min()) / span_x * gx)
                by = np.floor((res.tps[idx] - y.min()) / span_y * gy)
                cell = (bx * (gy + 1) + by).astype(np.int64)
                if len(np.unique(cell)) <= max_points or gx <= 8:
                    break
                gx, gy = int(gx * 0.7), int(gy * 0.7)
            order_key = rank_pos[idx] if code == 0 else res.peak_gib[idx]
            order = np.lexsort((order_key, cell))
            first = np.ones(len(order), dtype=bool)
            first[1:] = cell[order][1:] != cell[order][:-1]
            _, counts = np.unique(cell[order], return_counts=True)
            keep, count = idx[order][first], counts
            extra = np.array(sorted(pareto - set(int(i) for i in keep)), dtype=np.int64) if code == 0 else []
            if len(extra):
                # a Pareto point shares a cell with a better-ranked one: keep both, move one from the count
                extra_cells = cell[np.searchsorted(idx, extra)]
                cells_kept = cell[order][first]
                pos = np.searchsorted(cells_kept, extra_cells)
                np.subtract.at(count, pos, 1)
                keep = np.concatenate([keep, extra])
                count = np.concatenate([count, np.ones(len(extra), dtype=np.int64)])
            idx = keep
        frames.append((idx, count))
    idx = np.concatenate([f[0] for f in frames]).astype(np.int64)
    count = np.concatenate([f[1] for f in frames]).astype(np.int64)
    return _points_frame(res, idx, count, pareto)


def _points_frame(res: SearchResult, idx: np.ndarray, count: np.ndarray, pareto: set[int]) -> pd.DataFrame:
    cols = config_columns(res, idx)
    fits = res.reason[idx] == 0
    peak = res.peak_gib[idx]
    reason = np.where(
        fits, "",
        "does not fit: peak " + pd.Series(peak).map("{:.1f}".format).to_numpy(dtype=object)
        + f" GiB > {res.limit_gib:.1f} GiB ({res.memory_margin:.0%} of {res.hw.usable_hbm_gib:.1f} usable)",
    )
    return pd.DataFrame({
        "index": idx, "peak_gib": peak, "tps": res.tps[idx], "mfu": res.mfu[idx], "fits": fits,
        "pareto": np.isin(idx, np.fromiter(pareto, dtype=np.int64, count=len(pareto))),
        "count": count, "label": summaries(cols).to_numpy(dtype=object), "reason": reason,
    })


# ---- the chosen plan ---------------------------------------------------------------------------------


def config_estimate(job: Job, cfg: dict) -> dict:
    """The estimator's full report (memory per stage, time breakdown, warnings) for one configuration."""
    from meshplan.estimator.config import TrainConfig

    return estimate(job.model_spec(), job.hw(), TrainConfig(**cfg), load_stack(job.stack), job.memory_margin)


def time_to_train(tokens: float | None, tps: float, gpus: int, price: float | None) -> dict | None:
    if not tokens:
        return None
    return train_time(tokens, tps, gpus, price)


def exports(job: Job, cfg: dict, est: dict, tokens: float | None, plan_path: str | None = None,
            init_from: str | None = None) -> dict:
    """Download files for one configuration: {key: (label, file name, text, mime)} and {format: error}.

    Keys: `plan` (the plan YAML), every format of `planner.export`. Scripts point at `plan_path`
    (default: the plan's file name, next to the script); a fine-tuning plan starts from `init_from` (an absolute
    path as the nodes see it: the page's server runs elsewhere).
    """
    from meshplan.estimator.config import TrainConfig
    from meshplan.planner.export import render
    from meshplan.planner.plan_file import make_plan, plan_yaml

    if init_from is not None and not init_from.startswith("/"):
        raise MeshplanError(f"the checkpoint folder must be an absolute path as the nodes see it, got {init_from!r}")
    plan = make_plan(job.model_spec(), job.model_source, job.hw(), TrainConfig(**cfg), est, stack=job.stack,
                     tokens=int(tokens) if tokens else None, init_from=init_from)
    name = f"{plan.name}.yaml"
    files = {"plan": ("plan (YAML)", name, plan_yaml(plan), "application/x-yaml")}
    errors = {}
    for fmt, (label, suffix, mime) in EXPORT_FORMATS.items():
        try:
            filename = suffix if fmt == "torchtitan-py" else f"{plan.name}{suffix}"
            files[fmt] = (label, filename, render(plan, fmt, plan_path or name), mime)
        except MeshplanError as exc:
            errors[fmt] = str(exc)
    return {"files": files, "errors": errors}


def sweep_csv(res: SearchResult) -> str:
    """The whole sweep as CSV, the same columns as `meshplan plan --csv` (meshplan.planner.views)."""
    from meshplan.planner.views import sweep_csv as shared_sweep_csv

    return shared_sweep_csv(res)


# ---- hardware comparison -----------------------------------------------------------------------------


def hardware_row(job: Job, res: SearchResult, tokens: float | None) -> dict:
    """The best configuration of one sweep as one row of the hardware comparison (meshplan.planner.views)."""
    from meshplan.planner.views import hardware_row as shared_row

    return shared_row(res, tokens, current=res.hw.id == job.hw().id)


def compare_job(job: Job, hw_id: str) -> Job:
    """The same job (model, GPU count, batch, margin, pins) on another hardware profile."""
    current = job.hw()
    hw = current if hw_id in (current.id, current.id.removesuffix("-custom")) else load_hardware(hw_id)
    gpn = hw.gpus_per_node if job.world % hw.gpus_per_node == 0 else job.gpus_per_node
    return job.with_hardware(hw, gpn)
