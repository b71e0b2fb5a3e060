"""`meshplan calibrate`: a local stack profile fitted to measured runs, checked on runs it was not fitted to.

The "measured" runs are published torchtitan configurations (bf16, from data/ground_truth/runs.csv) whose
tokens/s and peaks come from a known cluster: the torchtitan profile with GEMMs 12 % slower and an allocator
that reserves 33 % above what it allocates. A calibration that works finds those two behaviours again from
part of the runs and predicts the rest."""

from __future__ import annotations

import csv
import json

import pytest

from meshplan.estimator import validate as V
from meshplan.estimator.calibration import predict, runs_of, with_values
from meshplan.estimator.stack import load_stack

BASE = load_stack("torchtitan")
TRUTH = {"gemm_efficiency": round(BASE.gemm_efficiency * 0.88, 4), "fragmentation": 0.33}


@pytest.fixture(scope="module")
def measured(ground_truth) -> tuple[list[dict], list[dict]]:
    rows = [r for r in V.read_rows(ground_truth) if r["framework"] == "torchtitan" and r["precision"] == "bf16"
            and not (r.get("float8_recipe") or "").strip()]
    truth = with_values(BASE, TRUTH)
    for r, (tps, mem) in zip(rows, predict(truth, runs_of(rows)), strict=True):
        r["measured_tps_per_gpu"], r["measured_mem_gib"] = f"{tps:.1f}", f"{mem:.3f}"
    return rows[::2], rows[1::2]  # fitted to, held out


