"""Compare view of the web app. Two or three ranked plans side by side."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from meshplan.ui.web import cache, figures
from meshplan.ui.web.compute import time_to_train
from meshplan.ui.web.views.context import Context


def render(ctx: Context) -> None:
    if ctx.table is None:
        st.info("Nothing fits: nothing to compare.")
    else:
        ranks = list(range(1, ctx.top + 1))
        st.session_state["compare"] = [r for r in st.session_state.get("compare", []) if r in ranks][:3]
        sel = st.multiselect("Plans to compare (2 or 3 ranks)", ranks, key="compare", max_selections=3,
                             format_func=lambda r: f"#{r} {ctx.table['configuration'].iloc[r - 1]}",
                             help="ranks from the Plans table, side by side: memory by category and step time")
        if len(sel) < 2:
            st.info("Pick two or three plans.")
        else:
            ests = {r: cache.config_estimate(ctx.key, json.dumps(ctx.res.config(int(ctx.table["index"].iloc[r - 1])),
                                                             sort_keys=True)) for r in sel}
            rows = {}
            for r, e in ests.items():
                c = e["config"]
                t = time_to_train(ctx.tokens, e["throughput"]["tokens_per_sec_per_gpu"], ctx.job.world, ctx.price)
                rows[f"#{r}"] = {
                    "dp_replicate x dp_shard": f"{c['dp_replicate']} x {c['dp_shard']}", "tp": str(c["tp"]),
                    "pp": str(c["pp"]), "cp": str(c["cp"]), "ep": str(c.get("ep", 1)), "schedule": c["pp_schedule"] if c["pp"] > 1 else "no PP",
                    "stages per rank": str(c["vpp"]), "micro-batch": str(c["micro_batch_size"]), "AC": c["ac"],
                    "Float8": c["float8"], "compile": "on" if c["compile"] else "off",
                    "async TP": "on" if c["async_tp"] else "off",
                    "peak GiB": f"{e['memory']['peak_gib']:.1f}",
                    "worst rank": e["memory"]["worst_rank"],
                    "tok/s/GPU": f"{e['throughput']['tokens_per_sec_per_gpu']:,.0f}",
                    "MFU": f"{e['throughput']['mfu'] * 100:.1f} %",
                    "step s": f"{e['throughput']['step_time_s']:.2f}",
                    "days": f"{t['days']:.1f}" if t else "no budget",
                    "cost $": f"{t['cost_usd']:,.0f}" if t and t["cost_usd"] is not None else "no price",
                }
            side = pd.DataFrame(rows)
            differs = side.nunique(axis=1) > 1
            st.caption("Rows where the plans differ are highlighted.")
            st.table(side.style.apply(
                lambda r: ["background-color: rgba(255, 215, 0, 0.25)" if differs[r.name] else ""] * len(r),
                axis=1))
            a, b = st.columns(2)
            a.plotly_chart(figures.memory_bars([(f"#{r}", e["memory"]["breakdown_gib"]) for r, e in ests.items()],
                                               ctx.hw.usable_hbm_gib, ctx.res.limit_gib, "Memory per GPU (worst rank)"),
                           key="compare_memory", config={"displaylogo": False})
            b.plotly_chart(figures.time_bars([(f"#{r}", e["throughput"]["breakdown_s"]) for r, e in ests.items()],
                                             "Step time"), key="compare_time", config={"displaylogo": False})
