"""Capacity view of the web app: the same job over node counts and accelerators, with the sidebar's deadline and
budget; the cheapest and fastest cluster that meet them, how many nodes it takes to fit, and the charts."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from meshplan.planner.views import COMPARE_HARDWARE, SCAN_NODES, scan_answers
from meshplan.ui.web import cache, figures
from meshplan.ui.web.views.context import Context


def _cluster(r: dict) -> str:
    cost = f", ${r['cost_usd']:,.0f}" if r.get("cost_usd") is not None else ""
    days = f", {r['days']:,.1f} days" if r.get("days") is not None else ""
    return (f"**{r['nodes']} x {r['hardware']}** ({r['gpus']} GPUs){days}{cost}, "
            f"{r['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU with {r['configuration']}")


def render(ctx: Context) -> None:
    deadline = float(st.session_state.get("deadline_days") or 0) or None
    budget = float(st.session_state.get("budget_usd") or 0) or None
    hw_id = ctx.hw.id
    options = list(dict.fromkeys([hw_id, *COMPARE_HARDWARE, *cache.hardware_ids()]))
    st.session_state.setdefault("cap_hw", [hw_id])
    st.session_state["cap_hw"] = [h for h in st.session_state["cap_hw"] if h in options] or [hw_id]
    c1, c2 = st.columns([2, 3])
    picked = c1.multiselect("Accelerators to scan", options, key="cap_hw", max_selections=4,
                            help="each accelerator at each node count is one search (cached)")
    node_options = sorted({*SCAN_NODES, ctx.job.nodes})
    st.session_state.setdefault("cap_nodes", node_options)
    st.session_state["cap_nodes"] = [n for n in st.session_state["cap_nodes"] if n in node_options] or node_options
    nodes = c2.multiselect("Node counts", node_options, key="cap_nodes",
                           help="clusters of this many nodes of each accelerator's own size; yours is marked")
    if not picked or not nodes:
        st.info("Pick at least one accelerator and one node count.")
        return
    st.caption(
        "Deadline and budget are set in the sidebar (Capacity). " + ("" if ctx.tokens else
        "Set a token budget there to see days and cost; without it the scan shows throughput only. ")
        + "Your own cluster's row is the plan views' sweep; the others search with torch.compile on.")
    with st.spinner(f"searching {len(picked) * len(nodes)} clusters ..."):
        rows = cache.node_scan(ctx.key, tuple(picked), tuple(sorted(nodes)), ctx.tokens)
    ans = scan_answers(rows, deadline, budget, ctx.job.nodes, hw_id)
    lines = []
    if ans["add_nodes"] is not None:
        r = ans["add_nodes"]
        lines.append(f":material/add_circle: **Add nodes**: {ctx.model.name} does not fit on {ctx.job.nodes} nodes; "
                     f"it fits from {_cluster(r)}.")
    if ctx.tokens:
        if deadline:
            r = ans["cheapest_within_deadline"]
            lines.append(f"Cheapest within {deadline:g} days: " + (_cluster(r) if r else
                         "no cluster scanned meets the deadline (add node counts or accelerators)."))
        elif ans.get("cheapest"):
            lines.append("Cheapest: " + _cluster(ans["cheapest"]))
        if budget:
            r = ans["fastest_within_budget"]
            lines.append(f"Fastest within ${budget:,.0f}: " + (_cluster(r) if r else
                         "no cluster scanned stays within the budget."))
        elif ans.get("fastest"):
            lines.append("Fastest: " + _cluster(ans["fastest"]))
    for hw, r in ans["smallest_fitting"].items():
        lines.append(f"Smallest cluster that fits on {hw}: " + (f"{r['nodes']} node(s)" if r else
                     "none of the node counts scanned."))
    for line in lines:
        st.markdown(line)
    st.plotly_chart(figures.capacity_figure(rows, deadline if ctx.tokens else None, budget if ctx.tokens else None,
                                            f"{ctx.model.name}: the best plan at each cluster size"),
                    key="capacity_chart", config={"displaylogo": False})
    st.dataframe(
        pd.DataFrame([{
            "hardware": r["hardware"], "nodes": r["nodes"], "GPUs": r["gpus"],
            "best configuration": r["configuration"] or "does not fit", "peak GiB": r["peak_gib"],
            "tok/s/GPU": r["tokens_per_sec_per_gpu"], "days": r["days"],
            "cost $": round(r["cost_usd"]) if r["cost_usd"] is not None else None,
            **({"meets deadline": r["days"] is not None and r["days"] <= deadline} if deadline and ctx.tokens else {}),
            **({"within budget": r["cost_usd"] is not None and r["cost_usd"] <= budget} if budget and ctx.tokens
               else {}),
        } for r in rows]),
        hide_index=True, key="capacity_table",
        column_config={
            "peak GiB": st.column_config.NumberColumn(format="%.1f"),
            "tok/s/GPU": st.column_config.NumberColumn(format="%.0f"),
            "days": st.column_config.NumberColumn(format="%.1f"),
            "cost $": st.column_config.NumberColumn(format="localized"),
            "best configuration": st.column_config.TextColumn(width="large"),
        },
    )
    if ctx.chosen is not None:
        st.markdown("**Memory against sequence length** (the chosen plan, the global batch held in tokens)")
        seqs = tuple(sorted({1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, ctx.job.seq_len}))
        pts = cache.memory_by_seq(ctx.key, ctx.cfg_json, seqs)
        st.plotly_chart(figures.seq_memory_figure(pts, ctx.hw.usable_hbm_gib), key="seq_memory_chart",
                        config={"displaylogo": False})
