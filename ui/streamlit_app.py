"""meshplan in the browser: plan distributed LLM training, see memory, throughput and the decision tree.

Run with `meshplan web [--port N]` (or `streamlit run ui/streamlit_app.py`). Inputs live in the sidebar;
the sweep is cached per input, so a rerun after a widget change costs well under a second.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import streamlit as st

try:
    import meshplan.ui.web  # noqa: F401
except ImportError:  # started from a checkout that was not pip-installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.estimator.config import (  # noqa: E402
    AC_MODES,
    EP_COMM_BACKENDS,
    FLOAT8_RECIPES,
    LORA_TARGETS,
    PP_SCHEDULES,
    RESHARD_POLICIES,
    TRAINING_DTYPES,
)
from meshplan.estimator.errors import MeshplanError  # noqa: E402
from meshplan.estimator.limits import MAX_TOKENS  # noqa: E402
from meshplan.planner.search import OBJECTIVES, explain_empty  # noqa: E402
from meshplan.planner.tree import batch_note  # noqa: E402
from meshplan.ui.web import cache, compute  # noqa: E402
from meshplan.ui.web.compute import Job, price_of, time_to_train  # noqa: E402
from meshplan.ui.web.inputs import (  # noqa: E402
    FINETUNE_MODES,
    HW_OVERRIDES,
    custom_hardware,
    finetune_pins,
    global_batch_sequences,
    parse_model_upload,
    pin_choices,
    training_pins,
)
from meshplan.ui.web.text import hardware_facts, model_facts  # noqa: E402
from meshplan.ui.web.url import Url  # noqa: E402
from meshplan.ui.web.views import assumptions as views_assumptions  # noqa: E402
from meshplan.ui.web.views import capacity as views_capacity  # noqa: E402
from meshplan.ui.web.views import compare as views_compare  # noqa: E402
from meshplan.ui.web.views import export as views_export  # noqa: E402
from meshplan.ui.web.views import plans as views_plans  # noqa: E402
from meshplan.ui.web.views import sweep as views_sweep  # noqa: E402
from meshplan.ui.web.views import time_cost as views_time_cost  # noqa: E402
from meshplan.ui.web.views import tree as views_tree  # noqa: E402
from meshplan.ui.web.views.context import Context  # noqa: E402

# the stack profile every estimate uses: `meshplan web --stack` (a built-in id or a YAML path) sets it
STACK = os.environ.get("MESHPLAN_STACK") or "torchtitan"
DEFAULTS = {
    "model_src": "preset", "model": "llama3-70b", "hardware": "h100-sxm", "nodes": 8, "seq_len": 8192,
    "batch_unit": "tokens", "batch_tokens": 4 * 1024 * 1024, "batch_seqs": 512, "tokens_b": 2000.0,
    "margin": 0.9, "objective": "throughput", "rows": 50, "hw_custom": False,
    "ft_mode": "none", "lora_rank": 16, "lora_alpha": 32.0, "lora_targets": list(LORA_TARGETS), "offload": "auto",
    "dtype": "float32", "reshard": "default", "ep_backend": "standard", "doc_tokens": 0, "deadline_days": 0.0, "budget_usd": 0.0,
}
VIEW_MODULES = {"Plans & memory": views_plans, "Sweep": views_sweep, "Decision tree": views_tree,
                "Time & cost": views_time_cost, "Capacity": views_capacity, "Compare": views_compare, "Export": views_export,
                "Assumptions": views_assumptions}
VIEWS = list(VIEW_MODULES)
# widgets inside views that are not drawn on every run (they keep their values across view switches)
VIEW_WIDGETS = ("rows", "compare", "cmp_hw", "plan_path", "preview", "init_from")
PIN_CHOICES = {
    "tp": [1, 2, 4, 8, 16, 32, 64], "pp": [1, 2, 4, 8, 16, 32, 64], "cp": [1, 2, 4, 8, 16, 32],
    "ep": [1, 2, 4, 8, 16, 32, 64, 128, 256],
    "dp_replicate": [1, 2, 4, 8, 16, 32, 64], "pp_schedule": list(PP_SCHEDULES), "vpp": [2, 4, 8],
    "micro_batch_size": [1, 2, 4, 8, 16], "ac": list(AC_MODES), "float8": list(FLOAT8_RECIPES),
    "compile": [True, False], "async_tp": [True, False],
}
try:  # offer only what the stack's framework runs (its profile's `runs`: nanotron has no compile, Float8, ...)
    PIN_CHOICES = pin_choices(PIN_CHOICES, compute.load_stack(STACK))
except MeshplanError:
    pass  # a profile that cannot be read: the page says so where it estimates
PIN_LABELS = {
    "tp": "TP degree", "pp": "PP degree", "cp": "CP degree", "ep": "EP degree (MoE models)",
    "dp_replicate": "HSDP replicas (dp_replicate)",
    "pp_schedule": "PP schedule", "vpp": "stages per rank (Interleaved1F1B, InterleavedZeroBubble)", "micro_batch_size": "micro-batch",
    "ac": "activation checkpointing", "float8": "Float8 recipe", "compile": "torch.compile",
    "async_tp": "async TP",
}

st.set_page_config(page_title="meshplan", page_icon=cache.page_icon(), layout="wide")
st.markdown(
    """<style>
    .block-container {padding-top: 1.6rem; padding-bottom: 1rem; max-width: 1800px;}
    h1 {font-size: 2.0rem !important; padding-top: 0.2rem !important;}
    [data-testid="stMetricValue"] {font-size: 1.45rem;}
    /* the plan's figures: on a narrow window the row wraps (each figure >= 7rem) instead of cutting its numbers
       to "68.…" and "$1,…"; labels and chips wrap instead of ending in an ellipsis */
    .st-key-plan_metrics [data-testid="stHorizontalBlock"] {flex-wrap: wrap; row-gap: 0.6rem;}
    .st-key-plan_metrics [data-testid="stColumn"] {flex: 1 1 7rem; min-width: 7rem;}
    .st-key-plan_metrics .stMarkdownEllipsis, .st-key-plan_metrics .stMarkdownEllipsis p,
    .st-key-export_files .stMarkdownEllipsis, .st-key-export_files .stMarkdownEllipsis p {
        white-space: normal; overflow: visible; text-overflow: clip;}  /* the export buttons' names wrap too */
    [data-testid="stSidebar"] [data-testid="stCaptionContainer"] p {margin-bottom: 0.1rem;}
    </style>""",
    unsafe_allow_html=True,
)
for k, v in DEFAULTS.items():
    st.session_state.setdefault(k, v)
URL = Url(cache.presets, cache.hardware_ids, OBJECTIVES, FINETUNE_MODES)
if "_url_problems" not in st.session_state:  # a link's values fill the sidebar once, on the first run
    url_values, st.session_state["_url_problems"] = URL.read(st.query_params.to_dict())
    for k, v in url_values.items():
        st.session_state[k] = float(v) if isinstance(DEFAULTS.get(k), float) else v


def _hardware_changed() -> None:
    hw = cache.hardware(st.session_state["hardware"])
    st.session_state["gpn"] = hw.gpus_per_node
    for field in HW_OVERRIDES:
        st.session_state.pop(f"hw_{field}", None)


def fail(message: str) -> None:
    st.error(message, icon=":material/error:")
    st.stop()


# ---- sidebar: inputs ----------------------------------------------------------------------------------
sb = st.sidebar
sb.title("meshplan")
sb.caption("Plan distributed LLM training before spending a GPU-hour.")

sb.subheader("Model")
sb.radio("Model from", ["preset", "upload"], key="model_src", horizontal=True,
         format_func=lambda s: {"preset": "preset", "upload": "config.json / YAML"}[s],
         help="a built-in model, or your own: a Hugging Face config.json (dense or mixture-of-experts) or a meshplan "
              "model YAML")
model = model_source = None
input_error = None
waiting_for_upload = False
if st.session_state["model_src"] == "preset":
    sb.selectbox("Preset", cache.presets(), key="model",
                 help="built-in architectures (data/models/): layers, widths, heads, vocabulary; the facts below")
    model_source = st.session_state["model"]
    try:
        model = cache.preset(model_source)
    except MeshplanError as exc:
        input_error = ("model", str(exc))
else:
    up = sb.file_uploader("Hugging Face config.json or meshplan model YAML", type=["json", "yaml", "yml"],
                          key="upload", max_upload_size=1,
                          help="at most 1 MB; read on this machine, never sent anywhere; a link cannot carry it")
    if up is None:
        waiting_for_upload = True
    else:
        try:
            model = parse_model_upload(up.name, up.getvalue())
            model_source = up.name
        except MeshplanError as exc:
            input_error = ("model", str(exc))
if model is not None:
    sb.caption(model_facts(model))
slots = {"model": sb.empty()}  # where a section's bad input is explained, under its fields

sb.subheader("Hardware")
sb.selectbox("Profile", cache.hardware_ids(), key="hardware", on_change=_hardware_changed,
             help="accelerator and node (data/hardware_profiles/): peak FLOP/s, HBM, links, host RAM, price; the "
                  "sources are under Hardware facts")
base_hw = cache.hardware(st.session_state["hardware"])
st.session_state.setdefault("gpn", base_hw.gpus_per_node)
sb.toggle("Custom values", key="hw_custom", help="override some numbers of the profile")
hw = base_hw
if st.session_state["hw_custom"]:
    overrides = {}
    for field, label in HW_OVERRIDES.items():
        default = (base_hw.price.usd_per_gpu_hour if base_hw.price else 0.0) if field == "usd_per_gpu_hour" \
            else float(getattr(base_hw, field))
        st.session_state.setdefault(f"hw_{field}", float(default))
        # a 0 is kept (and rejected with a message), not silently replaced by the stock value
        overrides[field] = sb.number_input(label, min_value=0.0, key=f"hw_{field}", format="%.2f",
                                           help=f"{label}: replaces the profile's value for this page only; "
                                                "0 is refused with a message")
    try:
        hw = custom_hardware(base_hw, overrides)
    except MeshplanError as exc:
        input_error = input_error or ("hardware", str(exc))
with sb.expander("Hardware facts", expanded=False):
    for line in hardware_facts(hw):
        st.caption(line)
slots["hardware"] = sb.empty()

sb.subheader("Cluster and batch")
c1, c2 = sb.columns(2)
c1.number_input("Nodes", min_value=1, max_value=4096, step=1, key="nodes",
                help="nodes in the cluster, 1..4096; any count (3, 6, 12, 24): degrees come from its divisors")
c2.number_input("GPUs per node", min_value=1, max_value=72, step=1, key="gpn",
                help="GPUs used on each node (the profile's by default; fewer for a partial node)")
sb.number_input("Sequence length (tokens)", min_value=128, max_value=1 << 20, step=1024, key="seq_len",
                help="tokens per training sequence, 128..1,048,576; long sequences bring context parallelism in")
sb.radio("Global batch in", ["tokens", "sequences"], key="batch_unit", horizontal=True,
         help="count the global batch in tokens per optimizer step (4,194,304 = 4Mi) or in sequences")
if st.session_state["batch_unit"] == "tokens":
    sb.number_input("Global batch (tokens per step)", min_value=1, step=1 << 20, key="batch_tokens",
                    help="tokens per optimizer step, a whole number of sequences; a target: each layout trains the "
                         "nearest batch its data-parallel size divides, within 10 %")
else:
    sb.number_input("Global batch (sequences per step)", min_value=1, step=64, key="batch_seqs",
                    help="sequences per optimizer step; a target: each layout trains the nearest batch its "
                         "data-parallel size divides, within 10 %")
sb.number_input("Token budget (billion tokens, 0: none)", min_value=0.0, step=100.0, key="tokens_b",
                help="tokens to train, in billions (2 trillion = 2000): sets the days and dollars; 0 leaves them out")
sb.slider("Memory margin (share of usable HBM a plan may use)", 0.5, 1.0, step=0.01, key="margin",
          help="a plan fits when its peak reserved memory stays under this share of the usable HBM (0.9: 10 % "
               "headroom for what the estimate misses)")
sb.selectbox("Objective", list(OBJECTIVES), key="objective",
             help="what ranks the plans that fit: throughput (tokens/s/GPU), time or cost to train the token budget; "
                  "on one cluster the three agree, across node counts and hardware (Capacity) they differ")
slots["cluster"] = sb.empty()

sb.subheader("Capacity")
c1, c2 = sb.columns(2)
c1.number_input("Deadline (days, 0: none)", min_value=0.0, step=5.0, key="deadline_days", format="%g",
                help="finish the token budget within this many days: the Capacity view finds the cheapest cluster")
c2.number_input("Budget (US$, 0: none)", min_value=0.0, step=100_000.0, key="budget_usd", format="%g",
                help="spend at most this much: the Capacity view finds the fastest cluster within it")

sb.subheader("Training")
sb.selectbox("Mode", list(FINETUNE_MODES), key="ft_mode", format_func=FINETUNE_MODES.get,
             help="pre-training from a random start, or fine-tuning a pretrained checkpoint: every weight (full), "
                  "low-rank adapters on frozen bf16 weights (LoRA) or on NF4-quantized ones (QLoRA)")
if st.session_state["ft_mode"] in ("lora", "qlora"):
    c1, c2 = sb.columns(2)
    c1.number_input("LoRA rank", min_value=1, max_value=4096, step=8, key="lora_rank",
                    help="r, the adapters' inner width (1..4096): memory and FLOPs of the adapters grow with it")
    c2.number_input("LoRA alpha", min_value=0.0, step=8.0, key="lora_alpha", format="%g",
                    help="the update's scale alpha / r: written into the exported plan; no effect on memory or speed")
    sb.multiselect("Adapted linears", list(LORA_TARGETS), key="lora_targets",
                   help="attention q, k, v, o and MLP w1 (gate), w3 (up), w2 (down); torchtune adapts all seven")
sb.radio("FSDP CPU offload", ["auto", "off", "on"], key="offload", horizontal=True,
         help="params, grads and AdamW state on the host, the optimizer step on the CPU (FSDP2 CPUOffloadPolicy). "
              "auto: the planner tries it for fine-tuning where FSDP shards alone, and takes it only where it pays")

c1, c2 = sb.columns(2)
c1.radio("Training dtype", list(TRAINING_DTYPES), key="dtype",
         help="torchtitan's training.dtype: float32 keeps fp32 weights, gradients and AdamW state under bf16 compute "
              "(16 bytes a parameter); bfloat16 keeps all three in bf16 (8 bytes), no fp32 master copy")
c2.selectbox("FSDP reshard after forward", list(RESHARD_POLICIES), key="reshard",
             help="torchtitan's parallelism.fsdp_reshard_after_forward: default frees each block's gathered weights "
                  "after its forward (not on pipeline stages); always frees them on stages too; never keeps them to "
                  "the backward (one all-gather a microbatch, more memory)")
sb.radio("EP dispatch (MoE)", list(EP_COMM_BACKENDS), key="ep_backend", horizontal=True,
         help="torchtitan's parallelism.expert_parallel_comm_backend, for layouts with expert parallelism: standard "
              "(PyTorch all-to-all, a row per routed expert), deepep (DeepEP: a token once per destination rank "
              "and node) or hybridep (HybridEP, the same route; torchtitan 0.3, made for NVL72); NVIDIA only; "
              "plans run under torchtitan, not meshplan's own core")
sb.number_input("Mean document tokens (0: one a sequence)", min_value=0, max_value=1 << 30, step=512, key="doc_tokens",
                help="mean tokens of a training document packed into the sequences: torchtitan 0.3's FlexAttention "
                     "masks attention within documents, so shorter documents cost less attention (0: one document a "
                     "sequence, the most attention can cost; SDPA's causal mask always costs it)")

pins: dict = {}
try:
    pins |= finetune_pins(st.session_state["ft_mode"], st.session_state["lora_rank"],
                          st.session_state["lora_alpha"], st.session_state["lora_targets"], st.session_state["offload"])
    pins |= training_pins(st.session_state["dtype"], st.session_state["reshard"], st.session_state["ep_backend"],
                          int(st.session_state["doc_tokens"]))
except MeshplanError as exc:
    input_error = input_error or ("training", str(exc))
slots["training"] = sb.empty()
with sb.expander("Advanced: pin parts of the search"):
    st.caption("Leave a field empty to search every valid value.")
    for key, choices in PIN_CHOICES.items():
        fmt = (lambda v: "on" if v else "off") if key in ("compile", "async_tp") else str
        chosen = st.multiselect(PIN_LABELS[key], choices, key=f"pin_{key}", format_func=fmt,
                                help=f"search only these values of {PIN_LABELS[key]}; empty: every valid one")
        if chosen:
            pins[key] = sorted(chosen, key=choices.index)
    if st.checkbox("Allow TP across nodes", key="pin_allow_tp_across_nodes",
                   help="off: TP stays where NVLink reaches (a node, or a GB200 NVL72 rack's 72 GPUs), where its "
                        "all-reduces ride NVLink; on: also search TP degrees larger than that"):
        pins["allow_tp_across_nodes"] = True

# the URL follows the inputs (a link reproduces this view); an uploaded model cannot travel in a link
url_state = {k: st.session_state.get(k) for k in URL.params}
if st.session_state["model_src"] != "preset":
    url_state.pop("model")
url_query = URL.write(url_state, {**DEFAULTS, "gpn": base_hw.gpus_per_node})
if st.query_params.to_dict() != url_query:
    st.query_params.from_dict(url_query)
for problem in st.session_state.get("_url_problems", []):
    sb.warning(problem, icon=":material/link_off:")

# ---- the sweep ---------------------------------------------------------------------------------------
if waiting_for_upload:
    st.title("meshplan")
    st.info("Upload a Hugging Face config.json or a meshplan model YAML in the sidebar, or pick a preset.",
            icon=":material/upload_file:")
    st.stop()


class Problem(Exception):
    """A bad input: its message (one line) and the sidebar section it belongs to."""

    def __init__(self, section: str, message: str):
        super().__init__(message)
        self.section = section


def job_of_inputs() -> tuple[Job, float | None]:
    """(the sweep's inputs, the token budget) from the sidebar; Problem on a bad input."""
    if input_error:
        raise Problem(*input_error)
    seq = int(st.session_state["seq_len"])
    budget = float(st.session_state["tokens_b"]) * 1e9 or None
    if budget is not None and budget > MAX_TOKENS:  # someone typed 2e12 into a field counted in billions
        raise Problem("cluster", f"Token budget {budget:.3g} is too large (at most {MAX_TOKENS:.0e}): the field "
                                 "counts billions of tokens, so 2 trillion is 2000.")
    unit = st.session_state["batch_unit"]
    batch = global_batch_sequences(int(st.session_state["batch_tokens" if unit == "tokens" else "batch_seqs"]),
                                   unit, seq)
    return Job.make(model, model_source, hw, int(st.session_state["nodes"]), int(st.session_state["gpn"]), seq,
                    batch, float(st.session_state["margin"]), st.session_state["objective"], pins, STACK), budget


stale = None  # the message of a bad input while the page shows the last inputs that worked
try:
    try:
        job, tokens = job_of_inputs()
        with st.spinner("evaluating every configuration ..."):
            res = cache.sweep(job.key())
    except MeshplanError as exc:
        raise Problem("cluster", str(exc)) from None
    st.session_state["_good"] = {"key": job.key(), "tokens": tokens}
except Problem as exc:
    good = st.session_state.get("_good")
    slots[exc.section].error(str(exc), icon=":material/error:")
    if good is None:  # nothing worked yet: there are no results to keep
        st.title("meshplan")
        fail(str(exc))
    stale = str(exc)
    job, tokens = Job.from_key(good["key"]), good["tokens"]
    model, hw = job.model_spec(), job.hw()
    res = cache.sweep(job.key())
key, seq_len, gbs = job.key(), job.seq_len, job.global_batch

price = price_of(hw)
st.title(f"{model.name} on {job.nodes} × {job.gpus_per_node} {hw.id}")
if job.stack != "torchtitan":  # `meshplan web --stack`: every number is this profile's
    st.caption(f"Stack profile **{compute.load_stack(job.stack).id}** ({job.stack}): every estimate, and the plans "
               "downloaded, use it.")
if stale:
    st.warning(f"Stale: these results are for the last inputs that worked. {stale}", icon=":material/history:")
counts = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in res.reason_counts().items())
st.caption(
    f"{job.world} GPUs, seq {seq_len:,}, global batch {gbs:,} sequences ({gbs * seq_len:,} tokens; a target each "
    f"layout meets within ±{res.space.batch_tolerance:.0%}), "
    f"memory margin {job.memory_margin:.0%} of {hw.usable_hbm_gib:.1f} GiB usable: **{res.evaluated:,}** "
    f"configurations evaluated, **{len(res.ranked):,} fit**, {res.rejected:,} rejected ({counts or 'none'})."
)

