"""What the terminal UI shows, computed without Textual: the sweep, table rows, the chosen
plan's estimate, the hardware comparison, exports and the launch preview.

numpy, the estimator and the planner are imported inside the functions that need them, so the app
paints its first frame before they load (they load in a worker thread right after).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from meshplan.estimator.errors import MeshplanError
from meshplan.planner.labels import compact_config
from meshplan.ui.tui.form import (
    EXPORTS,
    SORTS,
    TABLE_ROWS,
    FieldError,
    Inputs,
    fmt_days,
    fmt_money,
)

# ---- the sweep -----------------------------------------------------------------------------------------


@dataclass
class Result:
    """One finished sweep and what the screens read from it."""

    inputs: Inputs
    res: object  # planner.search.SearchResult
    tree: list[dict]
    estimates: dict = field(default_factory=dict)
    compact: dict = field(default_factory=dict)
    search_text: dict = field(default_factory=dict)  # sweep index -> what the plans filter matches (`searchable`)

    @property
    def world(self) -> int:
        return self.res.world

    @property
    def nodes(self) -> int:
        return self.res.world // self.res.gpus_per_node

    @property
    def price(self) -> float | None:
        hw = self.res.hw
        return hw.price.usd_per_gpu_hour if hw.price else None

    def describe(self) -> str:
        r = self.res
        moe = r.model.moe
        kind = f" · MoE {moe.experts}e top-{moe.top_k}" if moe else ""
        ft = r.finetune or {}
        if ft:
            kind += " · " + {"full": "full FT", "lora": "LoRA", "qlora": "QLoRA"}[ft["finetune"]]
            kind += f" r{ft['lora_rank']}" if ft["finetune"] != "full" else ""
        if r.stack.id != "torchtitan":  # `meshplan tui --stack`: another framework or the team's calibrated profile
            kind += f" · stack {r.stack.id}"
        if r.space is not None and r.space.expert_parallel_comm_backend != "standard":  # --ep-comm-backend
            kind += f" · EP {r.space.expert_parallel_comm_backend}"
        if r.space is not None and r.space.document_tokens:  # --document-tokens
            kind += f" · docs ~{r.space.document_tokens:,} tok"
        return (f"{r.model.name}{kind} · {self.nodes}x{r.gpus_per_node} {r.hw.id} · seq {r.seq_len} · gbs "
                f"{r.global_batch} · {len(r.ranked):,}/{r.evaluated:,} fit")


def load_inputs(inp: Inputs):
    """(model, hardware, stack) for the form's names; FieldError names the field that failed."""
    from meshplan.estimator.hardware import load_hardware
    from meshplan.estimator.model_spec import load_model
    from meshplan.estimator.stack import load_stack

    try:
        model = load_model(inp.model)
    except MeshplanError as exc:
        raise FieldError("model", f"model: {exc}") from None
    try:
        hw = load_hardware(inp.hardware)
    except MeshplanError as exc:
        raise FieldError("hardware", f"hardware: {exc}") from None
    return model, hw, load_stack(inp.stack)


def run(inp: Inputs) -> Result:
    """Load, sweep and explain; MeshplanError (one line) when nothing fits or an input is wrong."""
    from meshplan.planner.search import explain_empty, plan_search
    from meshplan.planner.tree import decision_tree

    model, hw, stack = load_inputs(inp)
    gpn = inp.gpus_per_node or hw.gpus_per_node
    res = plan_search(model, hw, stack, inp.nodes * gpn, gpn, inp.seq_len, inp.sequences(), inp.margin,
                      inp.objective, space=space_of(inp))
    if len(res.ranked) == 0:
        from meshplan.planner.views import add_nodes_hint

        hint = add_nodes_hint(res)
        raise MeshplanError(explain_empty(res) + (f"; {hint} (n: the Nodes tab)" if hint else ""))
    return Result(inp, res, decision_tree(res))


def space_of(inp: Inputs):
    """The search space of the form's training fields (the mode, LoRA's rank, CPU offload pinned or not)."""
    from meshplan.planner.space import SearchSpace

    return SearchSpace(**inp.space_fields())


def names() -> tuple[list[str], list[str]]:
    """(model presets, hardware profiles)."""
    from meshplan.estimator.hardware import hardware_names
    from meshplan.estimator.model_spec import preset_names

    return preset_names(), hardware_names()


# ---- the ranked table ----------------------------------------------------------------------------------


