"""Accuracy bands on the published runs, and proof that predictions never read measured columns."""

import csv
import io

import pytest

from estimator.validate import MEASURED_COLUMNS, read_rows, summarize, validate_rows


@pytest.fixture(scope="module")
def results(ground_truth):
    return validate_rows(read_rows(ground_truth))


def test_every_row_is_predicted(results):
    failed = [(r.id, r.error) for r in results if r.error]
    assert not failed


# Memory rows from 2025 torchtitan builds (B200 and MI300X in the torchao float8 table, the H200 trainy
# benchmark) sit 14-16 GiB below the same configuration measured on H100 in the same table: those builds
# compile the loss with the model, which removes the fp32 logits buffers this model (and the Dec-2024
# H100 tables) carries. The CSV has no column that tells the builds apart, so the estimator keeps the
# behaviour of the majority of rows and these rows are reported, not tuned away (README "Accuracy").
NEWER_BUILD_MEMORY_ROWS = {"r0041", "r0042", "r0462", "r0463", "r0464", "r0465", "r0466", "r0467", "r0468",
                           "r0469", "r0470"}


def test_torchtitan_throughput_band(results):
    s = summarize(results)["by_framework"]["torchtitan"]
    assert s["tps"]["mape"] <= 0.10
    assert s["tps"]["n"] == 55


def test_torchtitan_memory_band(results):
    tt = [r for r in results if r.framework == "torchtitan" and r.mem_err is not None]
    assert len(tt) == 32
    same_build = [abs(r.mem_err) for r in tt if r.id not in NEWER_BUILD_MEMORY_ROWS]
    assert sum(same_build) / len(same_build) <= 0.10
    # all rows, the newer builds included: the figure the README reports (above the 10 %)
    assert sum(abs(r.mem_err) for r in tt) / len(tt) <= 0.17


def test_llm_foundry_band(results):
    s = summarize(results)["by_framework"]["llm-foundry"]
    assert s["tps"]["mape"] <= 0.15
    assert s["tps"]["n"] == 77


def test_no_torchtitan_row_worse_than_25_percent(results):
    bad = []
    for r in results:
        if r.framework != "torchtitan":
            continue
        if abs(r.tps_err) > 0.25:
            bad.append((r.id, "tps", round(r.tps_err, 3)))
        if r.mem_err is not None and abs(r.mem_err) > 0.25 and r.id not in NEWER_BUILD_MEMORY_ROWS:
            bad.append((r.id, "mem", round(r.mem_err, 3)))
    assert not bad


def test_predictions_ignore_measured_columns(ground_truth):
    rows = read_rows(ground_truth)
    before = [(r.predicted_tps_per_gpu, r.predicted_mem_gib) for r in validate_rows(rows)]
    mutated = []
    for i, row in enumerate(rows):
        row = dict(row)
        row["measured_tps_per_gpu"] = str(1 + i * 7919 % 100000)
        row["measured_mem_gib"] = "" if i % 2 else "123.4"
        row["measured_mfu"] = "99"
        row["status"] = "oom"
        mutated.append(row)
    after = [(r.predicted_tps_per_gpu, r.predicted_mem_gib) for r in validate_rows(mutated)]
    assert before == after
    assert set(MEASURED_COLUMNS) <= set(rows[0])


def test_validate_cli_json(cli, ground_truth):
    out = cli("validate", str(ground_truth), "--json")
    assert out.returncode == 0, out.stderr
    import json

    data = json.loads(out.stdout)
    assert len(data["rows"]) == len(read_rows(ground_truth))
    row = data["rows"][0]
    for key in ("id", "framework", "predicted_tps_per_gpu", "measured_tps_per_gpu", "predicted_mem_gib",
                "measured_mem_gib"):
        assert key in row
    assert set(data["summary"]["by_framework"]) == {"torchtitan", "llm-foundry"}


def test_validate_cli_table(cli, ground_truth):
    out = cli("validate", str(ground_truth))
    assert out.returncode == 0 and "MAPE" in out.stdout and "r0000" in out.stdout


def test_validate_bad_csv(cli, tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text("id,foo\n1,2\n")
    out = cli("validate", str(p))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "lacks the ground-truth column" in out.stderr
    assert "Traceback" not in out.stderr


def test_validate_reports_bad_row_instead_of_skipping(ground_truth, tmp_path):
    rows = read_rows(ground_truth)[:3]
    rows[1] = {**rows[1], "hardware": "no-such-gpu"}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    p = tmp_path / "runs.csv"
    p.write_text(buf.getvalue())
    res = validate_rows(read_rows(p))
    assert len(res) == 3 and res[1].error and "no-such-gpu" in res[1].error
    assert summarize(res)["all"]["failed"] == 1
