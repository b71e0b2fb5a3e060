"""Figure builders of the web app: the data in each figure, read back from its traces."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.planner.search import plan_search
from meshplan.planner.tree import decision_tree
from meshplan.ui.web import figures
from meshplan.ui.web.compute import (
    Job,
    compare_job,
    hardware_row,
    ranked_frame,
    run_sweep,
    summaries,
    sweep_points,
)


@pytest.fixture(scope="module")
def res70():
    """llama3-70b on 8 x 8 H100: the page's default sweep (~80k configurations)."""
    return plan_search(load_model("llama3-70b"), load_hardware("h100-sxm"), load_stack("torchtitan"), 64, 8, 8192, 512,
                       0.9)


@pytest.fixture(scope="module")
def res8():
    """llama3-8b on one node: small enough to draw every point."""
    return plan_search(load_model("llama3-8b"), load_hardware("h100-sxm"), load_stack("torchtitan"), 8, 8, 8192, 64,
                       0.8)


def test_memory_bars_sum_to_each_stage_peak():
    hw = load_hardware("h100-sxm")
    cfg = TrainConfig(gpus=64, gpus_per_node=8, tp=8, pp=4, global_batch_size=512, compile=True)
    est = estimate(load_model("llama3-70b"), hw, cfg, memory_margin=0.9)
    mem = est["memory"]
    bars = [("peak rank", mem["breakdown_gib"])] + [(f"stage {s['stage']}", s["breakdown_gib"]) for s in mem["per_stage"]]
    fig = figures.memory_bars(bars, hw.usable_hbm_gib, 0.9 * hw.usable_hbm_gib)
    peaks = [mem["peak_gib"]] + [s["peak_gib"] for s in mem["per_stage"]]
    assert len(peaks) == 5
    assert figures.bar_totals(fig) == pytest.approx(peaks, abs=0.01)
    assert max(peaks) == pytest.approx(mem["peak_gib"])
    # one stacked trace per memory category some bar holds (a category at 0 GiB everywhere is left out of the
    # legend), plus the usable and margin lines
    cats = {t.meta for t in fig.data if t.type == "bar"}
    held = {c for b in bars for c, v in b[1].items() if v}
    assert cats == held and held < set(mem["breakdown_gib"])
    lines = sorted(s.y0 for s in fig.layout.shapes)
    assert lines == pytest.approx(sorted([hw.usable_hbm_gib, 0.9 * hw.usable_hbm_gib]))
    assert fig.layout.barmode == "stack"
    # each bar's peak label sits inside the bar's top, clear of the usable and margin lines near it
    [label] = [t for t in fig.data if t.meta == "peak"]
    assert label.textposition == "bottom center" and list(label.text) == [f"{p:.1f}" for p in peaks]


def test_time_bars_sum_to_step_time():
    hw = load_hardware("h100-sxm")
    est = estimate(load_model("llama3-8b"), hw, TrainConfig(gpus=8, global_batch_size=64), memory_margin=0.9)
    fig = figures.time_bars([("#1", est["throughput"]["breakdown_s"])])
    assert figures.bar_totals(fig) == pytest.approx([est["throughput"]["step_time_s"]], rel=1e-3)


def test_greyed_points_are_exactly_the_infeasible_ones(res8):
    pts = sweep_points(res8, max_points=None)
    fig = figures.sweep_scatter(pts, res8.limit_gib, res8.hw.usable_hbm_gib, int(res8.ranked[0]))
    grey = set(figures.scatter_indices(fig, "does not fit (memory)").tolist())
    fits = set(figures.scatter_indices(fig, "fits").tolist())
    assert grey == set(np.flatnonzero(res8.reason == 9).tolist())
    assert fits == set(np.flatnonzero(res8.reason == 0).tolist())
    assert grey and fits
    # the grey trace is grey, and every grey point's hover names its reason
    trace = next(t for t in fig.data if t.name == "does not fit (memory)")
    assert "140,140,140" in trace.marker.color
    assert all("does not fit: peak" in t for t in trace.text)
    assert figures.scatter_indices(fig, "chosen").tolist() == [int(res8.ranked[0])]


