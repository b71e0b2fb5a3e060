"""Decision tree view of the web app. The decision tree: which parallelism each step adds and why."""

from __future__ import annotations

import streamlit as st

from meshplan.ui.web import cache, figures
from meshplan.ui.web.views.context import Context


def render(ctx: Context) -> None:
    steps = cache.tree(ctx.key)
    st.caption("torchtitan's order: FSDP first, then compile, Float8, EP for a mixture-of-experts model's "
               "experts, TP inside a node, PP across nodes, CP for long sequences, HSDP, and activation "
               "checkpointing last. Each step shows the best plan "
               "allowed so far; hover a node for details, the grey crosses are the closest rejected plans.")
    st.plotly_chart(figures.decision_tree_figure(steps), key="tree_chart", config={"displaylogo": False})
    with st.expander("The steps in words", expanded=steps[0]["key"] == "finetune"):
        st.markdown("\n".join(f"- **{s['label']}**: {s['reason']}" for s in steps))