def write(path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_calibrated_profile_predicts_runs_it_was_not_fitted_to(cli, tmp_path, measured):
    fit_rows, held = measured
    assert len(fit_rows) >= 8 and len(held) >= 8
    write(tmp_path / "measured.csv", fit_rows)
    out = cli("calibrate", str(tmp_path / "measured.csv"), "-o", str(tmp_path / "mycluster.yaml"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["fitted"]["gemm_efficiency"]["fitted"] == pytest.approx(TRUTH["gemm_efficiency"], rel=0.03)
    assert report["fitted"]["fragmentation"]["fitted"] == pytest.approx(TRUTH["fragmentation"], rel=0.03)
    # no Float8 or CP run: those constants are refused, with the reason
    for p in ("float8.tensorwise.gemm_factor", "cp_attention_penalty"):
        assert "no measured row depends on it" in report["left"][p]
    assert report["mape"]["before"]["tps"] > 0.05 and report["mape"]["cross_validated"]["tps"] < 0.02

    # the held-out runs, predicted by `meshplan estimate --stack` with the written profile
    mine = load_stack(str(tmp_path / "mycluster.yaml"))
    assert mine.id == "mycluster" and mine.family == "torchtitan"
    runs = runs_of(held)
    for r, (tps, mem) in zip(runs, predict(mine, runs), strict=True):
        assert tps == pytest.approx(r.tps, rel=0.02) and mem == pytest.approx(r.mem, rel=0.02), r.id
    before = [abs(t / r.tps - 1) for r, (t, _) in zip(runs, predict(BASE, runs), strict=True)]
    assert sum(before) / len(before) > 0.05  # the stock profile was off on them
    est = cli("estimate", "--model", "llama3-8b", "--stack", str(tmp_path / "mycluster.yaml"), "--json")
    assert est.returncode == 0, est.stderr
    assert json.loads(est.stdout)["stack"] == "mycluster"


def test_bad_calibration_input_is_one_line(cli, tmp_path, measured):
    rows = [dict(r, measured_tps_per_gpu="", measured_mem_gib="") for r in measured[0][:3]]
    write(tmp_path / "empty.csv", rows)
    cases = [
        (["calibrate", str(tmp_path / "none.csv"), "-o", str(tmp_path / "a.yaml")], "no such file"),
        (["calibrate", str(tmp_path / "empty.csv"), "-o", str(tmp_path / "b.yaml")], "no measured"),
        (["calibrate", str(tmp_path / "empty.csv"), "-o", str(tmp_path / "c.yaml"), "--id", "a;b"], "--id"),
        (["calibrate", str(tmp_path / "empty.csv"), "-o", str(tmp_path / "d.yaml"), "--stack", "nope"], "nope"),
    ]
    for args, needle in cases:
        out = cli(*args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and needle in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr
    assert not list(tmp_path.glob("*.yaml"))  # nothing half-written


def test_a_refitted_fsdp_cost_carries_its_own_fitted_range(tmp_path, measured):
    """A profile that refits the per-block FSDP cost states the largest share of a step it takes in the runs it
    was fitted to (its estimates beyond that warn), computed under the refitted value; one that keeps the base's
    cost keeps the base's range."""
    import yaml

    from meshplan.estimator.calibration import Calibration, Choice, largest_fsdp_share, profile_yaml

    runs = runs_of(measured[0])
    fitted = with_values(BASE, {"fsdp_overhead_s_per_layer": 0.004})
    share = largest_fsdp_share(fitted, runs)
    assert share is not None and 0 < share < largest_fsdp_share(BASE, runs)
    cal = Calibration(base=BASE, fitted=fitted, choice=Choice(fitted=["fsdp_overhead_s_per_layer"]), runs=runs,
                      before={"tps": 0.1, "mem": None}, in_sample={"tps": 0.01, "mem": None},
                      cross_validated={"tps": 0.02, "mem": None}, folds=2)
    body = yaml.safe_load(profile_yaml(cal, "mine", "torchtitan", "m.csv"))
    assert body["fsdp_overhead_s_per_layer"] == 0.004 and body["fsdp_overhead_calibrated_share"] == share
    (tmp_path / "mine.yaml").write_text(profile_yaml(cal, "mine", "torchtitan", "m.csv"))
    assert load_stack(str(tmp_path / "mine.yaml")).fsdp_overhead_calibrated_share == share
    cal = Calibration(base=BASE, fitted=with_values(BASE, {"gemm_efficiency": 0.7}), choice=Choice(
        fitted=["gemm_efficiency"]), runs=runs, before={"tps": 0.1, "mem": None},
        in_sample={"tps": 0.05, "mem": None}, cross_validated={"tps": 0.06, "mem": None}, folds=2)
    body = yaml.safe_load(profile_yaml(cal, "mine", "torchtitan", "m.csv"))
    assert "fsdp_overhead_calibrated_share" not in body


def test_the_global_fit_moves_only_the_profiles_that_inherit_a_constant(calibrate):
    """benchmarks/calibrate.py writes a fitted torchtitan constant into every profile that took it from torchtitan
    (its releases, generic and the profiles extending it) and leaves a profile's own value alone: llm-foundry's
    counted 5 elementwise passes, generic's measured FSDP2 hooks. Until 2026-11-27 it overwrote them, so
    llm-foundry's constants were fitted around torchtitan's elementwise traffic and cross_validate.py predicted the
    published runs of frameworks without a profile with torchtitan's fitted FSDP cost."""
    C = calibrate
    keys = [("torchtitan", "elementwise_passes"), ("torchtitan", "fsdp_overhead_s_per_layer")]
    start = {k: C._get(V._stack(k[0]), k[1]) for k in keys}
    own = {s: (V._stack(s).elementwise_passes, V._stack(s).fsdp_overhead_s_per_layer) for s in ("llm-foundry", "generic")}
    assert own["llm-foundry"][0] != start[keys[0]] and own["generic"][1] != start[keys[1]]
    try:
        C.set_values({keys[0]: 77.0, keys[1]: 0.019})
        assert V._stack("torchtitan-2024").elementwise_passes == 77.0 == V._stack("generic").elementwise_passes
        assert V._stack("torchtitan-2024").fsdp_overhead_s_per_layer == 0.019
        assert (V._stack("llm-foundry").elementwise_passes, V._stack("generic").fsdp_overhead_s_per_layer) == (
            own["llm-foundry"][0], own["generic"][1])
    finally:
        C.set_values(start)
    assert V._stack("torchtitan-2024").elementwise_passes == start[keys[0]]
