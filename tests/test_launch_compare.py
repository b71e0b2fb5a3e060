"""`meshplan launch --dry-run` and `meshplan compare` on a run directory (no training run needed here;
tests/launcher runs the real core)."""

import csv
import json
import sys
from pathlib import Path

import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.validate import read_rows, validate_rows
from meshplan.launcher.compare import GROUND_TRUTH_COLUMNS
from meshplan.planner.plan_file import make_plan, save_plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def plan_path(tmp_path):
    m, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    cfg = TrainConfig(gpus=16, seq_len=8192, global_batch_size=32, compile=True)
    return save_plan(make_plan(m, "llama3-8b", hw, cfg, estimate(m, hw, cfg)), tmp_path / "plan.yaml")


def test_local_dry_run_prints_torchrun_and_writes_nothing(cli, plan_path, tmp_path):
    run = tmp_path / "run dir"
    out = cli("launch", str(plan_path), "--backend", "local", "--device", "cpu", "--dry-run", "--run-dir", str(run))
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "-m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=16" in line
    assert "-m meshplan.launcher.run_plan --plan" in line and "'" in line  # the path with a space is quoted
    assert not run.exists()


@pytest.mark.parametrize("backend,first", [("slurm", "sbatch"), ("mpirun", "bash"), ("torchrun", "bash")])
def test_script_backends_dry_run(cli, plan_path, tmp_path, backend, first):
    out = cli("launch", str(plan_path), "--backend", backend, "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("# resolved run: ") and "device cuda (nccl)" in lines[0]
    assert lines[2].startswith(first) and "#!/usr/bin/env bash" in out.stdout
    assert "meshplan.launcher.run_plan --plan" in out.stdout


def test_launch_writes_run_dir_and_fails_clearly_without_sbatch(cli, plan_path, tmp_path):
    run = tmp_path / "r"
    bare = tmp_path / "bin"  # a PATH with python but no Slurm client, as on a login node without it
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    out = cli("launch", str(plan_path), "--backend", "slurm", "--run-dir", str(run), "--steps", "7",
              env={"PATH": str(bare)})
    assert out.returncode == 2 and "sbatch is not on PATH" in out.stderr and out.stderr.count("\n") <= 3
    assert (run / "launch.sbatch").exists() and (run / "launch.sbatch").stat().st_mode & 0o111
    from meshplan.planner.plan_file import load_plan

    assert load_plan(run / "plan.yaml").training.steps == 7


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--backend", "k8s"], "unknown backend"),
        (["--device", "tpu"], "--device must be cpu or cuda"),
        (["--backend", "local", "--nproc-per-node", "4"], "world size is 16"),
        (["--engine", "deepspeed"], "unknown engine 'deepspeed'"),
        (["--engine", "torchtitan", "--device", "cpu"], "--engine torchtitan trains on CUDA GPUs only"),
        (["--engine", "torchtitan", "--backend", "mpirun"], "--engine torchtitan runs under torchrun"),
    ],
)
def test_launch_bad_input(cli, plan_path, args, needle):
    out = cli("launch", str(plan_path), "--dry-run", *args)
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_launch_cuda_on_cpu_machine_fails_early(cli, plan_path, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = cli("launch", str(plan_path), "--backend", "local", "--device", "cuda", "--run-dir", str(tmp_path / "r"))
    assert out.returncode == 2 and "no CUDA GPU is visible" in out.stderr


def _fake_run(run_dir, plan_path, steps=6, phases=False):
    run_dir.mkdir()
    (run_dir / "plan.yaml").write_text(plan_path.read_text())
    with (run_dir / "metrics.jsonl").open("w") as fh:
        for s in range(1, steps + 1):
            tps = 100.0 if s <= 2 else 1000.0 + s
            timed = {"data_s": 0.001, "fwd_bwd_s": 0.1 + s / 1000, "optimizer_s": 0.02} if phases else {}
            fh.write(json.dumps({"step": s, "loss": 5.0 - 0.1 * s, "tokens_per_sec_per_gpu": tps,
                                 "step_time_s": 16 * 8192 / tps, "peak_mem_gib": 40.0 + s, "mfu": 0.3,
                                 "peak_active_gib": 36.0 + s, "device": "cuda", **timed}) + "\n")


def test_compare_reports_median_after_warmup_and_errors(cli, plan_path, tmp_path):
    run = tmp_path / "run1"
    _fake_run(run, plan_path)
    out = cli("compare", str(run), "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["measured"]["tokens_per_sec_per_gpu"] == pytest.approx(1004.5)  # median of steps 3..6
    assert d["measured"]["peak_gib"] == 46.0
    pred = d["predicted"]["tokens_per_sec_per_gpu"]
    assert d["error"]["tokens_per_sec_per_gpu"] == pytest.approx(pred / 1004.5 - 1, abs=1e-4)
    table = cli("compare", str(run))
    assert table.returncode == 0 and "predicted" in table.stdout and "measured" in table.stdout


def test_compare_appends_ground_truth_rows_that_validate_reads(cli, plan_path, tmp_path):
    run = tmp_path / "run2"
    _fake_run(run, plan_path)
    csv_path = tmp_path / "measurements.csv"
    for rid in ("a1", "a2"):
        out = cli("compare", str(run), "--append-csv", str(csv_path), "--id", rid)
        assert out.returncode == 0, out.stderr
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == ["a1", "a2"] and tuple(rows[0]) == GROUND_TRUTH_COLUMNS
    assert rows[0]["hardware"] == "h100-sxm" and rows[0]["framework"] == "meshplan"
    # the allocator's reserve above the allocated peak (what fragmentation_one_stream is fitted from) stays readable
    assert "memory = max reserved (max allocated 42.00 GiB)" in rows[0]["notes"]
    res = validate_rows(read_rows(csv_path))
    # meshplan's own core has no stack profile of its own: it follows its plan's torchtitan stack (FSDP2 / TP /
    # pipelining semantics, FSDP2 on every layout or not), the row's notes say which, validate predicts it with that
    # stack and says so in `stack`
    assert "; ran as stack torchtitan" in rows[0]["notes"]
    assert [r.error for r in res] == [None, None] and res[0].stack == "torchtitan"
    assert res[0].predicted_tps_per_gpu > 0 and res[0].predicted_mem_gib > 0
    old_plan = tmp_path / "old.yaml"
    old_plan.write_text(plan_path.read_text().replace("\nstack: torchtitan\n", "\nstack: torchtitan-2026-03\n"))
    assert "stack: torchtitan-2026-03" in old_plan.read_text()
    _fake_run(tmp_path / "run-old", old_plan)
    assert cli("compare", str(tmp_path / "run-old"), "--append-csv", str(csv_path), "--id", "a3").returncode == 0
    (old,) = [r for r in validate_rows(read_rows(csv_path)) if r.id == "a3"]
    assert old.error is None and old.stack == "torchtitan-2026-03"


def test_pure_bf16_run_reads_back_as_pure_bf16(cli, tmp_path):
    """A run in training dtype bfloat16 (no fp32 master) is appended as precision bf16-pure, so validate predicts
    it with bf16 state: an 8B run on one H100 (measured 77.4 GiB reserved) must not read back as fp32 (150 GiB)."""
    m, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    cfg = TrainConfig(gpus=1, gpus_per_node=1, seq_len=4096, global_batch_size=1, ac="full", dtype="bfloat16")
    plan = save_plan(make_plan(m, "llama3-8b", hw, cfg, estimate(m, hw, cfg)), tmp_path / "plan.yaml")
    run = tmp_path / "run-bf16"
    _fake_run(run, plan)
    csv_path = tmp_path / "m.csv"
    assert cli("compare", str(run), "--append-csv", str(csv_path), "--id", "b1").returncode == 0
    row = next(csv.DictReader(csv_path.open()))
    assert row["precision"] == "bf16-pure" and "bfloat16" in row["notes"]
    (res,) = validate_rows(read_rows(csv_path))
    assert res.error is None and res.predicted_mem_gib == pytest.approx(estimate(m, hw, cfg)["memory"]["peak_gib"])
    assert res.predicted_mem_gib < 80


def test_compare_bad_run_dirs(cli, plan_path, tmp_path):
    out = cli("compare", str(tmp_path / "nope"))
    assert out.returncode == 2 and "not found" in out.stderr
    run = tmp_path / "run3"
    run.mkdir()
    (run / "plan.yaml").write_text(plan_path.read_text())
    out = cli("compare", str(run))
    assert out.returncode == 2 and "metrics.jsonl is missing" in out.stderr
    (run / "metrics.jsonl").write_text("{bad\n")
    out = cli("compare", str(run))
    assert out.returncode == 2 and "not a JSON object" in out.stderr
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    _fake_run(tmp_path / "run4", plan_path)
    out = cli("compare", str(tmp_path / "run4"), "--append-csv", str(other))
    assert out.returncode == 2 and "ground-truth schema" in out.stderr
    assert other.read_text() == "a,b\n1,2\n"


def test_appended_row_notes_keep_the_measured_phases(cli, plan_path, tmp_path):
    """The forward + backward and optimizer phases a run timed go into the row's notes, so a measured CSV keeps
    what `compare` set beside the estimate's terms (the optimizer phase is how step_overhead_s was measured)."""
    run = tmp_path / "run3"
    _fake_run(run, plan_path, phases=True)
    csv_path = tmp_path / "m.csv"
    assert cli("compare", str(run), "--append-csv", str(csv_path)).returncode == 0
    (row,) = csv.DictReader(csv_path.open())
    assert "forward + backward 104.5 ms, optimizer phase (clip, AdamW, per-step) 20.0 ms (medians)" in row["notes"]


def test_a_mixture_of_experts_run_with_latent_attention_reads_back_as_it_ran(tmp_path):
    """A measured MoE run whose model is no preset (DeepSeek-V3 16B cut to 5 blocks, as benchmarks/measure_gpu.py
    runs it) appends its experts and its multi-head latent attention as columns, and `meshplan validate` predicts
    the row exactly as the plan's own estimate: nothing of the model is lost between the run and the check."""
    from meshplan.launcher.compare import append_measurement, config_row

    model_path = str(ROOT / "data" / "measurements" / "deepseek-v3-16b-5l.yaml")
    m, hw = load_model(model_path), load_hardware("h100-sxm")
    cfg = TrainConfig(gpus=1, gpus_per_node=1, seq_len=4096, global_batch_size=2, micro_batch_size=2,
                      ac="selective")
    est = estimate(m, hw, cfg.model_copy(update={"attention_kernel": "sdpa"}))  # the core's attention
    plan = make_plan(m, model_path, hw, cfg, estimate(m, hw, cfg))
    row = {"id": "m1", "source": "test", **config_row(plan, "h100-sxm"), "measured_tps_per_gpu": 40000,
           "measured_mem_gib": 48, "status": "ok"}
    assert (row["kv_lora_rank"], row["qk_rope_head_dim"], row["experts"], row["first_dense_layers"]) == (512, 64, 64, 1)
    [res] = validate_rows(read_rows(append_measurement(tmp_path / "m.csv", row)))
    assert res.error is None
    assert res.predicted_tps_per_gpu == pytest.approx(est["throughput"]["tokens_per_sec_per_gpu"], rel=1e-9)
    assert res.predicted_mem_gib == pytest.approx(est["memory"]["peak_gib"], rel=1e-9)
    plain = {k: v for k, v in row.items() if k not in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                                                        "qk_rope_head_dim", "v_head_dim")}
    [gqa] = validate_rows(read_rows(append_measurement(tmp_path / "plain.csv", plain)))
    assert gqa.predicted_mem_gib != pytest.approx(res.predicted_mem_gib, rel=1e-3)  # without them: another model


def test_a_run_whose_heads_are_not_hidden_over_heads_appends_its_head_dim(tmp_path):
    """The schema's columns cannot say Qwen3's 128-wide heads over a narrower stream: the row carries `head_dim`
    after the schema's columns. A file without that column gains it (empty for the rows before it), a file with it
    takes rows that do not need it, and a file with another header is still refused."""
    from meshplan.launcher.compare import append_measurement, config_row

    def row(model: str, rid: str) -> dict:
        m, hw = load_model(model), load_hardware("h100-sxm")
        cfg = TrainConfig(gpus=8, seq_len=4096, global_batch_size=8)
        plan = make_plan(m, model, hw, cfg, estimate(m, hw, cfg))
        return {"id": rid, "source": "test", **config_row(plan, "h100-sxm"), "measured_tps_per_gpu": 1000,
                "measured_mem_gib": 40, "status": "ok"}

    llama, qwen = row("llama3-8b", "l1"), row("qwen3-30b-a3b", "q1")
    assert "head_dim" not in llama and qwen["head_dim"] == 128
    path = append_measurement(tmp_path / "m.csv", llama)
    append_measurement(path, qwen)  # the file gains the column
    append_measurement(path, {**llama, "id": "l2"})
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    moe = ("ep", "experts", "top_k", "expert_ffn_hidden", "shared_ffn_hidden", "first_dense_layers")
    assert tuple(rows[0]) == GROUND_TRUTH_COLUMNS + ("head_dim", "qk_norm") + moe  # Qwen3 30B-A3B is a MoE too
    assert [(r["id"], r["head_dim"], r["qk_norm"], r["experts"]) for r in rows] == [
        ("l1", "", "", ""), ("q1", "128", "true", "128"), ("l2", "", "", "")]
    assert [r.error for r in validate_rows(read_rows(path))] == [None] * 3
    other = tmp_path / "other.csv"
    other.write_text("id,model,head_dim\n")
    with pytest.raises(MeshplanError, match="not in the ground-truth schema"):
        append_measurement(other, qwen)
    assert other.read_text() == "id,model,head_dim\n"  # refused whole: nothing written
