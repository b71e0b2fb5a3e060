"""Sweep view of the web app. Every estimated configuration, throughput against memory, and why the others were rejected."""

from __future__ import annotations

import streamlit as st

from meshplan.ui.web import cache, figures
from meshplan.ui.web.views.context import Context


def render(ctx: Context) -> None:
    pts = cache.points(ctx.key)
    st.plotly_chart(
        figures.sweep_scatter(pts, ctx.res.limit_gib, ctx.hw.usable_hbm_gib, ctx.chosen,
                              "Throughput vs memory of every estimated configuration"),
        key="sweep_chart", config={"displaylogo": False},
    )
    thinned = int(pts["count"].sum() - len(pts))
    st.caption(
        f"{len(pts):,} points for {int(pts['count'].sum()):,} estimated configurations"
        + (f" (configurations closer than a pixel share a point; hover says how many: {thinned:,} merged)"
           if thinned else "")
        + ". Grey: does not fit in memory (reason on hover). Configurations that break a rule have no "
        "estimate and are counted below."
    )
    st.dataframe(cache.reasons(ctx.key), hide_index=True, key="reasons_table")
