"""The web app's controls under Streamlit's AppTest: every control in every view says what it takes (help), and a bad
input is explained under its own sidebar section while the last results that worked stay on the page, marked stale."""

from __future__ import annotations

from needs import require_module

require_module("streamlit")

VIEWS = ["Plans & memory", "Sweep", "Decision tree", "Time & cost", "Capacity", "Compare", "Export", "Assumptions"]
KINDS = ("number_input", "selectbox", "multiselect", "radio", "slider", "checkbox", "toggle", "text_input")


def controls(at) -> list:
    return [w for kind in KINDS for w in at.get(kind)]


def test_every_control_has_help(web_app):
    # LoRA and the custom hardware values show their own inputs; the pins sit in an expander
    at = web_app(model="llama3-8b", nodes=1, ft_mode="lora", hw_custom=True)
    seen = set()
    for view in VIEWS:
        at.session_state["view"] = view
        at.run()
        assert not at.exception, view
        for w in controls(at):
            seen.add(w.label)
            assert (w.help or "").strip(), f"{view}: '{w.label}' has no help"
    # the sidebar's fields, the custom values, LoRA, the pins and each view's own controls were all checked
    for label in ("Nodes", "Sequence length (tokens)", "HBM per GPU (GiB)", "LoRA rank", "TP degree",
                  "Accelerators to scan", "rows shown", "Preview"):
        assert label in seen, label


def texts(elements) -> str:
    return " | ".join(e.value for e in elements)


def test_a_bad_input_keeps_the_last_results_marked_stale(web_app):
    at = web_app(model="llama3-8b", nodes=1)
    assert not at.exception and not at.error and not at.warning
    title, tps = at.title[0].value, at.metric[1].value

    at.session_state["tokens_b"] = 2e12  # what --tokens takes, typed into a field counted in billions
    at.run()
    assert not at.exception
    # explained in the sidebar, under the cluster inputs, in one line without a flag name or a traceback
    said = texts(at.sidebar.error)
    assert "counts billions of tokens" in said and "--" not in said and "Traceback" not in said
    assert at.title[0].value == title and at.metric[1].value == tps  # the last results stay
    stale = texts(at.main.warning)
    assert stale.startswith("Stale") and "counts billions" in stale
    assert len(at.get("plotly_chart")) == 2

    at.session_state["tokens_b"] = 100.0  # fixed: a fresh result, nothing stale
    at.run()
    assert not at.sidebar.error and "Stale" not in texts(at.main.warning)

    at.session_state["hw_custom"] = True
    at.session_state["hw_hbm_total_gib"] = 0.0  # was silently replaced by the stock profile
    at.run()
    assert not at.exception
    assert "custom hardware values" in texts(at.sidebar.error)
    assert texts(at.main.warning).startswith("Stale") and at.title[0].value == title

    at.session_state["batch_unit"] = "tokens"
    at.session_state["batch_tokens"] = 1000  # not a whole number of sequences: the first problem is still said
    at.run()
    assert not at.exception and texts(at.main.warning).startswith("Stale")


def test_a_bad_first_input_has_no_results_to_keep(web_app):
    at = web_app(model="llama3-8b", tokens_b=2e12)
    assert not at.exception
    assert "counts billions of tokens" in at.main.error[0].value and not at.metric
