"""The user's path from a config.json to measured vs predicted, through the real commands:
`meshplan estimate -o` -> `meshplan launch --backend local --device cpu` (torchrun, gloo, 2 ranks)
-> `meshplan compare` and `--append-csv`, which `meshplan validate` reads back."""

import csv
import json
import re
import statistics
import warnings
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

    # the core times each step's phases; compare sets them beside the estimate's terms, furthest off first
    for r in rows:
        assert 0 < r["fwd_bwd_s"] and 0 < r["optimizer_s"] and 0 <= r["data_s"]
        assert r["data_s"] + r["fwd_bwd_s"] + r["optimizer_s"] <= r["step_time_s"] * 1.001
    terms = report["terms"]
    assert [t["unit"] for t in terms] == ["s", "s"]  # a CPU run measures no allocator: time terms only
    assert abs(terms[0]["share"]) >= abs(terms[1]["share"])
    fwd = next(t for t in terms if t["term"].startswith("forward"))
    assert fwd["measured"] == pytest.approx(statistics.median(r["fwd_bwd_s"] for r in steady), rel=1e-3)

    table = cli("compare", str(run))
    assert table.returncode == 0 and "predicted" in table.stdout and "measured" in table.stdout
    assert "furthest off: " in table.stdout

    csv_path = tmp_path / "measurements.csv"
    out = cli("compare", str(run), "--append-csv", str(csv_path), "--id", "tiny-cpu-1")
    assert out.returncode == 0, out.stderr
    with csv_path.open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["id"] == "tiny-cpu-1" and row["hardware"] == "cpu" and row["layers"] == "4"


def _tiny_plan(cli, path: Path, **kw: str) -> Path:
    args = ["estimate", "--model", str(TINY), "--gpus", "2", "--gpus-per-node", "2", "--seq-len", "64",
            "--global-batch-size", "8", "--micro-batch-size", "2", "-o", str(path)]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", v]
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    return path


def test_two_plans_from_one_directory_never_share_a_run_dir(cli, tmp_path):
    """Default run dirs are per plan layout; a run dir of another plan is refused in one line."""
    fsdp = _tiny_plan(cli, tmp_path / "fsdp.yaml")
    tp = _tiny_plan(cli, tmp_path / "tp.yaml", tp="2")
    dirs = []
    for plan in (fsdp, tp):
        out = cli("launch", str(plan), "--dry-run", "--json", "--device", "cpu", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        dirs.append(json.loads(out.stdout)["run_dir"])
    assert dirs[0] != dirs[1] and all(d.startswith(str(tmp_path / "runs")) for d in dirs)
    run = tmp_path / "shared"
    run.mkdir()
    (run / "plan.yaml").write_text(fsdp.read_text())
    out = cli("launch", str(tp), "--dry-run", "--device", "cpu", "--run-dir", str(run))
    assert out.returncode == 2 and "holds a run of another plan" in out.stderr and out.stderr.count("\n") == 1
    out = cli("launch", str(fsdp), "--dry-run", "--device", "cpu", "--run-dir", str(run))
    assert out.returncode == 0, out.stderr  # the same plan may resume its own run dir


@pytest.mark.slow
def test_sigterm_to_meshplan_launch_reaches_the_job(tmp_path):
    """`meshplan launch` passes SIGTERM on to torchrun and its workers (they checkpoint) and waits for them."""
    import signal
    import subprocess
    import sys
    import time

    plan = tmp_path / "p.yaml"
    subprocess.run([sys.executable, "-m", "meshplan", "estimate", "--model", str(TINY), "--gpus", "2",
                    "--gpus-per-node", "2", "--seq-len", "64", "--global-batch-size", "8", "-o", str(plan)],
                   check=True, capture_output=True, cwd=ROOT)
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshplan", "launch", str(plan), "--device", "cpu", "--steps", "500",
         "--run-dir", str(run)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=90)
    last = json.loads(metrics.read_text().splitlines()[-1])["step"]
    assert 2 <= last < 500, err[-3000:]
    assert (run / "checkpoints" / "latest").read_text() == f"step-{last:08d}", err[-3000:]
    assert f"checkpoint saved at step {last}" in out + err
    assert proc.returncode == 0 and "launch again to resume" in err, err[-3000:]  # requeue-able, not FAILED
    ps = subprocess.run(["pgrep", "-f", f"--run-dir {run}"], capture_output=True, text=True)
    assert ps.stdout.strip() == "", "the job outlived meshplan launch"


