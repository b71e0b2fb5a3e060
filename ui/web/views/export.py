"""Export view of the web app. Downloads of the chosen plan: plan file, torchtitan configs, launch scripts, the sweep CSV."""

from __future__ import annotations

import streamlit as st

from meshplan.estimator.errors import MeshplanError
from meshplan.ui.web import cache
from meshplan.ui.web.compute import EXPORT_FORMATS
from meshplan.ui.web.views.context import Context


def render(ctx: Context) -> None:
    if ctx.chosen is None:
        st.info("Nothing fits: there is no plan to export. The sweep CSV says why each configuration failed.")
    else:
        st.markdown(f"Exports of the chosen plan **#{st.session_state['chosen']}**: "
                    f"{ctx.table['configuration'].iloc[st.session_state['chosen'] - 1]}")
        plan_path = st.text_input("Plan path as the nodes see it (baked into the scripts; empty: next to the "
                                  "script)", key="plan_path", placeholder="e.g. /shared/plans/plan.yaml",
                                  help="where the plan YAML will sit on the cluster's shared filesystem; the "
                                       "launch scripts read it from there").strip() or None
        init_from = None
        if ctx.job.pin_dict().get("finetune"):
            init_from = st.text_input("Pretrained checkpoint folder (init_from: config.json + *.safetensors, "
                                      "absolute, as the nodes see it)", key="init_from",
                                      placeholder="e.g. /shared/ckpt/Llama-3.1-70B",
                                      help="a Hugging Face checkpoint folder on the nodes: each rank reads its own "
                                           "slices of the safetensors").strip() or None
        try:
            ex = cache.exports(ctx.key, ctx.cfg_json, ctx.tokens, plan_path, init_from)
        except MeshplanError as exc:  # a relative checkpoint folder, say
            st.error(str(exc), icon=":material/error:")
            return
        files = ex["files"]
        cols = st.container(key="export_files").columns(3)  # the key names the CSS that wraps the buttons' names
        for k, (fkey, (label, fname, text, mime)) in enumerate(files.items()):
            cols[k % 3].download_button(label, text, file_name=fname, mime=mime, key=f"dl_{fkey}",
                                        help=f"downloads {fname}", on_click="ignore",
                                        icon=":material/download:", width="stretch")
        by_reason: dict[str, list[str]] = {}  # one warning per reason (a plan of another framework: one for all)
        for fmt, err in ex["errors"].items():
            by_reason.setdefault(err, []).append(EXPORT_FORMATS[fmt][0])
        for err, labels in by_reason.items():
            st.warning(f"{', '.join(labels)}: {err}")
        preview = st.selectbox("Preview", list(files), key="preview", format_func=lambda f: files[f][1],
                               help="the text of one download, as it will be written")
        st.code(files[preview][2], language="toml" if preview == "torchtitan-toml" else
                "yaml" if preview == "plan" else "bash", height=420)
    st.download_button(
        f"Sweep as CSV ({ctx.res.evaluated:,} rows, generated on click)", lambda: cache.sweep_csv(ctx.key),
        file_name=f"{ctx.model.name}-{ctx.job.world}gpu-{ctx.hw.id}-sweep.csv", mime="text/csv", key="dl_csv",
        on_click="ignore", icon=":material/table:",
    )
