"""Plans & memory view of the web app. Ranked plans, the chosen plan's memory per GPU (and per pipeline stage) and where its step time goes."""

from __future__ import annotations

import streamlit as st

from meshplan.ui.web import figures
from meshplan.ui.web.views.context import Context


def render(ctx: Context) -> None:
    if ctx.table is None:
        st.info("Nothing fits, so there is no ranked plan: see the Sweep and Decision tree views for why.")
    else:
        head = st.columns([3, 1])
        head[0].markdown(f"**Ranked plans** (best first; top {ctx.top:,} of {len(ctx.res.ranked):,} that fit). "
                         "Click a column header to sort.")
        head[1].number_input("rows shown", min_value=5, max_value=1000, step=25, key="rows",
                             help="how many ranked plans the table and the chosen-plan list hold (5..1000)")
        show = ctx.table.drop(columns=["index"])
        # the chosen plan is marked in a column of its own (a pandas Styler highlight cost ~80 ms of every rerun)
        show.insert(0, "chosen", ["▶" if r == st.session_state["chosen"] else "" for r in show["rank"]])
        first = ["chosen", "rank", "configuration", "peak_gib", "headroom_gib", "tokens_per_sec_per_gpu", "mfu_pct",
                 "step_time_s", "days", "cost_usd"]
        st.dataframe(
            show, hide_index=True, height=min(38 + 35 * len(show), 390),
            key="ranked_table",
            column_order=[c for c in first if c in show] + [c for c in show if c not in first],
            column_config={
                "chosen": st.column_config.TextColumn("", width=28, help="the chosen plan (pick it above the "
                                                                          "metrics)"),
                "rank": st.column_config.NumberColumn("#", width="small"),
                "configuration": st.column_config.TextColumn("configuration", width="large"),
                "peak_gib": st.column_config.NumberColumn("peak GiB", format="%.1f"),
                "headroom_gib": st.column_config.NumberColumn("headroom GiB", format="%.1f"),
                "tokens_per_sec_per_gpu": st.column_config.NumberColumn("tok/s/GPU", format="%.0f"),
                "mfu_pct": st.column_config.NumberColumn("MFU %", format="%.1f"),
                "step_time_s": st.column_config.NumberColumn("step s", format="%.2f"),
                "days": st.column_config.NumberColumn("days", format="%.1f"),
                "cost_usd": st.column_config.NumberColumn("cost $", format="%.0f"),
                "micro_batch_size": st.column_config.NumberColumn("mbs"),
                "pp_schedule": st.column_config.TextColumn("schedule"),
            },
        )
        left, right = st.columns([1, 1])
        bars = [(f"#{st.session_state['chosen']} peak rank", ctx.mem["breakdown_gib"])]
        bars += [(f"stage {s['stage']}", s["breakdown_gib"]) for s in ctx.mem["per_stage"]]
        left.plotly_chart(
            figures.memory_bars(bars, ctx.hw.usable_hbm_gib, ctx.res.limit_gib,
                                "Memory per GPU of the chosen plan" + (" and each pipeline stage"
                                                                  if ctx.mem["per_stage"] else "")),
            key="memory_chart", config={"displaylogo": False},
        )
        right.plotly_chart(
            figures.time_bars([(f"#{st.session_state['chosen']}", ctx.thr["breakdown_s"])],
                              f"Where a {ctx.thr['step_time_s']:.2f} s step goes"),
            key="time_chart", config={"displaylogo": False},
        )
        right.caption(
            f"Host RAM per node: {ctx.mem['host_ram_gib_per_node']:,.0f} GiB of {ctx.hw.host_ram_gib_per_node:,.0f}. "
            f"Worst rank: {ctx.mem['worst_rank']}, peak at the {ctx.mem['peak_phase']}. "
            f"Allocated {ctx.mem['allocated_gib']:.1f} GiB + fragmentation "
            f"= {ctx.mem['peak_gib']:.1f} GiB reserved."
        )
