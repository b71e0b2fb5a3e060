"""Documented corrections to cells of a runs CSV, kept beside it (`<stem>.corrections.yaml`): the shipped one, and
what a correction that does not match its CSV says."""

import json

import pytest

from meshplan.estimator.row_corrections import CORRECTED
from meshplan.estimator.validate import read_rows, validate_rows


def test_the_torchao_h100_rows_are_read_as_the_part_their_memory_names(cli, ground_truth):
    """runs.corrections.yaml: the torchao table's H100 rows ran on the 96 GB / 500 W part (47.65 GiB was 50.16 % of
    its memory in the same team's torchtitan log); the CSV stays verbatim, every reader sees the correction."""
    rows = {r["id"]: r for r in read_rows(ground_truth)}
    assert [rows[i]["hardware"] for i in ("r0459", "r0460", "r0461")] == ["h100-96g-500w"] * 3
    assert rows["r0459"][CORRECTED] == ["hardware: h100-sxm -> h100-96g-500w"]
    assert CORRECTED not in rows["r0462"]  # the MI300X rows of the same table are as published
    by_id = {r.id: r for r in validate_rows(read_rows(ground_truth))}
    assert by_id["r0459"].hardware == "h100-96g-500w" and by_id["r0459"].stack == "torchtitan-2024"  # March 2025
    out = cli("validate", str(ground_truth))
    assert "corrected: 3 row(s)" in " ".join(out.stdout.split())
    data = json.loads(cli("validate", "--json", str(ground_truth)).stdout)
    marked = {r["id"]: r.get("corrected") for r in data["rows"] if r.get("corrected")}
    assert sorted(marked) == ["r0459", "r0460", "r0461"]


@pytest.mark.parametrize(("corrections", "message"), [
    ("corrections:\n  - rows: [a1]\n    column: hardware\n    was: h200-sxm\n    now: h100-sxm\n    evidence: x\n",
     "row a1 hardware is 'h100-sxm', not 'h200-sxm' as the correction expects"),
    ("corrections:\n  - rows: [zz]\n    column: hardware\n    was: h100-sxm\n    now: h200-sxm\n    evidence: x\n",
     "row 'zz' is not in runs.csv"),
    ("corrections:\n  - rows: [a1]\n    column: hardware\n", "corrections runs.corrections.yaml"),
    ("corrections: [\n", "runs.corrections.yaml"),
])
def test_a_correction_that_does_not_match_its_csv_is_a_one_line_error(cli, tmp_path, corrections, message):
    header = ("id,source,framework,model,hardware,gpus,gpus_per_node,dp_shard,seq_len,global_batch_size,"
              "micro_batch_size,measured_tps_per_gpu\n")
    (tmp_path / "runs.csv").write_text(header + "a1,doc,torchtitan,llama3-8b,h100-sxm,8,8,8,8192,8,1,6000\n")
    (tmp_path / "runs.corrections.yaml").write_text(corrections)
    out = cli("validate", str(tmp_path / "runs.csv"))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_correction_applies_to_any_runs_csv_beside_it(tmp_path):
    header = "id,framework,model,hardware,gpus,gpus_per_node,dp_shard,seq_len,global_batch_size,micro_batch_size\n"
    (tmp_path / "mine.csv").write_text(header + "a1,torchtitan,llama3-8b,h100-sxm,8,8,8,8192,8,1\n")
    (tmp_path / "mine.corrections.yaml").write_text(
        "corrections:\n  - rows: [a1]\n    column: hardware\n    was: h100-sxm\n    now: h200-sxm\n"
        "    evidence: the job log names the part\n")
    (row,) = read_rows(tmp_path / "mine.csv")
    assert row["hardware"] == "h200-sxm" and row[CORRECTED] == ["hardware: h100-sxm -> h200-sxm"]


def test_a_csv_column_named_corrected_is_read_as_data(tmp_path):
    """The changes a correction made are kept under their own key: a user's own `corrected`
    column stays theirs, and the correction still applies."""
    header = "id,framework,model,hardware,gpus,gpus_per_node,dp_shard,seq_len,global_batch_size,micro_batch_size,corrected\n"
    (tmp_path / "mine.csv").write_text(header + "a1,torchtitan,llama3-8b,h100-sxm,8,8,8,8192,8,1,yes\n")
    (tmp_path / "mine.corrections.yaml").write_text(
        "corrections:\n  - rows: [a1]\n    column: hardware\n    was: h100-sxm\n    now: h200-sxm\n    evidence: log\n")
    (row,) = read_rows(tmp_path / "mine.csv")
    assert row["corrected"] == "yes" and row["hardware"] == "h200-sxm" and row[CORRECTED]
    (result,) = validate_rows([row])
    assert result.error is None and result.as_dict()["corrected"] == ["hardware: h100-sxm -> h200-sxm"]