def matching(result: Result, query: str):
    """The fitting configurations (sweep indices, in rank order) whose configuration text (the table's compact label
    and the detail's words, case-insensitive) contains every word of `query`; all of them for an empty query."""
    import numpy as np

    ranked = result.res.ranked
    words = query.lower().split()
    if not words:
        return ranked
    return ranked[np.fromiter((all(w in searchable(result, int(i)) for w in words) for i in ranked), dtype=bool,
                              count=len(ranked))]


def sorted_indices(result: Result, key: str, reverse: bool = False, limit: int = TABLE_ROWS,
                   ranked=None) -> list[int]:
    """Sweep indices of the fitting configurations (or of `ranked`, a subset from `matching`) in table order
    (`limit` first)."""
    import numpy as np

    res = result.res
    ranked = res.ranked if ranked is None else ranked
    if key == "rank":
        order = ranked
    elif key == "config":
        labels = np.array([compact(result, int(i)) for i in ranked])
        order = ranked[np.argsort(labels, kind="stable")]
    else:
        # at a fixed world size and price, days and dollars to train follow 1 / throughput
        values = {"peak": res.peak_gib, "tps": res.tps, "mfu": res.mfu, "step": res.step_s,
                  "days": 1.0 / res.tps, "cost": 1.0 / res.tps}[key][ranked]
        order = ranked[np.argsort(values if SORTS[key][1] else -values, kind="stable")]
    if reverse:
        order = order[::-1]
    return [int(i) for i in order[:limit]]


DEFAULT_PREFIX = "default: "


def config_header(defaults: list[str], room: int, query: str = "") -> tuple[str, list[str]]:
    """The configuration column's header in at most `room` cells, and the default words it has no room for.

    `defaults` are the words most plans shown share (planner.labels.differences), in their order: the layout before
    the flags. A word the filter `query` names leaves first (every plan shown contains it, and the filter box on
    screen says so); then, while the header is too wide, the last words leave and `…` says some did (the detail
    lists them). Every word shown is whole; with no default, or no room for one, the header is `configuration`."""
    named = {w.lower() for w in query.split()}
    words = [w for w in defaults if w.lower() not in named]
    for keep in range(len(words), 0, -1):
        head = DEFAULT_PREFIX + " ".join(words[:keep]) + (" …" if keep < len(words) else "")
        if len(head) <= room:
            return head, words[keep:]
    return SORTS["config"][0], words


def searchable(result: Result, i: int) -> str:
    """What the plans filter matches: the compact label and the words of the detail (lower case), cached."""
    text = result.search_text.get(i)
    if text is None:
        from meshplan.planner.labels import short_config

        text = result.search_text[i] = (compact(result, i) + " | " + short_config(result.res.config(i))).lower()
    return text


def compact(result: Result, i: int) -> str:
    label = result.compact.get(i)
    if label is None:
        label = result.compact[i] = compact_config(result.res.config(i))
    return label


def train(result: Result, i: int) -> dict | None:
    """Days, GPU-hours and cost for the token budget (None without a budget)."""
    from meshplan.planner.capacity import train_time

    if not result.inputs.tokens:
        return None
    return train_time(result.inputs.tokens, float(result.res.tps[i]), result.world, result.price)


def row(result: Result, i: int) -> dict:
    """One row of the ranked table as numbers (see `row_cells` in the app for the text)."""
    res = result.res
    rank = int(_rank_pos(result)[i]) + 1
    t = train(result, i)
    return {
        "index": i, "rank": rank, "peak_gib": float(res.peak_gib[i]), "tps": float(res.tps[i]),
        "mfu": float(res.mfu[i]), "step_s": float(res.step_s[i]), "days": t["days"] if t else None,
        "cost_usd": t["cost_usd"] if t else None, "config": compact(result, i),
    }


def _rank_pos(result: Result):
    pos = result.estimates.get("_rank_pos")
    if pos is None:
        import numpy as np

        res = result.res
        pos = np.full(res.evaluated, -1, dtype=np.int64)
        pos[res.ranked] = np.arange(len(res.ranked))
        result.estimates["_rank_pos"] = pos
    return pos


def estimate_of(result: Result, i: int) -> dict:
    """The estimator's full report for configuration `i` (memory per stage, warnings), cached."""
    est = result.estimates.get(i)
    if est is None:
        from meshplan.estimator.report import estimate

        res = result.res
        est = result.estimates[i] = estimate(res.model, res.hw, res.train_config(i), res.stack, res.memory_margin)
    return est


# ---- compare, hardware ---------------------------------------------------------------------------------