def test_pareto_points_are_non_dominated(res8):
    pts = sweep_points(res8, max_points=None)
    fig = figures.sweep_scatter(pts, res8.limit_gib, res8.hw.usable_hbm_gib)
    front = figures.scatter_indices(fig, "Pareto front")
    assert set(front.tolist()) == set(res8.pareto.tolist())
    fit = np.flatnonzero(res8.reason == 0)
    for i in front:
        dominated = (res8.peak_gib[fit] <= res8.peak_gib[i]) & (res8.tps[fit] > res8.tps[i])
        assert not dominated.any(), f"Pareto point {i} is dominated"
    # and every fitting point not on the front is dominated by (or equal to) a front point
    on_front = np.zeros(res8.evaluated, dtype=bool)
    on_front[front] = True
    for i in fit[~on_front[fit]]:
        assert ((res8.peak_gib[front] <= res8.peak_gib[i]) & (res8.tps[front] >= res8.tps[i])).any()


def test_thinned_scatter_keeps_classes_pareto_and_counts(res70):
    pts = sweep_points(res70, max_points=6000)
    assert len(pts) < 0.5 * np.count_nonzero(~np.isnan(res70.peak_gib))
    fig = figures.sweep_scatter(pts, res70.limit_gib, res70.hw.usable_hbm_gib)
    grey = figures.scatter_indices(fig, "does not fit (memory)")
    fits = figures.scatter_indices(fig, "fits")
    assert (res70.reason[grey] == 9).all() and (res70.reason[fits] == 0).all()
    assert set(res70.pareto.tolist()) <= set(fits.tolist())
    assert set(figures.scatter_indices(fig, "Pareto front").tolist()) == set(res70.pareto.tolist())
    # each point stands for `count` configurations: together they are every estimated configuration
    assert pts[pts.fits]["count"].sum() == np.count_nonzero(res70.reason == 0)
    assert pts[~pts.fits]["count"].sum() == np.count_nonzero(res70.reason == 9)
    assert (pts["count"] >= 1).all()


def test_decision_tree_figure_has_one_node_per_step(res70):
    steps = decision_tree(res70)
    fig = figures.decision_tree_figure(steps)
    nodes = next(t for t in fig.data if t.name == "step")
    assert list(nodes.customdata) == [s["key"] for s in steps]
    for s, text in zip(steps, nodes.text, strict=True):
        if s["best"]:
            assert f"{s['best']['peak_gib']:.1f} GiB" in text
    # the taken steps are green, and the closest rejected alternatives are drawn with their reasons
    colors = list(nodes.marker.color)
    assert colors[0] == "#2ca02c"
    alts = next(t for t in fig.data if t.name == "closest rejected (memory)")
    assert len(alts.x) == sum(min(len(s["rejected"]), 3) for s in steps)
    assert all("does not fit" in t for t in alts.text)


def test_hardware_figure_and_rows(res70):
    job = Job.make(res70.model, "llama3-70b", res70.hw, 8, 8, 8192, 512, 0.9)
    rows = []
    for hw_id in ("h100-sxm", "h200-sxm", "b200"):
        other = compare_job(job, hw_id)
        rows.append(hardware_row(other, run_sweep(other), 2e12))
    fig = figures.hardware_figure(rows)
    tps = next(t for t in fig.data if t.meta == "tokens_per_sec_per_gpu")
    assert list(tps.x) == ["h100-sxm", "h200-sxm", "b200"]
    assert list(tps.y) == [r["tokens_per_sec_per_gpu"] for r in rows]
    days = next(t for t in fig.data if t.meta == "days")
    for r, d in zip(rows, days.y, strict=True):
        assert d == pytest.approx(2e12 / (r["tokens_per_sec_per_gpu"] * 64) / 86400, rel=1e-3)
    assert rows[0]["tokens_per_sec_per_gpu"] == pytest.approx(float(res70.tps[res70.ranked[0]]), abs=0.1)
    assert rows[2]["tokens_per_sec_per_gpu"] > rows[0]["tokens_per_sec_per_gpu"]