def test_local_launch_the_cpu_cannot_run_fails_in_one_line(cli, tmp_path):
    """Float8 tensorwise with TP 2 on CPU: the core's own machine check, once, before any rank starts."""
    plan = _tiny_plan(cli, tmp_path / "f8.yaml", tp="2", float8="tensorwise")
    out = cli("launch", str(plan), "--device", "cpu", "--steps", "2", "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "float8 tensorwise with tp > 1 all-gathers float8 tensors" in out.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_compare_names_the_term_furthest_off(cli, tmp_path):
    """A GPU run's metrics (written here by hand: max allocated and reserved, the step's phases) against its plan:
    the allocator reserved 30 GiB above 10 allocated where the estimate expected its fragmentation share, so that
    term leads the list and the command says so."""
    run = tmp_path / "run"
    run.mkdir()
    _tiny_plan(cli, run / "plan.yaml")
    est = json.loads(cli("estimate", "--plan", str(run / "plan.yaml"), "--json").stdout)
    step = est["throughput"]["step_time_s"]
    rec = {"loss": 5.0, "tokens_per_sec_per_gpu": 1.0, "step_time_s": step, "data_s": 0.0, "fwd_bwd_s": step * 0.9,
           "optimizer_s": step * 0.1, "peak_mem_gib": 40.0, "peak_active_gib": 10.0, "device": "cuda:NVIDIA H100"}
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": k, **rec}) + "\n" for k in range(1, 5)))
    out = cli("compare", str(run), "--json")
    assert out.returncode == 0, out.stderr
    terms = json.loads(out.stdout)["terms"]
    assert len(terms) == 4 and terms[0]["term"].startswith("allocator reserve")
    assert terms[0]["measured"] == 30.0 and terms[0]["unit"] == "GiB"
    table = cli("compare", str(run))
    assert "furthest off: allocator reserve above allocated (fragmentation)" in table.stdout


@pytest.mark.slow
def test_bf16_training_dtype_trains_in_bf16(cli, tmp_path):
    """A plan with training dtype bfloat16 (`estimate --dtype bfloat16 -o`), launched on 2 CPU ranks (gloo, FSDP):
    the core builds the model in bf16 and says so, the checkpoint holds bf16 weights and bf16 AdamW moments (no fp32
    master copy), and the loss falls."""
    import torch.distributed.checkpoint as dcp

    from meshplan.planner.plan_file import LRSchedule, load_plan, save_plan

    plan_path = _tiny_plan(cli, tmp_path / "bf16.yaml", dtype="bfloat16")
    plan = load_plan(plan_path)
    assert plan.training.dtype == "bfloat16"
    fast = plan.training.model_copy(update={  # a few steps at a higher LR, so the loss moves
        "optimizer": plan.training.optimizer.model_copy(update={"lr": 3e-3}),
        "lr_schedule": LRSchedule(warmup_steps=1, decay="constant")})
    save_plan(plan.model_copy(update={"training": fast}), plan_path)
    for attempt in (1, 2):  # a worker killed by a signal (a native crash in torch / gloo): once more, as run_cases
        run = tmp_path / f"run{attempt}"
        out = cli("launch", str(plan_path), "--backend", "local", "--device", "cpu", "--steps", "10", "--run-dir",
                  str(run), timeout=300)
        if out.returncode == 0 or attempt == 2 or not re.search(r"exitcode\s*:\s*-\d+", out.stderr):
            break
        warnings.warn(f"a torchrun worker died by a signal; launching again:\n{out.stderr[-4000:]}", stacklevel=1)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert "training dtype bfloat16: trainable parameters in bfloat16" in out.stdout
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 10 and statistics.mean(losses[-3:]) < statistics.mean(losses[:3]) - 0.1, losses
    meta = dcp.FileSystemReader(str(run / "checkpoints" / "step-00000010")).read_metadata().state_dict_metadata
    dtypes = {k: str(v.properties.dtype) for k, v in meta.items() if hasattr(v, "properties")}
    weights = {d for k, d in dtypes.items() if k.startswith("model.")}
    moments = {d for k, d in dtypes.items() if k.endswith((".exp_avg", ".exp_avg_sq"))}
    assert weights == moments == {"torch.bfloat16"}, dtypes
