"""`meshplan validate` on bench_cluster's own global summary (estimator/sweep_formats.py): the sweep's rows are
read in its words (llama-* model names, run names, -1 where nothing was measured, completed / oom) and predicted as
the same runs written in the ground-truth schema are."""

from __future__ import annotations

import csv
import json

from cli_runner import run_cli

from meshplan.estimator.sweep_formats import bench_cluster_defaults, is_bench_cluster
from meshplan.estimator.validate import read_rows, validate_rows

# bench_cluster report.py's create_global_summary columns, in its order (memory is set but not in its frame's list)
HEADER = ["model", "run_name", "status", "nnodes", "dp", "tp", "pp", "batch_accumulation_per_replica",
          "micro_batch_size", "tok/s/gpu", "mfu", "forward", "backward"]


def _summary(path, rows):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)
    return path


def _ground_truth(path, **cells):
    d = bench_cluster_defaults()
    m = d["models"]["llama-1B"]
    row = {"id": "gt", "framework": "nanotron", "model": "llama-1B", "layers": m["layers"], "hidden": m["hidden"],
           "heads": m["heads"], "kv_heads": m["heads"], "ffn_hidden": m["ffn_hidden"], "vocab": d["vocab"],
           "tied_embeddings": "true", "mlp": "swiglu", "seq_len": d["seq_len"], "hardware": d["hardware"],
           "gpus_per_node": 8, "precision": "bf16", "compile": "false", "cp": 1, "notes": "ZeRO-1", **cells}
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    return path


def test_header_is_recognised_only_without_the_schema():
    assert is_bench_cluster(HEADER)
    assert not is_bench_cluster(["id", "model", "gpus", "hardware", "seq_len"])


def test_summary_rows_predict_as_the_same_runs_in_the_schema(tmp_path):
    summary = _summary(tmp_path / "8_GPUS_global_summary.csv", [
        ["llama-1B", "dp-8_tp-1_pp-1_mbz-2_bapr-62", "completed", 1, 8, 1, 1, 62, 2, 41000.5, 40.1, "", ""],
        ["llama-1B", "dp-2_tp-2_pp-2_mbz-1_bapr-1_recompute_layer", "oom", 1, 2, 2, 2, 1, 1, -1, -1, "", ""],
    ])
    rows = read_rows(summary)
    assert [r["id"] for r in rows] == ["llama-1B/dp-8_tp-1_pp-1_mbz-2_bapr-62",
                                       "llama-1B/dp-2_tp-2_pp-2_mbz-1_bapr-1_recompute_layer"]
    assert rows[0]["global_batch_size"] == "992" and rows[0]["gpus"] == "8" and rows[0]["ac"] == "none"
    assert rows[1]["ac"] == "full" and rows[1]["pp_schedule"] == "1f1b" and rows[1]["measured_tps_per_gpu"] == ""
    res = validate_rows(rows)
    assert [r.stack for r in res] == ["nanotron-zero1", "nanotron-zero1"]
    assert res[0].measured_tps_per_gpu == 41000.5 and res[0].status == "ok" and res[1].status == "oom"
    # the same two runs written in the ground-truth schema predict the same numbers
    gt0 = validate_rows(read_rows(_ground_truth(tmp_path / "a.csv", gpus=8, dp_replicate=8, tp=1, pp=1,
                                                global_batch_size=992, micro_batch_size=2, ac="none")))[0]
    gt1 = validate_rows(read_rows(_ground_truth(tmp_path / "b.csv", gpus=8, dp_replicate=2, tp=2, pp=2,
                                                pp_schedule="1F1B", global_batch_size=2, micro_batch_size=1,
                                                ac="full")))[0]
    assert res[0].predicted_tps_per_gpu == gt0.predicted_tps_per_gpu
    assert res[1].predicted_tps_per_gpu == gt1.predicted_tps_per_gpu
    assert res[1].predicted_mem_gib == gt1.predicted_mem_gib


def test_cli_reads_the_summary_and_judges_fit(tmp_path):
    summary = _summary(tmp_path / "8_GPUS_global_summary.csv", [
        ["llama-1B", "dp-8_tp-1_pp-1_mbz-2_bapr-62", "completed", 1, 8, 1, 1, 62, 2, 41000, 40, "", ""],
        ["llama-70B", "dp-1_tp-8_pp-1_mbz-2_bapr-62", "oom", 1, 1, 8, 1, 62, 2, -1, -1, "", ""],
        ["llama-1B", "dp-1_tp-8_pp-1_mbz-2_bapr-62", "timeout", 1, 1, 8, 1, 62, 2, -1, -1, "", ""],
    ])
    out = run_cli("validate", str(summary), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [r["error"] for r in report["rows"]] == [None, None, None]
    assert [r["predicted_fits"] for r in report["rows"]][:2] == [True, False]
    fit = report["summary"]["all"]["fit_agreement"]
    assert fit["rows"] == 2 and fit["share"] == 1.0  # completed + oom judged, the timeout not


def test_unknown_model_and_bad_degree_one_line(tmp_path):
    bad = _summary(tmp_path / "s.csv", [["llama-9B", "x", "completed", 1, 8, 1, 1, 1, 1, 1, 1, "", ""]])
    out = run_cli("validate", str(bad))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "llama-9B" in out.stderr and "llama-1B" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    bad = _summary(tmp_path / "t.csv", [["llama-1B", "x", "completed", 1, "eight", 1, 1, 1, 1, 1, 1, "", ""]])
    out = run_cli("validate", str(bad))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "line 2: dp 'eight'" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    bad = _summary(tmp_path / "u.csv", [["llama-1B", "x", "completed", 1, 1, 1, "inf", 1, 1, 1, 1, "", ""]])
    out = run_cli("validate", str(bad))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "line 2: pp 'inf'" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_the_other_clusters_summary_is_refused_in_one_line(tmp_path):
    """bench_cluster's summary writes nnodes = GPUs / GPUs a node: 16 GPUs on 4 nodes is its swiss-ai cluster (4 GH200
    a node), not Hugging Face's H100 nodes of 8 the defaults describe; 16 GPUs on 2 nodes is read."""
    ok = _summary(tmp_path / "hf.csv", [["llama-1B", "dp-16_tp-1_pp-1_mbz-2_bapr-32", "completed", 2, 16, 1, 1, 32, 2,
                                         40000, 40, "", ""]])
    assert read_rows(ok)[0]["gpus"] == "16"
    bad = _summary(tmp_path / "swiss.csv", [["llama-1B", "dp-16_tp-1_pp-1_mbz-2_bapr-32", "completed", 4, 16, 1, 1, 32,
                                             2, 40000, 40, "", ""]])
    out = run_cli("validate", str(bad))
    assert out.returncode != 0 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "swiss-ai" in out.stderr and "16 GPUs on 4 nodes" in out.stderr
