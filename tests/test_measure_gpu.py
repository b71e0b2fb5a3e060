"""benchmarks/measure_gpu.py, the script that measured data/measurements/ on an H100, kept working between GPU
leases: its CPU smoke mode runs the real core (world 1, gloo) on a two-layer model through the same path (plan from
`meshplan estimate -o`, the core under torchrun, `meshplan compare --append-csv`) and writes rows `meshplan
validate` reads; without a GPU the cuda mode refuses in one line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.estimator.validate import read_rows, validate_rows

ROOT = Path(__file__).resolve().parents[1]
TINY = """name: tiny-measure
layers: 2
hidden: 64
heads: 4
kv_heads: 2
ffn_hidden: 128
vocab: 256
tied_embeddings: true
mlp: swiglu
norm: rmsnorm
"""
DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import measure_gpu as g
g.MODELS = Path(sys.argv[2])
g.GRID = {"tiny-eager": ("tiny-measure", 32, 1, 2, "none", False, "none", "float32"),
          "tiny-bf16-full": ("tiny-measure", 32, 2, 2, "full", False, "none", "bfloat16"),
          "tiny-fsdp1": ("tiny-measure", 32, 1, 2, "none", False, "none", "float32", g.PROBE)}
sys.exit(g.main(sys.argv[3:]))
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "tiny-measure.yaml").write_text(TINY)
    return subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "benchmarks"), str(tmp_path), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cpu_smoke_writes_rows_validate_reads(tmp_path):
    out = tmp_path / "out"
    r = _run(tmp_path, "--out", str(out), "--work", str(tmp_path / "work"), "--steps", "3", "--device", "cpu",
             "--stack", "torchtitan-2026-03")
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    summary = json.loads((out / "summary.json").read_text())
    assert {k: v["status"] for k, v in summary.items()} == {"tiny-eager": "ok", "tiny-bf16-full": "ok",
                                                             "tiny-fsdp1": "ok"}
    # the probe (the current release's FSDP2 on one rank) is kept apart, its notes saying the stack it ran as; the
    # grid's runs ran as --stack said (0.2.2's rules: no FSDP on one GPU)
    (probe,) = csv.DictReader((out / "probes.csv").open())
    assert probe["id"] == "meshplan-tiny-fsdp1" and "ran as stack torchtitan;" in probe["notes"] + ";"
    run_config = json.loads((tmp_path / "work" / "runs" / "tiny-fsdp1" / "run_config.json").read_text())
    assert run_config["fsdp_one_rank"] is True and run_config["checkpoint_interval"] == 0
    eager = json.loads((tmp_path / "work" / "runs" / "tiny-eager" / "run_config.json").read_text())
    assert eager["fsdp_one_rank"] is False and "stack" not in run_config
    rows = list(csv.DictReader((out / "measured.csv").open()))
    assert [x["id"] for x in rows] == ["meshplan-tiny-eager", "meshplan-tiny-bf16-full"]
    assert rows[1]["precision"] == "bf16-pure" and rows[1]["ac"] == "full" and rows[1]["micro_batch_size"] == "2"
    assert all("ran as stack torchtitan-2026-03" in x["notes"] for x in rows)
    assert float(rows[0]["measured_tps_per_gpu"]) > 0
    # a CPU run's hardware is the CPU, which no hardware profile describes: validate reads the rows and says so
    results = validate_rows(read_rows(out / "measured.csv"))
    assert all(res.error.startswith(f"row {res.id}: ") for res in results)  # each error names its row
    errors = {res.error.split(": ", 1)[1] for res in results}
    assert len(errors) == 1 and errors.pop().startswith("unknown hardware profile 'cpu'; choose one of: a100")
    assert not (tmp_path / "work" / "runs" / "tiny-eager" / "checkpoints").exists()  # measures; saves nothing
    assert "===== tiny-eager rc 0 =====" in (out / "logs.txt").read_text()


def test_bad_names_and_no_gpu_fail_in_one_line(tmp_path):
    r = _run(tmp_path, "--out", str(tmp_path / "o"), "--only", "nope", "--device", "cpu")
    assert r.returncode == 2 and r.stderr.strip() == "measure_gpu: unknown grid names ['nope']; see --list"
    r = _run(tmp_path, "--out", str(tmp_path / "o"), "--stack", "torchtitan-1999", "--device", "cpu")
    assert r.returncode == 2 and r.stderr.startswith("measure_gpu: --stack: unknown stack") and "\n" not in \
        r.stderr.strip() and not (tmp_path / "o").exists()
    import torch

    if not torch.cuda.is_available():
        r = _run(tmp_path, "--out", str(tmp_path / "o"))
        assert r.returncode == 2 and "no CUDA GPU here" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "o").exists()  # nothing half-written


def test_an_oom_run_is_a_row_validate_judges(tmp_path):
    """A run that runs out of memory is appended as status oom, with the plan's configuration (a bfloat16-dtype plan
    as bf16-pure, as compare writes it), so validate's fit agreement judges it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from measure_gpu import oom_row

    from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model
    from meshplan.launcher.compare import append_measurement
    from meshplan.planner.plan_file import make_plan, save_plan

    m, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    cfg = TrainConfig(gpus=1, gpus_per_node=1, seq_len=8192, global_batch_size=1, ac="none", dtype="bfloat16")
    plan = save_plan(make_plan(m, "llama3-8b", hw, cfg, estimate(m, hw, cfg)), tmp_path / "plan.yaml")
    csv_path = append_measurement(tmp_path / "m.csv", oom_row("8b-oom", plan))
    row = next(csv.DictReader(csv_path.open()))
    assert row["status"] == "oom" and row["precision"] == "bf16-pure" and row["measured_tps_per_gpu"] == ""
    (res,) = validate_rows(read_rows(csv_path))
    assert res.error is None and res.status == "oom" and res.predicted_mem_gib > 80  # predicted not to fit either