def test_hardware_row_when_nothing_fits():
    res = plan_search(load_model("llama3-405b"), load_hardware("l40s"), load_stack("torchtitan"), 8, 8, 8192, 64, 0.9)
    job = Job.make(res.model, "llama3-405b", res.hw, 1, 8, 8192, 64, 0.9)
    row = hardware_row(job, res, 1e12)
    assert not row["fits"] and "no configuration" in row["why_not"]
    fig = figures.hardware_figure([row])
    assert "does not fit" in fig.data[0].text[0]


def test_ranked_frame_and_vectorised_summaries_match_the_planner(res70):
    from meshplan.planner.search import short_config

    df = ranked_frame(res70, 40, 2e12, 3.99)
    assert list(df["index"]) == list(res70.ranked[:40])
    assert list(df["configuration"]) == [short_config(res70.config(int(i))) for i in res70.ranked[:40]]
    assert (np.diff(df["rank"]) == 1).all()
    i = int(res70.ranked[0])
    assert df["cost_usd"].iloc[0] == pytest.approx(2e12 / (res70.tps[i] * 64) / 3600 * 64 * 3.99, rel=1e-4)
    pts = sweep_points(res70, max_points=None)
    sample = pts.sample(200, random_state=0)
    assert list(sample["label"]) == [short_config(res70.config(int(i))) for i in sample["index"]]
    assert summaries(df.iloc[:0]).empty


def test_assumptions_state_each_stacks_fsdp_cost():
    """The page's assumptions name the per-block FSDP cost of the stack it estimates with (torchtitan's fitted figure
    is its largest single overhead), not one stack's figure for all."""
    from meshplan.ui.web.text import assumptions

    hw = load_hardware("h100-sxm")
    for sid in ("torchtitan", "llm-foundry"):
        stack = load_stack(sid)
        text = assumptions(hw, stack, 0.9)
        assert f"FSDP adds {stack.fsdp_overhead_s_per_layer * 1e3:.1f} ms a block per microbatch" in text
        assert f"at most {stack.fsdp_overhead_calibrated_share:.0%} of a step" in text
    assert load_stack("torchtitan").fsdp_overhead_s_per_layer != load_stack("llm-foundry").fsdp_overhead_s_per_layer
    generic = assumptions(hw, load_stack("generic"), 0.9)  # FSDP2's measured hooks: not called fitted
    assert "FSDP adds 1.0 ms a block per microbatch" in generic and "measured" in generic and "fitted to" not in generic


def test_assumptions_name_the_attention_kernel_the_stack_runs():
    """torchtitan's current release runs FlexAttention (0.87 of FlashAttention-2's 0.33 on an H100); its SDPA
    releases cuDNN's fused attention on Hopper (the profile's 0.41); its 2024 release and llm-foundry
    FlashAttention-2 (0.33); a part without a cuDNN figure states its FlashAttention-2 one."""
    from meshplan.ui.web.text import assumptions

    h100, b200 = load_hardware("h100-sxm"), load_hardware("b200")
    assert "attention\n(FlexAttention) 0.29 of bf16 peak" in assumptions(h100, load_stack("torchtitan"), 0.9)
    assert "attention\n(cuDNN's fused attention) 0.41 of bf16 peak" in assumptions(
        h100, load_stack("torchtitan-2026-05"), 0.9)
    for old in ("torchtitan-2024", "llm-foundry"):
        assert "attention\n(FlashAttention-2) 0.33 of bf16 peak" in assumptions(h100, load_stack(old), 0.9)
    assert "(FlashAttention-2) 0.32 of bf16 peak" in assumptions(b200, load_stack("torchtitan-2026-05"), 0.9)
    assert "a step adds 2 ms beyond its kernels' work" in assumptions(h100, load_stack("torchtitan"), 0.9)
