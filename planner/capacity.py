"""Capacity planning: time, GPU-hours and cost to train a token budget, across hardware and cluster sizes.

Units: tokens, days, GPU-hours, US dollars (the profile's list price per GPU-hour unless overridden).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from meshplan.estimator.errors import InputError, MeshplanError
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.limits import check_tokens
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.report import GIB_DECIMALS
from meshplan.estimator.stack import StackProfile
from meshplan.planner.search import plan_search, short_config
from meshplan.planner.space import SearchSpace

DEFAULT_NODES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # common cluster sizes, not only powers of two
# Capacity compares many clusters, so it searches the knobs that decide memory and speed and fixes
# the ones that only ever help on the stacks modelled here (compile on, async TP on wherever TP > 1).
CAPACITY_SPACE = dict(compile=[True], async_tp=[True], micro_batch_size=[1, 2, 4], vpp=[2])


def capacity_space(stack: StackProfile) -> SearchSpace:
    """The narrowed search each (hardware, nodes) cell runs: compile and async TP on where the stack's framework runs
    them (CAPACITY_SPACE), off where it does not (nanotron has neither)."""
    fields = dict(CAPACITY_SPACE)
    if not stack.runs.compile:
        fields["compile"] = [False]
    if not stack.runs.async_tp:
        fields["async_tp"] = [False]
    return SearchSpace(**fields)


def train_time(tokens: float, tps_per_gpu: float, gpus: int, usd_per_gpu_hour: float | None) -> dict:
    """Days, GPU-hours and cost to train `tokens` at `tps_per_gpu` on `gpus` GPUs."""
    if tokens <= 0:
        raise InputError(f"tokens must be positive, got {tokens}", field="tokens")
    check_tokens(tokens)  # finite and not absurd: never "inf days, $inf"
    seconds = tokens / (tps_per_gpu * gpus)
    gpu_hours = seconds * gpus / 3600
    return {
        "days": seconds / 86400,
        "gpu_hours": gpu_hours,
        "cost_usd": gpu_hours * usd_per_gpu_hour if usd_per_gpu_hour is not None else None,
    }


@dataclass
class Option:
    hardware: str
    nodes: int
    gpus: int
    fits: bool
    config: dict | None
    summary: str
    peak_gib: float | None
    tokens_per_sec_per_gpu: float | None
    mfu: float | None
    days: float | None
    gpu_hours: float | None
    cost_usd: float | None
    usd_per_gpu_hour: float | None
    why_not: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def capacity_options(
    model: ModelSpec,
    hardware: list[HardwareProfile],
    stack: StackProfile,
    tokens: float,
    seq_len: int,
    global_batch_tokens: int,
    node_counts: tuple[int, ...] = DEFAULT_NODES,
    memory_margin: float = 0.9,
    price_override: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Option]:
    """The best configuration (by throughput) for each hardware profile and node count."""
    if global_batch_tokens % seq_len:
        raise MeshplanError(f"global batch of {global_batch_tokens} tokens is not a whole number of {seq_len}-token sequences")
    gbs = global_batch_tokens // seq_len
    options = []
    total = len(hardware) * len(node_counts)
    done = 0
    for hw in hardware:
        price = price_override if price_override is not None else (hw.price.usd_per_gpu_hour if hw.price else None)
        for nodes in node_counts:
            world = nodes * hw.gpus_per_node
            res = plan_search(model, hw, stack, world, hw.gpus_per_node, seq_len, gbs, memory_margin,
                              space=capacity_space(stack))
            done += 1
            if progress:
                progress(done, total)
            if len(res.ranked) == 0:
                from meshplan.planner.search import explain_empty

                options.append(Option(hw.id, nodes, world, False, None, "", None, None, None, None, None, None,
                                      price, why_not=explain_empty(res)))
                continue
            i = int(res.ranked[0])
            t = train_time(tokens, float(res.tps[i]), world, price)
            cfg = res.config(i)
            options.append(Option(
                hw.id, nodes, world, True, cfg, short_config(cfg), round(float(res.peak_gib[i]), GIB_DECIMALS),
                round(float(res.tps[i]), 1), round(float(res.mfu[i]), 4), t["days"], t["gpu_hours"],
                t["cost_usd"], price,
            ))
    return options


def answers(options: list, deadline_days: float | None, budget_usd: float | None) -> dict:
    """The three questions: cheapest meeting the deadline, fastest within budget, smallest that fits. `options` are
    Options or dicts with the same fields (the UIs' `planner.views.node_scan` rows); answers are dicts."""
    rows = [o.as_dict() if isinstance(o, Option) else o for o in options]
    fit = [o for o in rows if o["fits"]]
    out: dict = {"smallest_fitting": {}, "cheapest_within_deadline": None, "fastest_within_budget": None}
    for hw in sorted({o["hardware"] for o in rows}):
        mine = [o for o in fit if o["hardware"] == hw]
        out["smallest_fitting"][hw] = min(mine, key=lambda o: o["gpus"]) if mine else None
    priced = [o for o in fit if o["cost_usd"] is not None]
    if deadline_days is not None:
        ok = [o for o in priced if o["days"] <= deadline_days]
        out["cheapest_within_deadline"] = min(ok, key=lambda o: (o["cost_usd"], o["days"])) if ok else None
    else:
        out["cheapest"] = min(priced, key=lambda o: (o["cost_usd"], o["days"])) if priced else None
    if budget_usd is not None:
        ok = [o for o in priced if o["cost_usd"] <= budget_usd]
        out["fastest_within_budget"] = min(ok, key=lambda o: (o["days"], o["cost_usd"])) if ok else None
    else:
        timed = [o for o in fit if o["days"] is not None]
        out["fastest"] = min(timed, key=lambda o: (o["days"], o["cost_usd"] or 0)) if timed else None
    return out
