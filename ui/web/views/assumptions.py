"""Assumptions view of the web app. What the estimate assumes about the hardware and the framework."""

from __future__ import annotations

import streamlit as st

from meshplan.ui.web.compute import load_stack
from meshplan.ui.web.text import assumptions
from meshplan.ui.web.views.context import Context


def render(ctx: Context) -> None:
    st.markdown(assumptions(ctx.hw, load_stack(ctx.job.stack), ctx.job.memory_margin))