def test_a_run_past_its_timeout_is_killed_and_logged(tmp_path):
    """measure_gpu / profile_step launch each run through run_one_rank: one that outlives its limit comes back as exit
    124 with what it printed, under its header in the log (a lease returns what was measured, not a hang)."""
    import io

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import measure_gpu

    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    log = io.StringIO()
    rc, text = measure_gpu.run_one_rank([str(script)], 20, log, "sleepy")  # room for a loaded machine to start it
    assert rc == 124 and "started" in text and text.rstrip().endswith("TIMEOUT after 20 s")
    assert log.getvalue().startswith("===== sleepy rc 124 =====\n")


def test_grad_accumulation_benchmark_runs_its_three_modes_and_refuses_cuda_without_a_gpu(tmp_path):
    """benchmarks/grad_accumulation_memory.py (what `compile_whole_model` was measured with) keeps running between
    leases: on CPU it runs eager, whole-model and per-block compiled accumulation and writes its JSON; asked for cuda
    on a machine without one it says so in a line."""
    script = ROOT / "benchmarks" / "grad_accumulation_memory.py"
    out = tmp_path / "g.json"
    r = subprocess.run([sys.executable, str(script), "--device", "cpu", "--out", str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0].strip() for line in r.stdout.splitlines()] == ["eager", "whole", "block"]
    assert [x["mode"] for x in json.loads(out.read_text())["results"]] == ["eager", "whole", "block"]
    bad = subprocess.run([sys.executable, str(script), "--device", "cpu", "--out", str(tmp_path / "no" / "g.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout.count("\n") == 1 and "does not exist" in bad.stdout and not bad.stderr
    import torch

    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "no CUDA GPU here" in r.stdout and r.stdout.count("\n") == 1


def test_a_measured_run_takes_the_launch_scripts_allocator_settings(tmp_path, monkeypatch):
    """A run measured here reserves what a launched one does: torchrun's rank sees the allocator settings of
    data/launch/env.yaml (expandable segments) that `meshplan launch` scripts export, unless the environment sets
    its own (which wins, as in the scripts)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import measure_gpu

    script = tmp_path / "show_env.py"
    script.write_text("import os\nprint('ALLOC', os.environ.get('PYTORCH_CUDA_ALLOC_CONF'))\n")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    with (tmp_path / "log.txt").open("w") as logs:
        rc, text = measure_gpu.run_one_rank([str(script)], 120, logs, "env")
        assert rc == 0 and "ALLOC expandable_segments:True" in text
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:native")
        rc, text = measure_gpu.run_one_rank([str(script)], 120, logs, "env-own")
        assert rc == 0 and "ALLOC backend:native" in text
