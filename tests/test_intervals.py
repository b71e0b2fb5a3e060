"""80 % intervals and fit probabilities from the estimator's cross-validated error (data/accuracy/intervals.yaml)."""

from __future__ import annotations

import json

import pytest

from meshplan.estimator import intervals
from meshplan.estimator.report import SHARE_TOLERANCE
from meshplan.estimator.stack import load_stack


def test_the_shipped_quantiles_come_from_held_out_runs():
    text = intervals.intervals_path().read_text()
    assert "leave one" in text and "cross_validate.py --write-intervals" in text
    for metric in intervals.METRICS:
        t = intervals.table(metric, "torchtitan")
        assert t.rows >= 20
        lo, hi = t.ratio(0.1), t.ratio(0.9)
        assert 0.5 < lo < 1 < hi < 2, (metric, lo, hi)  # the estimator errs both ways, by tens of percent at most


def test_estimate_carries_intervals_and_a_fit_probability(cli):
    def est(*args: str) -> dict:
        out = cli("estimate", *args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    small = est("--model", "llama3-8b", "--gpus", "8")
    thr, mem = small["throughput"], small["memory"]
    lo, hi = thr["tokens_per_sec_per_gpu_interval"]
    assert lo < thr["tokens_per_sec_per_gpu"] < hi
    lo, hi = mem["peak_gib_interval"]
    assert lo < mem["peak_gib"] < hi
    assert mem["fits"] and mem["fit_probability"] >= 0.9
    big = est("--model", "llama3-70b", "--gpus", "8", "--ac", "none")  # far beyond 80 GiB
    assert not big["memory"]["fits"] and big["memory"]["fit_probability"] <= 0.05


def test_fit_probability_falls_as_the_peak_nears_the_limit():
    probs = [float(intervals.fit_probability(peak, 80.0, "torchtitan")) for peak in (40, 70, 78, 80, 85, 120)]
    assert probs == sorted(probs, reverse=True)
    assert probs[0] == 1.0 and probs[-1] == 0.0 and 0 < probs[3] < 1


def test_validate_reports_intervals_and_their_coverage(cli, ground_truth):
    out = cli("validate", str(ground_truth), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    row = next(r for r in data["rows"] if r["measured_mem_gib"])
    lo, hi = row["predicted_mem_gib_interval"]
    assert lo < row["predicted_mem_gib"] < hi
    assert row["predicted_tps_per_gpu_interval"][0] < row["predicted_tps_per_gpu"]
    s = data["summary"]["all"]
    # in-sample (the shipped constants on the rows they were fitted to): reported, not the test of the intervals
    assert 0 < s["tps_interval_coverage"] <= 1 and 0 < s["mem_interval_coverage"] <= 1, s


def test_intervals_hold_most_runs_of_folds_they_were_not_built_from():
    """The README's coverage table, rebuilt from the held-out predictions without refitting: each fold's runs
    against the interval the other folds' predictions give (the issue asks >= 70 % for an 80 % interval)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "cross_validate.py"), "--intervals-only"],
                         capture_output=True, text=True, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines() if line.startswith("| tokens") or
            line.startswith("| peak")]
    assert len(rows) >= 2
    folds_checked = 0
    moe = [cells for cells in rows if cells[2].strip() == "moe"]
    assert len(moe) == 1  # reported, but not held to 70 %: 12 MoE runs, and one left out leaves too few for a table
    for cells in rows:
        if cells in moe:
            continue
        share = int(cells[5].strip().split("%")[0])  # share of the held-out runs
        assert share >= 70, cells
        if "folds" in cells[6]:  # each fold once: how the interval does on the next document or hardware part
            assert int(cells[6].strip().split("%")[0]) >= 70, cells
            folds_checked += 1
    assert folds_checked == 2  # tokens/s and memory, on the "all" tables


def test_quantiles_weigh_each_held_out_fold_the_same():
    """cross_validate.py weighs each fold once: a 2-run fold (the H200 document) pulls a quantile as far as a
    33-run one; with equal weights the quantiles are numpy's (its "hazen" positions, (i + 1/2) / n)."""
    import numpy as np

    rng = np.random.default_rng(5)
    x = rng.normal(1.0, 0.1, 23)
    for p in intervals.PROBABILITIES:
        assert intervals.weighted_quantile(x, np.ones(23), p) == pytest.approx(float(np.quantile(x, p, method="hazen")),
                                                                                   abs=1e-12)
    assert intervals.weighted_quantile([3.0], [2.0], 0.4) == 3.0
    ratios = [0.9] * 19 + [1.2]  # one fold of 19 runs at 0.9, one fold of one run at 1.2
    by_run = intervals.quantile_table(ratios)
    by_fold = intervals.quantile_table(ratios, groups=["big"] * 19 + ["small"])
    assert by_run["rows"] == by_fold["rows"] == 20
    assert by_run["quantiles"][0.9] < 1.0 < by_fold["quantiles"][0.9]  # the small fold counts half, not a twentieth
    assert by_fold["quantiles"][0.0] == 0.9 and by_fold["quantiles"][1.0] == 1.2
    intervals.QuantileTable(**by_fold)  # a valid table: increasing, with 0.1 and 0.9
    with pytest.raises(ValueError):
        intervals.quantile_table(ratios, groups=["big"])
    with pytest.raises(ValueError):
        intervals.weighted_quantile([1.0, 2.0], [1.0, 0.0], 0.5)


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--bound", "torchtitan.fragmentation=0.5", "--write-readme"], "what-if"),
     (["--bound", "torchtitan.nope=1"], "not a fitted constant"),
     (["--bound", "torchtitan.fragmentation"], "STACK.FIELD=HIGH"),
     (["--bound", "torchtitan.fragmentation=0.01"], "must exceed the lower bound")],
)
def test_a_what_if_bound_is_checked_before_any_fit_and_writes_nothing(args, says):
    """cross_validate.py --bound refits with another upper bound for one constant; it refuses to write the README or
    the intervals (a what-if), and a bad bound fails in one line before any fit."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "cross_validate.py"), *args],
                         capture_output=True, text=True, cwd=root, timeout=120)
    assert out.returncode != 0 and says in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 5  # argparse's usage + one line, or one line


def test_plan_fits_by_probability(cli):
    def plans(conf: str) -> dict:
        out = cli("plan", "--model", "llama3-8b", "--nodes", "1", "--top", "50", "--fit-confidence", conf, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    sure, likely = plans("0.95"), plans("0.5")
    assert sure["plans"] and sure["rejected_by_reason"]["memory"] > likely["rejected_by_reason"]["memory"]
    assert all(p["estimate"]["memory"]["fit_probability"] >= 0.95 for p in sure["plans"])
    out = cli("plan", "--model", "llama3-8b", "--nodes", "1", "--fit-confidence", "1.5")
    assert out.returncode == 2 and "--fit-confidence" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("quantiles", [{0.1: 1.1, 0.9: 0.9}, {0.1: 0.9}, {0.1: -1.0, 0.9: 1.0}])
def test_a_malformed_quantile_table_is_refused(quantiles):
    with pytest.raises(ValueError):
        intervals.QuantileTable(rows=30, quantiles=quantiles)


def test_plain_interpolation_is_numpys_to_the_bit():
    """One estimate reads the quantile tables in plain Python (`intervals.interp`); the planner's arrays in numpy:
    the same numbers, at the table's own points, between them, beyond both ends and at repeated ratios."""
    import numpy as np

    rng = np.random.default_rng(3)
    checked = 0
    for metric in intervals.METRICS:
        for stack in ("torchtitan", "llm-foundry", "nanotron"):
            t = intervals.table(metric, stack)
            for xs, ys in ((t._probs, t._ratios), (t._ratios, t._probs)):
                points = [*xs, *rng.uniform(min(xs) - 0.3, max(xs) + 0.3, 400), float("nan")]
                for x in points:
                    want = float(np.interp(x, xs, ys))
                    got = intervals.interp(float(x), xs, ys)
                    assert got == want or (np.isnan(want) and np.isnan(got)), (metric, stack, x)
                    checked += 1
    assert checked > 4000
    peaks = np.array([10.0, 60.0, 79.0, 200.0])
    assert intervals.fit_probability(peaks, 70.0, "torchtitan").tolist() == [
        intervals.fit_probability(float(p), 70.0, "torchtitan") for p in peaks]


