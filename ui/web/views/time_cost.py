"""Time & cost view of the web app. Days and dollars of the token budget, and the same job on other accelerators."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from meshplan.ui.web import cache, figures
from meshplan.ui.web.compute import COMPARE_HARDWARE
from meshplan.ui.web.views.context import Context


def render(ctx: Context) -> None:
    if not ctx.tokens:
        st.info("Set a token budget in the sidebar to see days and cost.")
    options = list(dict.fromkeys([*COMPARE_HARDWARE, ctx.base_hw.id, *cache.hardware_ids()]))
    st.session_state.setdefault("cmp_hw", list(dict.fromkeys([*COMPARE_HARDWARE, ctx.base_hw.id])))
    picked = st.multiselect("Compare hardware (same model, GPU count, batch and margin)", options,
                            key="cmp_hw", max_selections=6,
                            help="up to 6 other accelerators at the same number of GPUs: the best plan on each, "
                                 "its days and dollars")
    if picked:
        rows = cache.hardware_rows(ctx.key, tuple(picked), ctx.tokens)
        st.plotly_chart(figures.hardware_figure(rows, f"{ctx.model.name} on {ctx.job.world} GPUs"),
                        key="hw_chart", config={"displaylogo": False})
        st.dataframe(
            pd.DataFrame([{
                "hardware": r["hardware"], "nodes": r["nodes"], "GPUs": r["gpus"],
                "best configuration": r["configuration"] or "does not fit", "peak GiB": r["peak_gib"],
                "tok/s/GPU": r["tokens_per_sec_per_gpu"], "MFU %": r["mfu"] * 100 if r["mfu"] else None,
                "days": r["days"], "GPU-hours": round(r["gpu_hours"]) if r["gpu_hours"] else None,
                "cost $": round(r["cost_usd"]) if r["cost_usd"] else None,
                "$/GPU-h": r["usd_per_gpu_hour"]} for r in rows]),
            hide_index=True, key="hw_table",
            column_config={
                "peak GiB": st.column_config.NumberColumn(format="%.1f"),
                "tok/s/GPU": st.column_config.NumberColumn(format="%.0f"),
                "MFU %": st.column_config.NumberColumn(format="%.1f"),
                "days": st.column_config.NumberColumn(format="%.1f"),
                "GPU-hours": st.column_config.NumberColumn(format="localized"),
                "cost $": st.column_config.NumberColumn(format="localized"),
                "$/GPU-h": st.column_config.NumberColumn(format="%.2f"),
                "best configuration": st.column_config.TextColumn(width="large"),
            },
        )
        for r in rows:
            if not r["fits"]:
                st.caption(f"{r['hardware']}: {r['why_not']}")
        if ctx.hw is not ctx.base_hw:
            st.caption(f"{ctx.base_hw.id} in this comparison uses your custom values.")