# the chosen plan is reset to the best whenever the sweep changes
if st.session_state.get("_job") != key:
    st.session_state["_job"] = key
    st.session_state["chosen"] = 1
    st.session_state["compare"] = [r for r in (1, 2) if r <= len(res.ranked)]
if len(res.ranked) == 0:
    hint = cache.add_nodes_hint(key)
    st.error(explain_empty(res) + (f"; {hint} (the Capacity view scans them all)" if hint else ""),
             icon=":material/memory:")


def choose_plan(ctx: Context) -> Context:
    """The chosen-plan list over the ranked plans the Plans table shows; `ctx` with the table, the chosen plan and
    its estimate filled in (as it came when nothing fits)."""
    top = min(int(st.session_state["rows"]), len(ctx.res.ranked))
    if top == 0:
        return ctx
    table = cache.ranked(ctx.key, top, ctx.tokens, ctx.price)
    if st.session_state.get("chosen") not in range(1, top + 1):
        st.session_state["chosen"] = 1
    labels = {int(r.rank): f"#{r.rank}  {r.configuration}  ·  {r.peak_gib:.1f} GiB  ·  "
                           f"{r.tokens_per_sec_per_gpu:,.0f} tok/s/GPU" for r in table.itertuples()}
    st.selectbox("Chosen plan (exports, memory bars and metrics follow it)", list(labels), key="chosen",
                 format_func=labels.get, help="any of the ranked plans (the Plans table's Rows sets how many)")
    chosen = int(table["index"].iloc[st.session_state["chosen"] - 1])
    cfg_json = json.dumps(ctx.res.config(chosen), sort_keys=True)
    est = cache.config_estimate(ctx.key, cfg_json)
    return replace(ctx, table=table, top=top, chosen=chosen, cfg_json=cfg_json, est=est, mem=est["memory"],
                   thr=est["throughput"])