def test_each_fitted_fsdp_cost_states_the_largest_share_its_runs_give_it(ground_truth, calibrate):
    """`fsdp_overhead_calibrated_share` is what the shipped constants give the published runs, not a guess: the
    largest share of a step the per-block FSDP cost takes among the runs each family's constants were fitted to
    (benchmarks/calibrate.py's own choice of rows: not the parts it keeps out of the fit), rounded up to the point."""
    import math

    from meshplan.estimator import validate as V

    rows = V.read_rows(ground_truth)
    for family in ("torchtitan", "llm-foundry"):
        shares = [V.estimate_row(row)["throughput"]["fsdp_overhead_share"] for row in calibrate._family_rows(rows, family)
                  if V.run_status(row.get("status")) == "ok" and row.get("measured_tps_per_gpu")]
        assert shares, family
        stated = V._stack(family).fsdp_overhead_calibrated_share
        assert stated == math.ceil(max(shares) * 100) / 100, (family, max(shares), stated)
    assert V._stack("generic").fsdp_overhead_calibrated_share is None  # its 1 ms is measured, not fitted


def test_an_estimate_beyond_the_fitted_fsdp_cost_says_so_and_widens_its_band(cli):
    """An 8B model's 2k-token microbatches on 8 GPUs: the fitted 7.2 ms a block is over 40 % of the step, more than
    in any run it was fitted to; the estimate stays (the cost as fitted) but warns, and the interval's upper end reaches
    the estimate with the cost at its largest fitted share. At 8k tokens it is within the fitted range."""
    def est(seq: str) -> dict:
        out = cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--compile", "--seq-len", seq,
                  "--global-batch-size", "8", "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    short, long_ = est("2048"), est("8192")
    t = short["throughput"]
    assert t["fsdp_overhead_share"] > 0.4
    plain_hi = intervals.interval(t["tokens_per_sec_per_gpu"], "tokens_per_sec_per_gpu", "torchtitan")[1]
    lo, hi = t["tokens_per_sec_per_gpu_interval"]
    assert lo < t["tokens_per_sec_per_gpu"] and hi > 1.2 * plain_hi, (lo, hi, plain_hi)
    assert any("per-block FSDP cost" in w and "extrapolate" in w for w in short["warnings"])
    t = long_["throughput"]
    assert 0.1 < t["fsdp_overhead_share"] <= load_stack("torchtitan").fsdp_overhead_calibrated_share + SHARE_TOLERANCE
    assert t["tokens_per_sec_per_gpu_interval"][1] == pytest.approx(
        intervals.interval(t["tokens_per_sec_per_gpu"], "tokens_per_sec_per_gpu", "torchtitan")[1], abs=0.1)
    assert not any("per-block FSDP cost" in w for w in long_["warnings"])
    # the text report says how much of the step the cost is, and warns where it extrapolates
    out = cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--compile", "--seq-len", "2048",
              "--global-batch-size", "8")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    share = f"{short['throughput']['fsdp_overhead_share']:.0%}"
    assert f"({share} of the step) is the stack's per-block FSDP cost" in text and f"warning: {share} of this step" in text


