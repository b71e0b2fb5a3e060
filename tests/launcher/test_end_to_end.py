"""The user's path from a config.json to measured vs predicted, through the real commands:
`meshplan estimate -o` -> `meshplan launch --backend local --device cpu` (torchrun, gloo, 2 ranks)
-> `meshplan compare` and `--append-csv`, which `meshplan validate` reads back."""

import csv
import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny-llama" / "config.json"


@pytest.mark.slow
def test_estimate_launch_compare(cli, tmp_path):
    plan = tmp_path / "tiny plan.yaml"
    out = cli("estimate", "--model", str(TINY), "--gpus", "2", "--gpus-per-node", "2", "--seq-len", "64",
              "--global-batch-size", "8", "--micro-batch-size", "2", "-o", str(plan))
    assert out.returncode == 0, out.stderr
    assert plan.is_file()

    run = tmp_path / "run 1"
    out = cli("launch", str(plan), "--backend", "local", "--device", "cpu", "--steps", "4", "--run-dir", str(run),
              timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["device"] == "cpu"
        assert r["tokens_per_sec_per_gpu"] > 0 and r["step_time_s"] > 0 and r["peak_mem_gib"] > 0
        assert 4.0 < r["loss"] < 7.0  # ln(256) = 5.55 for the byte vocabulary at init

    out = cli("compare", str(run), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["steps"] == 4 and report["device"] == "cpu"
    measured = report["measured"]
    steady = rows[2:]  # compare skips two warm-up steps
    assert measured["tokens_per_sec_per_gpu"] == pytest.approx(
        statistics.median(r["tokens_per_sec_per_gpu"] for r in steady))
    assert measured["peak_gib"] == pytest.approx(max(r["peak_mem_gib"] for r in rows))
    assert report["predicted"]["tokens_per_sec_per_gpu"] > 0

    table = cli("compare", str(run))
    assert table.returncode == 0 and "predicted" in table.stdout and "measured" in table.stdout

    csv_path = tmp_path / "measurements.csv"
    out = cli("compare", str(run), "--append-csv", str(csv_path), "--id", "tiny-cpu-1")
    assert out.returncode == 0, out.stderr
    with csv_path.open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["id"] == "tiny-cpu-1" and row["hardware"] == "cpu" and row["layers"] == "4"