def show_metrics(ctx: Context) -> None:
    """The chosen plan's figures in one row: peak memory, throughput, MFU, step time, days and cost to train, host
    RAM per node."""
    mem, thr, hw, tokens = ctx.mem, ctx.thr, ctx.hw, ctx.tokens
    ttt = time_to_train(tokens, thr["tokens_per_sec_per_gpu"], ctx.job.world, ctx.price)
    m = st.container(key="plan_metrics").columns(7)  # the key names the CSS that lets the row wrap
    lo, hi = mem["peak_gib_interval"]
    m[0].metric("peak / GPU", f"{mem['peak_gib']:.1f} GiB",
                # the probability first: at 1440 px the column cuts the end of the chip
                f"fits {mem['fit_probability']:.0%} · {ctx.res.limit_gib - mem['peak_gib']:.1f} GiB free",
                delta_color="off", delta_arrow="off",
                help=f"worst rank: {mem['worst_rank']}; limit {ctx.res.limit_gib:.1f} GiB (free: the headroom below "
                     f"it). 80 % interval "
                     f"{lo:.1f}-{hi:.1f} GiB and the probability of fitting, from the estimator's cross-validated "
                     "error on published runs")
    tlo, thi = thr["tokens_per_sec_per_gpu_interval"]
    m[1].metric("tokens/s/GPU", f"{thr['tokens_per_sec_per_gpu']:,.0f}", f"80 %: {tlo:,.0f}-{thi:,.0f}",
                delta_color="off", delta_arrow="off",
                help="80 % interval from the estimator's cross-validated error on published runs")
    m[2].metric("MFU", f"{thr['mfu'] * 100:.1f} %", help=f"of {thr['mfu_peak_tflops']:,.0f} dense bf16 TFLOP/s")
    m[3].metric("step time", f"{thr['step_time_s']:.2f} s", f"{thr['microbatches']} microbatches",
                delta_color="off", delta_arrow="off")
    m[4].metric("time to train", f"{ttt['days']:,.1f} days" if ttt else "—",
                f"{tokens / 1e9:,.0f} B tokens" if tokens else "no token budget", delta_color="off", delta_arrow="off")
    m[5].metric("cost", f"${ttt['cost_usd']:,.0f}" if ttt and ttt["cost_usd"] is not None else "—",
                f"{ttt['gpu_hours'] / 1e3:,.0f}k GPU-h" if ttt else None, delta_color="off", delta_arrow="off",
                help=f"at ${ctx.price:.2f} per GPU-hour" if ctx.price else "the profile has no price")
    offloaded = mem.get("host_ram_offloaded_gib_per_node", 0.0)
    m[6].metric("host RAM / node", f"{mem['host_ram_gib_per_node']:,.0f} GiB",
                f"{offloaded:,.0f} GiB offloaded" if offloaded else f"of {hw.host_ram_gib_per_node:,.0f} GiB",
                delta_color="off", delta_arrow="off",
                help=f"the node has {hw.host_ram_gib_per_node:,.0f} GiB; pinned offloaded state, the processes and "
                     "the checkpoint each rank loads")