def compare_rows(result: Result, indices: list[int]) -> list[tuple[str, list[str], int | None]]:
    """Rows of the side-by-side comparison: (label, one cell per configuration, best): `best` is the index
    of the best value, -1 for a setting that differs between the configurations, None otherwise."""
    res = result.res
    cfgs = [res.config(i) for i in indices]
    ests = [estimate_of(result, i) for i in indices]
    trains = [train(result, i) for i in indices]

    def best(values, low):
        if len(values) < 2 or len(set(values)) == 1:
            return None
        return values.index(min(values) if low else max(values))

    rows: list[tuple[str, list[str], int | None]] = [
        ("rank", [str(int(_rank_pos(result)[i]) + 1) for i in indices], None),
        ("configuration", [compact(result, i) for i in indices], None),
    ]
    peaks = [e["memory"]["peak_gib"] for e in ests]
    tps = [e["throughput"]["tokens_per_sec_per_gpu"] for e in ests]
    rows.append(("peak GiB", [f"{p:.1f}" for p in peaks], best(peaks, True)))
    rows.append(("headroom GiB", [f"{res.limit_gib - p:.1f}" for p in peaks], best(peaks, True)))
    rows.append(("tok/s/GPU", [f"{t:,.0f}" for t in tps], best(tps, False)))
    mfu = [e["throughput"]["mfu"] for e in ests]
    rows.append(("MFU", [f"{m:.1%}" for m in mfu], best(mfu, False)))
    steps = [e["throughput"]["step_time_s"] for e in ests]
    rows.append(("step s", [f"{s:.2f}" for s in steps], best(steps, True)))
    if trains[0] is not None:
        days = [t["days"] for t in trains]
        rows.append(("time-to-train", [fmt_days(d) for d in days], best(days, True)))
        if trains[0]["cost_usd"] is not None:
            cost = [t["cost_usd"] for t in trains]
            rows.append(("cost", [fmt_money(c) for c in cost], best(cost, True)))
    for key, label in (("dp_replicate", "dp_replicate"), ("dp_shard", "dp_shard"), ("tp", "tp"), ("pp", "pp"),
                       ("pp_schedule", "PP schedule"), ("cp", "cp"), ("ep", "ep"), ("micro_batch_size", "micro-batch"),
                       ("ac", "AC"), ("float8", "Float8"), ("compile", "compile"), ("async_tp", "async TP")):
        if (key == "pp_schedule" and all(c["pp"] == 1 for c in cfgs)) or (key == "ep" and all(c["ep"] == 1 for c in cfgs)):
            continue
        values = [str(c[key]) for c in cfgs]
        rows.append((label, values, -1 if len(set(values)) > 1 else None))
    return rows


def hardware_ids(current: str) -> list[str]:
    from meshplan.planner.views import COMPARE_HARDWARE

    return list(dict.fromkeys([*COMPARE_HARDWARE, current]))


def hardware_rows(inp: Inputs, hardware: list[str]) -> list[dict]:
    """The best configuration of the same model at the same number of GPUs on each profile
    (meshplan.planner.views.compare_hardware, the comparison the web app shows too)."""
    from meshplan.planner.views import compare_hardware

    model, hw0, stack = load_inputs(inp)
    world = inp.nodes * (inp.gpus_per_node or hw0.gpus_per_node)
    profiles = [hw0 if hid in (hw0.id, inp.hardware) else hid for hid in hardware]
    return compare_hardware(model, stack, profiles, world, inp.gpus_per_node, inp.seq_len, inp.sequences(),
                            inp.margin, inp.objective, inp.tokens, current=hw0.id, space=space_of(inp))


# ---- exports and the launch preview --------------------------------------------------------------------


def build_plan(result: Result, i: int):
    """The plan file (planner.plan_file.Plan) for configuration `i`."""
    from meshplan.planner.plan_file import make_plan

    res = result.res
    tokens = result.inputs.tokens
    return make_plan(res.model, result.inputs.model, res.hw, res.train_config(i), estimate_of(result, i),
                     stack=result.inputs.stack, tokens=int(tokens) if tokens else None)


