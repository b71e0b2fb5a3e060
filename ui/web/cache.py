"""Streamlit caches around `ui.web.compute`, keyed on `Job.key()` (a short JSON string) and plain values.

A rerun after a widget that does not change the sweep (chosen plan, table rows, view) reads everything
from here; a rerun with a new input pays one sweep (~0.1 s for llama3-70b on 8 nodes).
"""

from __future__ import annotations

import json

import streamlit as st

from meshplan.estimator.hardware import hardware_names, load_hardware
from meshplan.estimator.model_spec import load_model, preset_names
from meshplan.planner.search import SearchResult
from meshplan.planner.tree import decision_tree
from meshplan.ui.web import compute
from meshplan.ui.web.compute import Job

ENTRIES = 24


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def sweep(key: str) -> SearchResult:
    return compute.run_sweep(Job.from_key(key))


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def tree(key: str) -> list[dict]:
    return decision_tree(sweep(key))


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def points(key: str) -> object:
    return compute.sweep_points(sweep(key))


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def ranked(key: str, top: int, tokens: float | None, price: float | None) -> object:
    return compute.ranked_frame(sweep(key), top, tokens, price)


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def reasons(key: str) -> object:
    return compute.reason_table(sweep(key))


@st.cache_data(max_entries=64, show_spinner=False)
def config_estimate(key: str, cfg_json: str) -> dict:
    return compute.config_estimate(Job.from_key(key), json.loads(cfg_json))


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def exports(key: str, cfg_json: str, tokens: float | None, plan_path: str | None,
            init_from: str | None = None) -> dict:
    job = Job.from_key(key)
    cfg = json.loads(cfg_json)
    return compute.exports(job, cfg, config_estimate(key, cfg_json), tokens, plan_path, init_from)


@st.cache_data(max_entries=4, show_spinner=False)
def sweep_csv(key: str) -> str:
    return compute.sweep_csv(sweep(key))


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def hardware_rows(key: str, hw_ids: tuple[str, ...], tokens: float | None) -> list[dict]:
    job = Job.from_key(key)
    rows = []
    for hw_id in hw_ids:
        other = compute.compare_job(job, hw_id)
        rows.append(compute.hardware_row(other, sweep(other.key()), tokens))
    return rows


@st.cache_data(show_spinner=False)
def presets() -> list[str]:
    return preset_names()


@st.cache_data(show_spinner=False)
def hardware_ids() -> list[str]:
    return hardware_names()


@st.cache_data(show_spinner=False)
def preset(name: str) -> object:
    return load_model(name)


@st.cache_data(show_spinner=False)
def hardware(name: str) -> object:
    return load_hardware(name)


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def node_scan(key: str, hw_ids: tuple[str, ...], node_counts: tuple[int, ...], tokens: float | None) -> list[dict]:
    """The job on every accelerator in `hw_ids` at every node count (planner.views.node_scan); the sidebar's own
    cluster reuses its sweep, so its row equals the plan views' numbers."""
    from meshplan.planner.views import node_scan as shared_scan
    from meshplan.ui.web.inputs import search_space

    job = Job.from_key(key)
    current = job.hw()
    # the sidebar's accelerator with its own node size (and custom values); the others as profiled
    mine = current.model_copy(update={"gpus_per_node": job.gpus_per_node})
    profiles = [mine if h in (current.id, current.id.removesuffix("-custom")) else hardware(h) for h in hw_ids]
    return shared_scan(job.model_spec(), compute.load_stack(job.stack), profiles, node_counts, job.seq_len, job.global_batch,
                       job.memory_margin, job.objective, tokens, space=search_space(job.pin_dict()),
                       current=(current.id, job.nodes), known=sweep(key))


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def memory_by_seq(key: str, cfg_json: str, seq_lens: tuple[int, ...]) -> list[dict]:
    """The chosen plan's peak memory at other sequence lengths (planner.views.memory_by_seq)."""
    from meshplan.planner.views import memory_by_seq as shared

    job = Job.from_key(key)
    return shared(job.model_spec(), job.hw(), compute.load_stack(job.stack), json.loads(cfg_json), seq_lens,
                  job.memory_margin)


@st.cache_data(max_entries=ENTRIES, show_spinner=False)
def add_nodes_hint(key: str) -> str:
    """Where the sweep of `key`, in which nothing fits, starts to fit (planner.views.add_nodes_hint)."""
    from meshplan.planner.views import add_nodes_hint as shared

    return shared(sweep(key))


@st.cache_resource(show_spinner=False)
def page_icon():
    """The tab's icon, drawn here (a 3 x 3 mesh of nodes): served by the app itself, so the page fetches nothing
    from outside (a `:material/...:` page icon is loaded from fonts.gstatic.com)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    points = [(12 + 20 * i, 12 + 20 * j) for i in range(3) for j in range(3)]
    for x, y in points:
        for u, v in points:
            if (u - x, v - y) in ((20, 0), (0, 20)):
                draw.line((x, y, u, v), fill=(76, 120, 168, 255), width=4)
    for x, y in points:
        draw.ellipse((x - 7, y - 7, x + 7, y + 7), fill=(245, 133, 24, 255))
    return img