def show_notes(ctx: Context) -> None:
    """Under the metrics: the fine-tuning's trainable share, a batch the layout moved, the estimate's warnings."""
    ft = st.session_state["ft_mode"]
    if ft != "none":
        what = FINETUNE_MODES[ft] + (f" r{st.session_state['lora_rank']}" if ft in ("lora", "qlora") else "")
        trainable = ctx.est["model"]["trainable_params"]
        st.caption(f"{what}: {trainable:,} trainable parameters ({trainable / ctx.model.params:.2%} of "
                   f"{ctx.model.params:,}); set the pretrained checkpoint folder in Export.")
    moved = batch_note(ctx.res, ctx.chosen)
    if moved:
        st.caption(moved)
    for w in ctx.est["warnings"]:  # the chosen plan fits; what is left are notes on headroom and host RAM
        st.markdown(f":orange[:material/warning: {w}]")


@st.fragment
def chosen_plan_and_views(ctx: Context) -> None:
    """The chosen plan, its metrics and the views. A widget in here (the chosen plan, the open view, a view's own
    inputs) reruns this part alone: the sidebar, the title and the sweep stay on the page as they are, and the
    browser redraws only what follows the chosen plan."""
    for k in VIEW_WIDGETS:  # a view's widgets keep their values while another view is open
        if k in st.session_state:
            st.session_state[k] = st.session_state[k]
    ctx = choose_plan(ctx)
    if ctx.chosen is not None:
        show_metrics(ctx)
        show_notes(ctx)
    tabs = st.tabs(VIEWS, key="view", on_change="rerun")
    for view, pane in zip(VIEWS, tabs, strict=True):
        with pane:
            if pane.open:  # only the open view runs (each is a module of meshplan.ui.web.views)
                VIEW_MODULES[view].render(ctx)


chosen_plan_and_views(Context(key=key, res=res, job=job, hw=hw, base_hw=base_hw, model=model, tokens=tokens,
                              price=price))
