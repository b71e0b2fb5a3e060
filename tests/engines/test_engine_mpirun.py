"""Open MPI for real: `meshplan launch --backend mpirun --device cpu` runs the rendered script, whose mpirun
starts 2 ranks of the training core (gloo) with the absolute interpreter; a SIGTERM to meshplan reaches the ranks
as SIGUSR1 (forwarded by mpirun), they checkpoint, and the launch ends with status 0; the next launch resumes."""

from __future__ import annotations

import json
import signal

import pytest
from enginetools import meshplan, meshplan_argv, metric_steps, root_env, wait_for

pytestmark = pytest.mark.slow


def args(plan, run_dir, steps):
    return ["launch", str(plan), "--backend", "mpirun", "--device", "cpu", "--run-dir", str(run_dir),
            "--steps", str(steps)]


def test_mpirun_trains_two_ranks(tiny_plans, tmp_path, mpirun):
    run_dir = tmp_path / "run"
    out = meshplan(*args(tiny_plans["1x2"], run_dir, 6), env=root_env(), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert metric_steps(run_dir) == [1, 2, 3, 4, 5, 6], out.stdout + out.stderr
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["device"] == "cpu" and cfg["dp_replicate"] * cfg["dp_shard"] == 2  # the core checked WORLD_SIZE 2
    assert "-np 2 -npernode 2" in (run_dir / "launch.sh").read_text()


def test_mpirun_stop_checkpoints_and_resumes(tiny_plans, tmp_path, mpirun, procs):
    run_dir = tmp_path / "run"
    steps = 40  # 0.2-0.3 s each here: the stop (sent once 5 are logged) lands at step 6-8, the rest resume
    log = tmp_path / "launch.log"
    p = procs.start(meshplan_argv(*args(tiny_plans["1x2"], run_dir, steps)), log, env=root_env())
    wait_for(lambda: len(metric_steps(run_dir)) >= 5, 180, "5 trained steps")
    p.send_signal(signal.SIGTERM)  # meshplan -> the script (SIGTERM) -> mpirun (SIGUSR1) -> the ranks
    assert p.wait(timeout=180) == 0, log.read_text()
    text = log.read_text()
    saved = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert f"with checkpoint {saved} complete (mpirun exited 0)" in text, text
    stopped_at = int(saved.removeprefix("step-"))
    assert stopped_at < steps and metric_steps(run_dir)[-1] == stopped_at
    out = meshplan(*args(tiny_plans["1x2"], run_dir, steps), env=root_env(), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"resumed from {run_dir.resolve()}/checkpoints/{saved} at step {stopped_at}" in out.stdout + out.stderr
    assert metric_steps(run_dir) == list(range(1, steps + 1))