def test_a_mixture_of_experts_estimate_takes_the_moe_runs_interval(cli):
    """MoE estimates are further off than dense ones on the published MoE runs: their tokens/s interval is those
    runs' own (data/accuracy/intervals.yaml `moe`), never narrower than the dense one on either side (`envelope`;
    2026-11-28: the MoE runs' own 0.72-1.09 against the dense 0.84-1.16, so 0.72-1.16); memory keeps the dense
    table."""
    moe_t = intervals.table("tokens_per_sec_per_gpu", "torchtitan", moe=True)
    dense_t = intervals.table("tokens_per_sec_per_gpu", "torchtitan")
    own = intervals.moe_table("tokens_per_sec_per_gpu")
    assert moe_t.rows == own.rows >= 10 and moe_t is not dense_t
    for p in (0.05, 0.1, 0.25):
        assert moe_t.ratio(p) == min(own.ratio(p), dense_t.ratio(p))
    for p in (0.75, 0.9, 0.95):
        assert moe_t.ratio(p) == max(own.ratio(p), dense_t.ratio(p))
    assert moe_t.ratio(0.5) == own.ratio(0.5)
    assert moe_t.ratio(0.1) < dense_t.ratio(0.1) and moe_t.ratio(0.9) >= dense_t.ratio(0.9)
    assert intervals.table("peak_memory", "torchtitan", moe=True) is intervals.table("peak_memory", "torchtitan")
    out = cli("estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "8", "--ac", "full", "--json")
    assert out.returncode == 0, out.stderr
    t = json.loads(out.stdout)["throughput"]
    lo, hi = t["tokens_per_sec_per_gpu_interval"]
    assert lo == pytest.approx(t["tokens_per_sec_per_gpu"] * moe_t.ratio(0.1), rel=1e-3)
    assert hi >= t["tokens_per_sec_per_gpu"] * moe_t.ratio(0.9) * (1 - 1e-3)


def test_profiles_no_published_run_calibrated_take_the_uncalibrated_table(tmp_path):
    """generic and the profiles extending it (nanotron, KempnerForge) take the error of the published runs of
    frameworks no run calibrated (`error_table: uncalibrated`); torchtitan's releases their own; a team's YAML
    extending torchtitan takes `all` unless its file names torchtitan; a framework's bare name resolves too."""
    for stack in ("generic", "generic-zero1", "nanotron", "nanotron-zero1", "kempnerforge"):
        assert intervals.table_name(stack) == "uncalibrated", stack
    assert intervals.table_name("torchtitan-2024") == "torchtitan"
    assert intervals.table_name("llm-foundry") == "llm-foundry"
    mine = tmp_path / "mycluster.yaml"
    mine.write_text("extends: torchtitan\nid: mycluster\nname: mine\n")
    assert intervals.table_name(str(mine)) == "mycluster"
    assert intervals.table("tokens_per_sec_per_gpu", str(mine)) is intervals.table("tokens_per_sec_per_gpu", "x")
    unc = intervals.table("tokens_per_sec_per_gpu", "kempnerforge")
    assert unc is not intervals.table("tokens_per_sec_per_gpu", "torchtitan") and unc.rows >= 20


def test_a_mixture_of_experts_estimate_says_where_its_wide_band_comes_from(cli):
    out = cli("estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "8", "--ac", "full", "--json")
    assert out.returncode == 0, out.stderr
    said = [w for w in json.loads(out.stdout)["warnings"] if w.startswith("mixture of experts")]
    t = intervals.table("tokens_per_sec_per_gpu", "torchtitan", moe=True)
    assert len(said) == 1 and f"{t.rows} published MoE runs" in said[0] and f"{t.ratio(0.9):.2f}" in said[0]
    # four published MoE runs state a peak: fewer than a table of their own needs, so the memory band is the dense
    # runs', and the warning says so (the JSON's band is that table's)
    assert intervals.moe_table("peak_memory") is None
    assert "peak-memory interval is the dense runs'" in said[0]
    est = json.loads(out.stdout)
    low, high = est["memory"]["peak_gib_interval"]
    dense_t = intervals.table("peak_memory", "torchtitan")
    assert low == pytest.approx(est["memory"]["peak_gib"] * dense_t.ratio(0.1), rel=2e-3)
    dense = cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--json")
    assert not any(w.startswith("mixture of experts") for w in json.loads(dense.stdout)["warnings"])
