"""Checkpoint / resume through the real entry point (`torchrun ... -m meshplan.launcher.core.train --config`).

Faults are real: MESHPLAN_FAULT makes a rank SIGKILL itself (or send itself SIGUSR1/SIGTERM) at an exact step,
so the tests are deterministic while torchrun, DCP and the signal handlers do the actual work.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from launchtools import ROOT, child_env, config, losses_by_step, read_metrics, train

pytestmark = pytest.mark.slow

STEPS = 6


def resumable(run_dir, **overrides):
    return config(run_dir, **{"steps": STEPS, "checkpoint_interval": 2, "resume": True, **overrides})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 6-step FSDP=2 run."""
    tmp = tmp_path_factory.mktemp("ref")
    proc = train(2, resumable(tmp / "run", dp_shard=2), tmp / "run.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = losses_by_step(tmp / "run")
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def assert_same_losses(got: dict[int, float], want: dict[int, float], rtol: float) -> None:
    assert sorted(got) == sorted(want)
    for step, loss in want.items():
        assert got[step] == pytest.approx(loss, rel=rtol), (step, got, want)


def test_metrics_and_progress_lines(reference, tmp_path_factory):
    recs = read_metrics(next(iter(tmp_path_factory.getbasetemp().glob("ref*"))) / "run")
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    for rec in recs:
        assert rec["step_time_s"] > 0 and rec["tokens_per_sec_per_gpu"] > 0 and rec["peak_mem_gib"] > 0
        assert "mfu" in rec  # null on CPU: no peak FLOPS to divide by


def test_stop_then_resume_matches_uninterrupted(reference, tmp_path):
    cfg = resumable(tmp_path / "run", dp_shard=2)
    first = train(2, {**cfg, "stop_at_step": 3}, tmp_path / "a.json")
    assert first.returncode == 0, first.stderr[-4000:]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step-00000003"
    assert sorted(losses_by_step(tmp_path / "run")) == [1, 2, 3]
    second = train(2, cfg, tmp_path / "b.json")
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resumed from" in second.stdout and "at step 3" in second.stdout
    assert_same_losses(losses_by_step(tmp_path / "run"), reference, rtol=1e-6)


def test_sigkilled_worker_is_restarted_by_torchrun_and_finishes(reference, tmp_path):
    cfg = resumable(tmp_path / "run", dp_shard=2)
    proc = train(
        2, cfg, tmp_path / "run.json", max_restarts=1, env=child_env(MESHPLAN_FAULT="kill:rank=1:step=5")
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "step-00000004 at step 4" in proc.stdout  # the restarted group resumed from the last checkpoint
    steps = [r["step"] for r in read_metrics(tmp_path / "run")]
    assert steps == [1, 2, 3, 4, 5, 6]  # step 5 ran twice (before the kill, after the restart), is logged once
    assert_same_losses(losses_by_step(tmp_path / "run"), reference, rtol=1e-6)


def test_kill_during_save_keeps_previous_checkpoint(reference, tmp_path):
    """PP=2 here (two model parts' DCP shards); killed after writing step 4's shards, before the commit."""
    cfg = resumable(tmp_path / "run", pp=2)
    ckpts = tmp_path / "run" / "checkpoints"
    proc = train(2, cfg, tmp_path / "a.json", env=child_env(MESHPLAN_FAULT="kill_in_save:rank=0:step=4"))
    assert proc.returncode != 0
    assert (ckpts / "latest").read_text() == "step-00000002"
    assert (ckpts / "step-00000004.tmp").is_dir() and not (ckpts / "step-00000004").exists()
    again = train(2, cfg, tmp_path / "b.json")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "step-00000002 at step 2" in again.stdout
    assert not (ckpts / "step-00000004.tmp").exists()
    assert_same_losses(losses_by_step(tmp_path / "run"), reference, rtol=1e-4)


@pytest.mark.parametrize("sig, signum", [("USR1", 10), ("TERM", 15)])
def test_signal_saves_checkpoint_then_exits_and_resumes(reference, tmp_path, sig, signum):
    """Slurm-style preemption: handled after the current step, all ranks save, exit 0. TP=2 here."""
    cfg = resumable(tmp_path / "run", tp=2, checkpoint_interval=0)
    proc = train(2, cfg, tmp_path / "a.json", env=child_env(MESHPLAN_FAULT=f"signal:rank=0:step=3:sig={sig}"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"signal {signum}: checkpoint saved at step 3" in proc.stdout
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step-00000003"
    again = train(2, cfg, tmp_path / "b.json")
    assert again.returncode == 0, again.stderr[-4000:]
    assert_same_losses(losses_by_step(tmp_path / "run"), reference, rtol=1e-4)


def test_sigterm_to_torchrun_checkpoints_all_ranks_before_exit(tmp_path):
    """The real preemption path: SIGTERM to the torchrun agent, which forwards it to the workers."""
    run_dir = tmp_path / "run"
    cfg_path = tmp_path / "run.json"
    cfg_path.write_text(json.dumps(resumable(run_dir, dp_shard=2, steps=400, checkpoint_interval=0)))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "meshplan.launcher.core.train",
        "--config",
        str(cfg_path),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert 2 <= steps[-1] < 400, err[-3000:]
    assert f"signal 15: checkpoint saved at step {steps[-1]}" in out, err[-3000:]
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step-{steps[-1]:08d}"