def export_files(result: Result, i: int, directory: str | Path, partition: str | None = None,
                 time: str | None = None, skipped: dict[str, str] | None = None) -> list[Path]:
    """Write the plan YAML, the torchtitan config and the launch scripts into `directory` (created).

    Every file is rendered before anything is written (or the folder created), so a bad value (a Slurm
    partition with shell characters, say) writes nothing; each file is then written atomically. A torchtitan
    format that cannot carry the plan (LoRA on 0.2.2, say), and the core's launch scripts of a plan the core does not
    run (DeepEP), are left out, their one-line reasons put in `skipped`."""
    from meshplan.planner.export import SCRIPT_FORMATS, render
    from meshplan.planner.plan_file import core_refusal, plan_yaml, write_atomic

    text = str(directory).strip()
    if not text:
        raise MeshplanError("give a directory to export to")
    folder = Path(text).expanduser()
    if folder.exists() and not folder.is_dir():
        raise MeshplanError(f"{folder} exists and is not a directory")
    plan = build_plan(result, i)
    plan_path = folder / f"{plan.name}.yaml"
    files = [(plan_path, plan_yaml(plan), 0o644)]
    for fmt, suffix in EXPORTS.items():
        try:
            out = render(plan, fmt, str(plan_path.resolve()), partition=partition or None, time=time or None)
        except MeshplanError as exc:
            if not fmt.startswith("torchtitan") and core_refusal(plan) is None:
                raise
            if skipped is not None:
                skipped[fmt] = str(exc)
            continue
        name = suffix if fmt == "torchtitan-py" else f"{plan.name}{suffix}"
        files.append((folder / name, out, 0o755 if fmt in SCRIPT_FORMATS else 0o644))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MeshplanError(f"cannot create {folder}: {exc.strerror or exc}") from None
    return [write_atomic(path, body, mode=mode) for path, body, mode in files]


def launch_command(plan_file: str, backend: str) -> str:
    """The command that launches an exported plan file (what `y` copies), its path quoted for the shell."""
    import shlex

    return f"meshplan launch {shlex.quote(plan_file)} --backend {backend}"


def launch_preview(result: Result, i: int, backend: str, plan_file: str | None = None) -> tuple[str, str]:
    """(command, output) of `meshplan launch PLAN --backend BACKEND --dry-run` for configuration `i`.

    The plan is written to a temporary file only to be read back; nothing else is written. Without the
    launcher installed, the output is the rendered script of `meshplan export -f BACKEND`.
    """
    import tempfile

    from meshplan.planner.export import render
    from meshplan.planner.plan_file import save_plan

    plan = build_plan(result, i)
    shown = plan_file or f"{plan.name}.yaml"
    note = "" if plan_file else "   # this plan is not exported yet: e writes it"
    try:
        from meshplan.launcher.launch import build_launch
    except ImportError:
        cmd = f"meshplan export {shown} -f {backend}  (launcher not installed: the script it would run){note}"
        return cmd, render(plan, backend, shown)
    with tempfile.TemporaryDirectory(prefix="meshplan-tui-") as tmp:
        path = save_plan(plan, Path(tmp) / f"{plan.name}.yaml")
        launch = build_launch(path, backend, None, write=False)
    r = launch.resolved
    cmd = f"meshplan launch {shown} --backend {backend} --dry-run{note}"
    head = (f"# resolved run: world {r['world']} on {r['nodes']} node(s); device {r['device']} ({r['process_group']}); "
            f"run dir {r['run_dir']}\n{launch.describe()}")
    return cmd, f"{head}\n# {launch.script} would contain:\n{launch.text}"



def gpus_per_node(hardware: list[str]) -> dict[str, int]:
    """GPUs per node of each built-in hardware profile (the form's placeholder)."""
    from meshplan.estimator.hardware import load_hardware

    return {h: load_hardware(h).gpus_per_node for h in hardware}


def capacity_rows(inp: Inputs, result: Result | None) -> list[dict]:
    """The form's job on its accelerator at every node count the UIs scan (planner.views.node_scan, as the web
    app's Capacity view); the current cluster's row is `result`'s own sweep when it has one (None: nothing fit)."""
    from meshplan.planner.views import SCAN_NODES, node_scan

    model, hw, stack = load_inputs(inp)
    gpn = inp.gpus_per_node or hw.gpus_per_node
    hw = hw.model_copy(update={"gpus_per_node": gpn})
    nodes = tuple(sorted({*SCAN_NODES, inp.nodes}))
    return node_scan(model, stack, [hw], nodes, inp.seq_len, inp.sequences(), inp.margin, inp.objective,
                     inp.tokens, space=space_of(inp), current=(hw.id, inp.nodes),
                     known=result.res if result is not None and result.inputs == inp else None)


def parse_limit(text: str, what: str) -> float | None:
    """A deadline (days) or budget (US$) as typed: empty or 0 -> None; `2M`, `3e6`, `$1,500k` are read as numbers.
    Raises ValueError with a one-line message."""
    from meshplan.ui.tui.form import parse_number

    t = text.strip().lstrip("$").strip()
    if not t or t in ("0", "-", "none"):
        return None
    try:
        v = parse_number(t)
    except ValueError:
        raise ValueError(f"{what}: {text.strip()!r} is not a number (empty: none)") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{what}: must be a positive number (empty: none)")
    return v
