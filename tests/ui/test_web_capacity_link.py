"""The web app's capacity question (deadline, budget, node scan, charts) and its links (query parameters in and
out), under Streamlit's AppTest."""

from __future__ import annotations

from pathlib import Path

import pytest
from needs import require_module

from meshplan.planner.views import memory_by_seq, node_scan, scan_answers

APP = Path(__file__).resolve().parents[2] / "ui" / "streamlit_app.py"

require_module("streamlit")


def link_app(**query):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def test_a_link_reproduces_the_view_and_the_url_follows_the_inputs():
    at = link_app(model="llama3-8b", nodes="2")
    assert not at.exception and not at.error
    assert at.title[0].value.startswith("llama3-8b on 2 × 8 h100-sxm")
    assert at.sidebar.selectbox(key="model").value == "llama3-8b"
    assert dict(at.query_params) == {"model": "llama3-8b", "nodes": "2"}
    at.sidebar.number_input(key="nodes").set_value(3)
    at.sidebar.number_input(key="deadline_days").set_value(30.0)
    at.sidebar.number_input(key="budget_usd").set_value(3e6)
    at.run()
    assert dict(at.query_params) == {"model": "llama3-8b", "nodes": "3", "deadline_days": "30",
                                     "budget_usd": "3000000"}
    assert at.title[0].value.startswith("llama3-8b on 3 × 8")


@pytest.mark.parametrize("query, needle", [
    ({"nodes": "0"}, "nodes must be between 1 and 4096"),
    ({"nodes": "two"}, "nodes must be a number"),
    ({"model": "llama9"}, "not a known model preset"),
    ({"colour": "red"}, "'colour' is not an input of this page"),
    ({"dtype": "fp16"}, "training dtype"),
    ({"reshard": "sometimes"}, "FSDP reshard after forward"),
    ({"ep_backend": "nccl"}, "EP dispatch"),
])
def test_a_bad_link_value_is_a_message_and_the_default_stays(query, needle):
    at = link_app(**query)
    assert not at.exception and not at.error
    assert any(needle in w.value for w in at.sidebar.warning), [w.value for w in at.sidebar.warning]
    assert at.title[0].value.startswith("llama3-70b on 8 × 8")  # the defaults ran


def test_a_link_sets_the_training_dtype_and_reshard_policy():
    at = link_app(model="llama3-8b", nodes="1", dtype="bfloat16", reshard="always")
    assert not at.exception and not at.error
    assert at.sidebar.radio(key="dtype").value == "bfloat16" and at.sidebar.selectbox(key="reshard").value == "always"
    df = next(d for d in at.dataframe if "configuration" in getattr(d.value, "columns", [])).value
    assert df.configuration.str.contains("dtype bf16").all() and df.configuration.str.contains("reshard always").all()


def test_capacity_view_answers_deadline_budget_and_add_nodes(web_app):
    at = web_app(model="llama3-70b", nodes=2, view="Capacity", deadline_days=60.0, budget_usd=3e6)
    assert not at.exception
    text = "\n".join(m.value for m in at.markdown)
    assert "**Add nodes**: llama3-70b does not fit on 2 nodes; it fits from **3 x h100-sxm**" in text
    assert "Cheapest within 60 days: **" in text and "Fastest within $3,000,000: **" in text
    table = next(d.value for d in at.dataframe if "meets deadline" in d.value.columns)
    assert set(table["nodes"]) >= {1, 2, 3, 6, 12, 24, 64}
    fits = table[table["best configuration"] != "does not fit"]
    assert fits["nodes"].min() == 3 and (fits["days"].diff().dropna() < 0).all()  # more nodes, fewer days


def test_capacity_row_of_your_cluster_equals_the_plan_views(web_app):
    at = web_app(model="llama3-8b", nodes=2, view="Capacity", cap_nodes=[1, 2, 4])
    assert not at.exception and not at.error
    table = next(d.value for d in at.dataframe if "best configuration" in d.value.columns)
    assert "meets deadline" not in table.columns  # no deadline asked: no column
    mine = table[table["nodes"] == 2].iloc[0]
    assert f"{mine['tok/s/GPU']:,.0f}" == at.metric[1].value.replace(",", ",")
    assert len(at.get("plotly_chart")) == 2  # the scan and the chosen plan's memory against sequence length


def test_node_scan_answers_by_hand():
    from meshplan.estimator import load_hardware, load_model, load_stack

    hw = load_hardware("h100-sxm")
    rows = node_scan(load_model("llama3-70b"), load_stack("torchtitan"), [hw], (2, 3, 6), 8192, 512, 0.9,
                     "throughput", 2e12, current=("h100-sxm", 2))
    assert [r["fits"] for r in rows] == [False, True, True] and rows[0]["current"]
    ans = scan_answers(rows, deadline_days=None, budget_usd=None, current_nodes=2, current_hw="h100-sxm")
    assert ans["add_nodes"]["nodes"] == 3 and ans["smallest_fitting"]["h100-sxm"]["nodes"] == 3
    assert ans["fastest"]["nodes"] == 6  # twice the GPUs at about the same tokens/s/GPU: half the days
    # days = tokens / (tok/s/GPU x GPUs) / 86400, by hand from the row's own throughput
    r = rows[2]
    assert r["days"] == pytest.approx(2e12 / (r["tokens_per_sec_per_gpu"] * 48) / 86400, rel=1e-3)


def test_memory_grows_with_sequence_length():
    from meshplan.estimator import load_hardware, load_model, load_stack

    cfg = {"gpus": 16, "gpus_per_node": 8, "dp_replicate": 1, "dp_shard": 16, "cp": 1, "tp": 1, "pp": 1, "ep": 1,
           "pp_schedule": "1F1B", "vpp": 1, "seq_len": 8192, "global_batch_size": 64, "micro_batch_size": 1,
           "ac": "full", "float8": "none", "compile": True, "async_tp": False}
    pts = memory_by_seq(load_model("llama3-8b"), load_hardware("h100-sxm"), load_stack("torchtitan"), cfg,
                        (2048, 8192, 32768), 0.9)
    peaks = [p["peak_gib"] for p in pts]
    assert peaks[0] < peaks[1] < peaks[2] and pts[1]["current"]
    assert [p["global_batch_size"] for p in pts] == [256, 64, 16]  # 524,288 tokens each
