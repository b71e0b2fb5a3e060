"""The CLI's tables on an 80-column terminal (a login node, or any pipe): every number and identifier printed
whole, checked against the same command's --json, and tables that fit left as they were."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console
from rich.table import Table

from meshplan.commands.table_fit import fit_table

NARROW = {"COLUMNS": "80"}


def _lines(out: str) -> list[str]:
    return out.splitlines()


def test_hardware_ids_are_whole_on_80_columns(cli):
    """`meshplan hardware` printed "h100-…" for five ids at 80 columns: the names a user has to type."""
    out = cli("hardware", env=NARROW)
    assert out.returncode == 0, out.stderr
    ids = [p["id"] for p in json.loads(cli("hardware", "--json").stdout)]
    assert "…" not in out.stdout and max(len(line) for line in _lines(out.stdout)) <= 80
    first_words = {line.split()[0] for line in _lines(out.stdout) if line.strip()}
    assert set(ids) <= first_words  # each id starts a row, whole


def test_validate_errors_are_whole_on_80_columns(cli, tmp_path):
    """`meshplan validate` cut "+20.3%" to "+20.…" at 80 columns; every predicted and measured number and error
    of its --json now appears in the table, each on the row of its run."""
    csv = "data/ground_truth/runs.csv"
    out = cli("validate", csv, env=NARROW)
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout and max(len(line) for line in _lines(out.stdout)) <= 80
    rows = json.loads(cli("validate", csv, "--json").stdout)["rows"]
    by_id = {line.split()[0]: line for line in _lines(out.stdout) if line.split() and line.split()[0].startswith("r0")}
    checked = 0
    for r in rows[:40]:
        line = by_id[r["id"]]
        assert f"{r['predicted_tps_per_gpu']:,.0f}" in line, (r["id"], line)
        if r.get("tps_error") is not None:  # the table's first percentage: the tokens/s error, whole
            first = float(re.findall(r"[+-]\d+\.\d%", line)[0][:-1])
            assert first == pytest.approx(r["tps_error"] * 100, abs=0.051), (r["id"], line)
            checked += 1
    assert checked >= 30


def test_capacity_costs_are_whole_on_80_columns(cli):
    """`meshplan capacity` printed costs as "1,047,…" at 80 columns."""
    args = ("capacity", "--model", "llama3-70b", "--tokens", "1e12", "--hardware", "h100-sxm,a100-sxm-80g",
            "--nodes", "4,16")
    out = cli(*args, env=NARROW)
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout and max(len(line) for line in _lines(out.stdout)) <= 80
    opts = [o for o in json.loads(cli(*args, "--json").stdout)["options"] if o["fits"]]
    assert opts
    for o in opts:
        assert f"{o['cost_usd']:,.0f}" in out.stdout and f"{o['gpu_hours']:,.0f}" in out.stdout


def _table(rows: int, title: str = "t") -> Table:
    t = Table(title=title)
    for col in ("name", "configuration", "tok/s/GPU", "cost $"):
        t.add_column(col, justify="left" if col in ("name", "configuration") else "right", no_wrap=col == "name")
    for k in range(rows):
        t.add_row(f"profile-{k}-long-id", "dp 1x128, mbs 2, AC full, fp8 tensorwise, compile, async TP",
                  f"{123456 + k:,}", f"{9876543 + k:,}")
    return t


@pytest.mark.parametrize("width", [50, 64, 80])
def test_fit_table_folds_text_and_keeps_numbers(width):
    text = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    text.print(fit_table(_table(3), width))
    out = text.export_text()
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= width
    for k in range(3):
        assert f"profile-{k}-long-id" in out and f"{123456 + k:,}" in out and f"{9876543 + k:,}" in out


def test_a_table_that_fits_keeps_its_box():
    t = _table(2)
    box_before = t.box
    fit_table(t, 200)
    assert t.box is box_before and all(c.max_width is None for c in t.columns)


def test_too_narrow_for_the_numbers_is_left_to_rich():
    """Below what the numbers and ids need, nothing can be whole: the table is handed to rich unchanged in its
    widths (rich then cuts, as before)."""
    t = _table(1)
    fit_table(t, 20)
    assert all(c.max_width is None for c in t.columns)


def test_plan_on_80_columns_numbers_whole_and_tree_indented(cli):
    """`meshplan plan` on an 80-column terminal: the ranked table's numbers whole, and the decision tree's wrapped
    lines start under the text they continue (a headline's under its label, a reason's at its 6-cell indent), none
    at the margin, none wider than the terminal."""
    args = ("plan", "--model", "llama3-70b", "--nodes", "8", "--tokens", "1e12", "--top", "3")
    out = cli(*args, env=NARROW)
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout
    plans = json.loads(cli(*args, "--json").stdout)["plans"]
    for p in plans:
        assert f"{p['estimate']['throughput']['tokens_per_sec_per_gpu']:,.0f}" in out.stdout
    tree = out.stdout.split("decision tree\n", 1)[1].split("\nwrote ", 1)[0].splitlines()
    assert len(tree) > 10 and max(len(line) for line in tree) <= 80
    for line in tree:
        assert re.match(r"\d+\. \[[x-]\] ", line) or line.startswith("   "), line
        assert line == line.rstrip(), "no trailing padding"
